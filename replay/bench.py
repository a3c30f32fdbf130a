"""The benchmark: every policy, three load levels, two cluster sizes, same trace and seed.

Each cell replays the same arrivals (same trace window, rate scale and seed)
with the prefix cache on, under one policy. ``learned_cost_aware`` learns
online inside its own replay (analytic at first, LightGBM retrained every
:data:`ONLINE_RETRAIN_S` replay seconds), so no cell depends on a model
trained on the trace it is measured on; the ``llmd_predicted_latency`` anchor
refits its own P90 model on the same schedule and rows. Load levels are rate scales at
which ``least_loaded`` runs the cluster at about 60 %, 80 % and 95 %
utilisation (the share of time a worker has a request waiting for its first
token): constants measured on the bundled conversation trace on A100s serving
Llama-3-8B (:data:`LOAD_LEVELS`), and for every other trace or hardware
(:class:`BenchHardware`) found per (trace, cluster size) by bisection (:func:`calibrate_load_levels`, within
:data:`UTILISATION_TOLERANCE`); each cell reports the utilisation it actually
measured. Cells run in parallel processes (``jobs``); results do not depend
on ``jobs``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import lru_cache, partial

import pandas as pd

from kvcost.core.hardware import GPUS
from kvcost.data.traces import Trace, load_trace
from kvcost.replay.config import ClusterConfig
from kvcost.replay.experiment import replay
from kvcost.replay.metrics import summarise
from kvcost.replay.online import OnlineSettings
from kvcost.routing.policies import ROUTER_POLICIES
from kvcost.routing.router import RouterSettings

_log = logging.getLogger(__name__)

#: The production routers kvcost is measured against (docs/architecture.md §7), in report order.
BASELINES: tuple[str, ...] = (
    "sglang_cache_aware",
    "dynamo_kv",
    "llmd_default",
    "aibrix_prefix_cache",
    "preble_e2",
    "mooncake_conductor",
)
#: The 2026 anchors (kvcost issue 13, §2), baselines like the production routers above:
#: ``llmd_predicted_latency`` learns online like ``learned_cost_aware`` (its ``learned`` flag).
ANCHORS: tuple[str, ...] = ("lmetric", "dualmap", "llmd_predicted_latency")
#: Every policy kvcost is measured against: the "best baseline" of a cell is the best of these.
BASELINE_POLICIES: tuple[str, ...] = BASELINES + ANCHORS
#: kvcost's policies; ``learned_cost_aware`` joins when registered.
KVCOST_POLICIES: tuple[str, ...] = ("cost_aware", "learned_cost_aware")
#: Reference points.
REFERENCE_POLICIES: tuple[str, ...] = ("round_robin", "least_loaded", "oracle")

#: Rate scales giving ~60/80/95 % utilisation on the conversation trace with ``least_loaded``
#: (measured with 4 × and 8 × A100, Llama-3-8B, seed 0, full trace). Other sizes scale the
#: 4-worker values by workers / 4 (an approximation: the report shows the measured utilisation).
LOAD_LEVELS: dict[int, dict[str, float]] = {
    4: {"60%": 0.48, "80%": 0.565, "95%": 0.595},
    8: {"60%": 0.98, "80%": 1.15, "95%": 1.19},
}
#: Load label → target utilisation of ``least_loaded`` (the calibration policy).
TARGET_UTILISATION: dict[str, float] = {"60%": 0.60, "80%": 0.80, "95%": 0.95}
#: Calibration accepts a rate scale whose measured utilisation is within this of the target (±3 points).
UTILISATION_TOLERANCE = 0.03
#: The policy whose measured utilisation defines the load levels.
CALIBRATION_POLICY = "least_loaded"
#: Traces whose load levels are the constants of :data:`LOAD_LEVELS` (measured on the whole trace).
CALIBRATED_TRACES: tuple[str, ...] = ("mooncake-conversation",)
#: Doubling the rate scale must raise the utilisation by more than this, else calibration stops (a plateau).
PLATEAU_POINTS = 0.005
#: At most this many replays per (load level, cluster size) while calibrating.
MAX_CALIBRATION_REPLAYS = 16
#: ``learned_cost_aware`` cells learn online: they start analytic and retrain every this many replay seconds.
ONLINE_RETRAIN_S = 300.0
#: Trace seconds replayed by ``--quick``.
QUICK_DURATION_S = 120.0


_CLUSTER = ClusterConfig()


@dataclass(frozen=True, slots=True)
class BenchHardware:
    """What every worker of a bench is: its GPU type, the model it serves and its tensor-parallel degree.

    The default is :class:`~kvcost.replay.config.ClusterConfig`'s (one A100 per worker serving
    Llama-3-8B), the hardware :data:`LOAD_LEVELS` was measured on. On any other hardware the load
    levels are found by bisection on every trace (the constants would not be 60/80/95 % there).
    A bench on a model or GPU the router was never tuned on shows whether its choices rest on
    one step-time curve: the cost model prices prefill, queue and transfer with the hardware's
    own step-time model, so its rule should carry over.

    Attributes:
        gpu: GPU type of every worker (a name of ``kvcost.core.hardware.GPUS``).
        model: model name (``kvcost.core.specs.MODELS``) or path to a ``config.json``.
        tensor_parallel: GPUs per worker (≥ 1).

    Raises:
        ValueError: an unknown GPU or model, a degree < 1, or a model that leaves no KV capacity on
            that GPU (the message names the field).
    """

    gpu: str = _CLUSTER.fleet[0]
    model: str = _CLUSTER.model
    tensor_parallel: int = _CLUSTER.tensor_parallel

    def __post_init__(self) -> None:
        if self.gpu not in GPUS:
            raise ValueError(f"gpu = {self.gpu!r}, expected one of {', '.join(GPUS.names())}")
        self.cluster(1).check_hardware()

    def cluster(self, workers: int, **settings) -> ClusterConfig:
        """A :class:`ClusterConfig` of ``workers`` such workers, with the other ``settings`` (its fields)."""
        return ClusterConfig(
            model=self.model, fleet=(self.gpu,) * workers, tensor_parallel=self.tensor_parallel, **settings
        )


#: The hardware of a bench unless asked: an A100 per worker serving Llama-3-8B.
DEFAULT_HARDWARE = BenchHardware()


@dataclass(frozen=True, slots=True)
class BenchCell:
    """One (policy, load level, cluster size) replay; the workers evict by ``eviction_policy`` (vLLM's ``lru``
    unless asked) and are ``hardware`` (an A100 serving Llama-3-8B unless asked)."""

    policy: str
    load: str
    workers: int
    rate_scale: float
    eviction_policy: str = "lru"
    hardware: BenchHardware = DEFAULT_HARDWARE
    policy_params: tuple[tuple[str, float], ...] = ()


def rate_scales(workers: int) -> dict[str, float]:
    """Load label → rate scale for a cluster of ``workers`` A100s."""
    if workers in LOAD_LEVELS:
        return dict(LOAD_LEVELS[workers])
    return {label: scale * workers / 4 for label, scale in LOAD_LEVELS[4].items()}


def bench_cells(
    policies: Sequence[str],
    sizes: Sequence[int],
    scales: dict[int, dict[str, float]] | None = None,
    eviction_policy: str = "lru",
    hardware: BenchHardware = DEFAULT_HARDWARE,
    policy_params: tuple[tuple[str, float], ...] = (),
) -> list[BenchCell]:
    """The grid, size-major then load then policy; ``scales`` (workers → load → rate scale)
    defaults to :func:`rate_scales`; every cell's workers evict by ``eviction_policy`` and are ``hardware``,
    and its policy routes with ``policy_params`` (``RouterSettings.policy_params``)."""
    return [
        BenchCell(policy, load, workers, scale, eviction_policy, hardware, policy_params)
        for workers in sizes
        for load, scale in (scales[workers] if scales else rate_scales(workers)).items()
        for policy in policies
    ]


@dataclass(frozen=True, slots=True)
class Calibration:
    """The rate scale found for one (load level, cluster size) and what it measured.

    Attributes:
        load: load label (``"60%"`` ...); target: its utilisation (0.6 ...).
        workers: cluster size.
        rate_scale: arrival-rate multiplier found.
        utilisation: ``least_loaded``'s measured utilisation at ``rate_scale``.
        replays: replays run for this level (those of lower levels it reused not counted).
        within_tolerance: ``|utilisation − target| ≤ UTILISATION_TOLERANCE``.
    """

    load: str
    target: float
    workers: int
    rate_scale: float
    utilisation: float
    replays: int
    within_tolerance: bool


def bisect_rate_scale(
    measure: Callable[[float], float],
    target: float,
    start: float,
    known: dict[float, float] | None = None,
    tolerance: float = UTILISATION_TOLERANCE,
    max_replays: int = MAX_CALIBRATION_REPLAYS,
) -> tuple[float, float, int]:
    """Find a rate scale whose utilisation ``measure(scale)`` is within ``tolerance`` of ``target``.

    Utilisation grows with the rate scale. The bracket comes from ``known``
    (scale → utilisation already measured, updated in place) and is widened by
    halving / doubling from ``start`` until it holds the target; then bisection
    on log(scale). Stops at the first scale within tolerance; else, with the
    closest scale seen, after ``max_replays`` calls to ``measure`` or when
    doubling the scale no longer raises the utilisation by
    :data:`PLATEAU_POINTS` (a finite trace's drain tail caps it below 1).

    Returns:
        (rate scale, its utilisation, calls to ``measure``).

    Raises:
        ValueError: ``start`` ≤ 0 or ``target`` outside (0, 1).
    """
    if not (start > 0 and math.isfinite(start)):
        raise ValueError(f"start = {start!r}, expected a finite rate scale > 0")
    if not 0 < target < 1:
        raise ValueError(f"target = {target!r}, expected a utilisation in (0, 1)")
    known = {} if known is None else known
    calls = 0

    def best() -> tuple[float, float, int]:
        scale = min(known, key=lambda x: abs(known[x] - target))
        return scale, known[scale], calls

    while calls < max_replays:
        close = [x for x, u in known.items() if abs(u - target) <= tolerance]
        if close:
            return best()
        below = [x for x, u in known.items() if u < target]
        above = [x for x, u in known.items() if u > target]
        if not known:
            scale = start
        elif not above:
            if _plateau(known, below):
                return best()
            scale = max(below) * 2
        elif not below:
            scale = min(above) / 2
        else:
            scale = math.sqrt(max(below) * min(above))
        known[scale] = measure(scale)
        calls += 1
    return best()


def _plateau(known: dict[float, float], below: list[float]) -> bool:
    """The two largest scales below target were a doubling apart and the utilisation did not grow."""
    if len(below) < 2:
        return False
    lower, upper = sorted(below)[-2:]
    return upper >= 2 * lower * (1 - 1e-9) and known[upper] <= known[lower] + PLATEAU_POINTS


def calibrate_load_levels(
    trace: str,
    workers: int,
    duration_s: float | None,
    seed: int,
    start: float | None = None,
    targets: dict[str, float] | None = None,
    eviction_policy: str = "lru",
    hardware: BenchHardware = DEFAULT_HARDWARE,
) -> dict[str, Calibration]:
    """Rate scales at which ``least_loaded`` on ``workers`` workers measures each :data:`TARGET_UTILISATION`.

    Levels are found in increasing order, each reusing the replays of the ones
    before (one shared scale → utilisation table). The search starts at
    ``start`` (default ``workers / 4`` × :func:`speed_ratio`: the trace as recorded on 4 workers, faster
    or slower as the hardware serves it); ``targets`` defaults to :data:`TARGET_UTILISATION`. The workers
    evict by ``eviction_policy`` and are ``hardware``, as in the cells the levels are for.
    """
    if start is None:
        start = workers / 4 * speed_ratio(_trace(trace, 1.0, duration_s, seed), hardware)
    known: dict[float, float] = {}

    def measure(scale: float) -> float:
        cell = BenchCell(CALIBRATION_POLICY, "calibration", workers, scale, eviction_policy, hardware)
        utilisation = float(run_cell(cell, trace, duration_s, seed, False)["utilisation"])
        _log.info("calibrating %s, %d workers: rate scale %.4g → utilisation %.3f", trace, workers, scale, utilisation)
        return utilisation

    found: dict[str, Calibration] = {}
    for load, target in (targets or TARGET_UTILISATION).items():
        scale, utilisation, replays = bisect_rate_scale(measure, target, start, known)
        ok = abs(utilisation - target) <= UTILISATION_TOLERANCE
        found[load] = Calibration(load, target, workers, scale, utilisation, replays, ok)
    return found


def request_service_s(trace: Trace, hardware: BenchHardware) -> float:
    """Seconds of one worker a mean request of ``trace`` takes on ``hardware``: the prefill of its mean
    prompt alone, plus its share of the decode steps when the worker's KV memory is full of such
    requests (batch ``B`` = KV capacity ÷ (prompt + half the output), each step reading their context;
    the simulator's engine admits by memory, as vLLM does). Ignores prefix reuse and queueing: the
    value is a speed for comparing hardware on one trace, not a latency.

    Raises:
        ValueError: an empty trace.
    """
    if not trace.requests:
        raise ValueError(f"trace {trace.name!r} has no requests, expected at least one")
    prompt = sum(r.input_tokens for r in trace.requests) / len(trace.requests)
    output = sum(r.output_tokens for r in trace.requests) / len(trace.requests)
    config = hardware.cluster(1)
    model = config.step_model(hardware.gpu)
    context = prompt + output / 2
    batch = max(1, int(model.kv_capacity_tokens(config.gpu_memory_utilization) // max(context, 1.0)))
    decode_step_s = model.step_s(batch, 0.0, int(batch * context))
    return model.prefill_alone_s(round(prompt)) + output * decode_step_s / batch


def speed_ratio(trace: Trace, hardware: BenchHardware) -> float:
    """How much faster ``hardware`` serves ``trace`` than :data:`DEFAULT_HARDWARE` (the A100 × Llama-3-8B the
    rate scales were first measured on): the ratio of their :func:`request_service_s`; exactly 1 on the
    default hardware. At a given utilisation the arrival rate, so the rate scale, grows with it: the
    calibration starts its search there instead of at the default hardware's scale, which on a GPU
    several times slower replays deep overloads (the slowest replays) before it comes near the target.

    Raises:
        ValueError: an empty trace.
    """
    if hardware == DEFAULT_HARDWARE:
        return 1.0
    return request_service_s(trace, DEFAULT_HARDWARE) / request_service_s(trace, hardware)


def calibrate(
    trace: str,
    sizes: Sequence[int],
    duration_s: float | None,
    seed: int,
    jobs: int,
    eviction_policy: str = "lru",
    hardware: BenchHardware = DEFAULT_HARDWARE,
) -> dict[int, dict[str, Calibration]]:
    """:func:`calibrate_load_levels` for every cluster size (sizes in parallel when ``jobs`` > 1)."""
    levels = partial(calibrate_load_levels, eviction_policy=eviction_policy, hardware=hardware)
    if jobs <= 1 or len(sizes) == 1:
        return {w: levels(trace, w, duration_s, seed) for w in sizes}
    with ProcessPoolExecutor(max_workers=min(jobs, len(sizes))) as pool:
        futures = {w: pool.submit(levels, trace, w, duration_s, seed) for w in sizes}
        return {w: f.result() for w, f in futures.items()}


@lru_cache(maxsize=8)
def _trace(trace: str, rate_scale: float, duration_s: float | None, seed: int) -> Trace:
    return load_trace(trace, rate_scale=rate_scale, duration_s=duration_s, spread_seed=seed)


#: Relative step between the rate scales of a cell's nearby replays (:func:`nearby_rate_scales`): 10⁻⁴ moves
#: each arrival by at most 0.01 % of its time (0.36 s at the end of an hour), far below any load level's
#: width, yet a busy cell's P99 moves by ±7–20 % between such replays (docs/routing-unseen-workloads.md,
#: "How fragile the three lost cells are"): the spread is the replay's own sensitivity, not the load's.
NEARBY_STEP = 1e-4


def nearby_rate_scales(rate_scale: float, replays: int) -> list[float]:
    """The rate scales of a cell's ``replays`` nearby replays: ``rate_scale × (1 + k NEARBY_STEP)`` for
    k = 0, −1, 1, −2, 2, … (the first ``replays``), so one replay is the cell itself.

    Raises:
        ValueError: ``replays`` < 1.
    """
    if replays < 1:
        raise ValueError(f"replays = {replays}, expected an integer ≥ 1")
    offsets = [0] + [sign * k for k in range(1, replays) for sign in (-1, 1)]
    return [rate_scale * (1 + k * NEARBY_STEP) for k in offsets[:replays]]


def run_cell(
    cell: BenchCell, trace: str, duration_s: float | None, seed: int, keep_samples: bool, replays: int = 1
) -> dict:
    """Replay one cell; returns its summary figures (and worker samples when asked).

    With ``replays`` > 1 the cell is replayed at :func:`nearby_rate_scales` and the row is the replay
    whose TTFT P99 is the median (the lower median for an even count), so every figure of the row
    comes from one replay; ``ttft_p99_replays_s`` lists the P99 of every replay in
    :func:`nearby_rate_scales` order, and ``rate_scale`` stays the cell's.

    A learned policy's row also holds ``served_coverage_90``: the share of its requests whose TTFT
    was within the P90 bound served when they were routed, by a model trained only on earlier
    requests (coverage on a later window, as a live fleet sees it); NaN for the others.

    Raises:
        ValueError: ``replays`` < 1.
    """
    scales = nearby_rate_scales(cell.rate_scale, replays)
    runs = [_replay_row(cell, trace, duration_s, seed, keep_samples, scale) for scale in scales]
    p99s = [r["ttft_p99_s"] for r in runs]
    row = runs[sorted(range(len(runs)), key=lambda i: (math.isnan(p99s[i]), p99s[i]))[(len(runs) - 1) // 2]]
    if replays > 1:
        row["ttft_p99_replays_s"] = p99s
    return row


def _replay_row(
    cell: BenchCell, trace: str, duration_s: float | None, seed: int, keep_samples: bool, rate_scale: float
) -> dict:
    config = cell.hardware.cluster(
        cell.workers,
        seed=seed,
        router=RouterSettings(policy=cell.policy, policy_params=cell.policy_params),
        eviction_policy=cell.eviction_policy,
    )
    online = OnlineSettings(retrain_every_s=ONLINE_RETRAIN_S) if ROUTER_POLICIES.get(cell.policy).learned else None
    result = replay(_trace(trace, rate_scale, duration_s, seed), config, online=online)
    row = {"policy": cell.policy, "load": cell.load, "workers": cell.workers, "rate_scale": cell.rate_scale}
    row |= summarise(result, cell.workers)
    served = result.served_coverage_90
    row["served_coverage_90"] = served["coverage"] if served is not None else float("nan")
    if keep_samples:
        row["worker_samples"] = result.worker_samples
    return row


def run_bench(
    cells: Sequence[BenchCell],
    trace: str,
    duration_s: float | None,
    seed: int,
    jobs: int,
    keep_samples: Callable[[BenchCell], bool],
    progress: Callable[[int], None] | None = None,
    replays: int = 1,
) -> list[dict]:
    """Run every cell (in ``jobs`` processes when > 1), each ``replays`` times (:func:`run_cell`); rows in
    ``cells`` order."""
    args = [(c, trace, duration_s, seed, keep_samples(c), replays) for c in cells]
    if jobs <= 1:
        rows = []
        for a in args:
            rows.append(run_cell(*a))
            if progress:
                progress(1)
        return rows
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(run_cell, *a) for a in args]
        rows = []
        for future in futures:
            rows.append(future.result())
            if progress:
                progress(1)
        return rows


def add_ratios(rows: list[dict]) -> None:
    """Add ``p99_vs_best_baseline`` (best of :data:`BASELINE_POLICIES`) and ``p99_vs_oracle`` to every row,
    per (workers, load)."""
    frame = pd.DataFrame([{k: v for k, v in r.items() if k != "worker_samples"} for r in rows])
    for (workers, load), group in frame.groupby(["workers", "load"], sort=False):
        base = group[group["policy"].isin(BASELINE_POLICIES)]["ttft_p99_s"]
        oracle = group[group["policy"] == "oracle"]["ttft_p99_s"]
        best = float(base.min()) if len(base) else math.nan
        oracle_p99 = float(oracle.iloc[0]) if len(oracle) else math.nan
        for r in rows:
            if r["workers"] == workers and r["load"] == load:
                r["p99_vs_best_baseline"] = r["ttft_p99_s"] / best if best > 0 else math.nan
                r["p99_vs_oracle"] = r["ttft_p99_s"] / oracle_p99 if oracle_p99 > 0 else math.nan


def best_baseline(rows: list[dict], workers: int, load: str) -> str | None:
    """Name of the baseline or anchor (:data:`BASELINE_POLICIES`) with the lowest TTFT P99 in one (workers, load)
    group."""
    group = [r for r in rows if r["workers"] == workers and r["load"] == load and r["policy"] in BASELINE_POLICIES]
    return min(group, key=lambda r: r["ttft_p99_s"])["policy"] if group else None
