"""Measured GPU operator profiles (Microsoft Vidur) bundled with kvcost.

Source: github.com/microsoft/vidur, ``data/profiles/compute/<gpu>/<provider>/<model>/mlp.csv``
at commit 7d47513363ec447a741ac5e47241580b47724fbf, MIT licence (docs/architecture.md §8). The
files are produced by ``vidur/profiling/mlp/main.py``: one CUDA-timed forward pass of
a single transformer block per (num_tokens, tensor-parallel degree), several repeats
per point. Times are **milliseconds per layer** (``emb`` once per forward pass).

Bundled copy: :func:`reduce_vidur_csv` keeps every tensor-parallel degree (1, 2, 4, 8: each
row times one GPU's shard of the block; the all-reduce between shards is not in it) and only
the columns in :data:`BUNDLED_COLUMNS`; the network files keep :data:`NETWORK_COLUMNS`;
:func:`bundle_vidur_profiles` rebuilds the whole bundle from a Vidur checkout (see
``data/bundled/NOTICE-profiles.md``).

Operators (the ``time_stats.<op>.median`` columns present in every bundled file):

- once per step: ``emb`` (token embedding lookup);
- per layer: ``input_layernorm``, ``attn_pre_proj`` (QKV GEMM), ``attn_rope``,
  ``attn_post_proj`` (O GEMM), ``post_attention_layernorm``, ``mlp_up_proj``
  (gate+up GEMM), ``mlp_act`` (SiLU-and-mul), ``mlp_down_proj``, ``add``.

``add`` counts **twice** per layer (:data:`PER_LAYER_OP_COUNTS`): a Llama block has
two residual adds (after attention and after the MLP), both on a
``num_tokens × n_embd`` tensor, but Vidur's profiler (``vidur/profiling/mlp/mlp_impl.py``,
``GPTBlock._forward_with_post_attn_norm``) wraps only the second one in its
``add`` timer. The first add has the same shape and hence the same cost.

Attention itself (QK^T, softmax, AV) is not in these files; ``kvcost.core.hardware``
models it from FLOPs and bytes.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

import numpy as np
import pandas as pd

SECONDS_PER_MILLISECOND = 1e-3
"""Vidur's ``time_stats`` columns are in milliseconds."""

VIDUR_COMMIT = "7d47513363ec447a741ac5e47241580b47724fbf"
"""microsoft/vidur commit the bundled profiles were taken from."""

VIDUR_PROVIDER_DIR = "meta-llama"
"""Provider folder between the GPU and the model folder in Vidur's layout."""

VIDUR_PROFILE_FILE = "mlp.csv"
"""File name of a Vidur non-attention compute profile."""

BUNDLED_VIDUR_FILES = (
    "compute/a100/meta-llama/Meta-Llama-3-8B/mlp.csv",
    "compute/a100/meta-llama/Llama-2-7b-hf/mlp.csv",
    "compute/h100/meta-llama/Llama-2-7b-hf/mlp.csv",
    "compute/h100/meta-llama/Llama-2-70b-hf/mlp.csv",
)
"""Compute profiles bundled under ``data/bundled/profiles/vidur`` (paths relative to it)."""

BUNDLED_NETWORK_FILES = (
    "network/a100_dgx/send_recv.csv",
    "network/h100_dgx/send_recv.csv",
)
"""Point-to-point transfer profiles bundled beside them (two GPUs, NCCL send/recv of ``size``
fp16 elements; ``devices_per_node`` 2 = both on one node's NVLink, 1 = across nodes)."""

NETWORK_COLUMNS = ("size", "num_workers", "devices_per_node", "time_stats.send_recv.median")
"""Columns kept of a network profile."""

ONCE_PER_STEP_OPS = ("emb",)
"""Operators run once per forward pass (not per layer)."""

PER_LAYER_OP_COUNTS = {
    "input_layernorm": 1,
    "attn_pre_proj": 1,
    "attn_rope": 1,
    "attn_post_proj": 1,
    "post_attention_layernorm": 1,
    "mlp_up_proj": 1,
    "mlp_act": 1,
    "mlp_down_proj": 1,
    "add": 2,
}
"""Per-layer non-attention operators and how many times each runs per layer."""

SHAPE_COLUMNS = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd")
"""Model shape columns kept in the bundled copy (for provenance checks)."""

BUNDLED_COLUMNS = (
    "num_tokens",
    "num_tensor_parallel_workers",
    *SHAPE_COLUMNS,
    *(f"time_stats.{op}.median" for op in (*ONCE_PER_STEP_OPS, *PER_LAYER_OP_COUNTS)),
)
"""Columns kept by :func:`reduce_vidur_csv`, in this order."""


@dataclass(frozen=True)
class OperatorProfile:
    """Non-attention step time of one (GPU, model) as a function of batch tokens.

    Attributes:
        num_tokens: measured batch sizes in tokens (int64, strictly increasing, ≥ 2 points).
        per_layer_s: seconds per transformer layer for all per-layer non-attention
            operators at each ``num_tokens`` (float64).
        once_s: seconds for the once-per-step operators (``emb``) at each ``num_tokens``.
        source: where the numbers come from (bundled path relative to ``profiles/``,
            or a description of a derivation).
    """

    num_tokens: np.ndarray
    per_layer_s: np.ndarray
    once_s: np.ndarray
    source: str

    def total_s(self, num_layers: int) -> np.ndarray:
        """Seconds of a whole forward pass's non-attention operators at each ``num_tokens``:
        ``per_layer_s × num_layers + once_s``."""
        return self.per_layer_s * num_layers + self.once_s

    def __post_init__(self) -> None:
        tokens = np.array(self.num_tokens, dtype=np.int64)
        per_layer = np.array(self.per_layer_s, dtype=np.float64)
        once = np.array(self.once_s, dtype=np.float64)
        _check_profile_arrays(tokens, per_layer, once)
        for name, arr in (("num_tokens", tokens), ("per_layer_s", per_layer), ("once_s", once)):
            arr.setflags(write=False)
            object.__setattr__(self, name, arr)


def _check_profile_arrays(tokens: np.ndarray, per_layer: np.ndarray, once: np.ndarray) -> None:
    """Raise ``ValueError`` unless the arrays form a usable profile."""
    if tokens.ndim != 1 or tokens.size < 2:
        raise ValueError(f"num_tokens must be 1-D with >= 2 points, got shape {tokens.shape}")
    if per_layer.shape != tokens.shape or once.shape != tokens.shape:
        raise ValueError(f"per_layer_s {per_layer.shape} and once_s {once.shape} must match num_tokens {tokens.shape}")
    if np.any(np.diff(tokens) <= 0) or tokens[0] < 1:
        raise ValueError("num_tokens must be strictly increasing and >= 1")
    if np.any(per_layer < 0) or np.any(once < 0) or not np.all(np.isfinite(per_layer + once)):
        raise ValueError("per_layer_s and once_s must be finite and >= 0")


def reduce_vidur_csv(src: str | Path, dst: str | Path) -> None:
    """Write the bundled reduction of one Vidur ``mlp.csv`` or ``send_recv.csv``.

    Keeps every row (all tensor-parallel degrees and repeats, original order) and the columns
    :data:`BUNDLED_COLUMNS` (:data:`NETWORK_COLUMNS` for a network file); values unchanged.
    """
    frame = pd.read_csv(src)
    columns = NETWORK_COLUMNS if "time_stats.send_recv.median" in frame.columns else BUNDLED_COLUMNS
    frame = frame.loc[:, list(columns)]
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(dst, index=False, lineterminator="\n")


def bundle_vidur_profiles(src_root: str | Path, dst_root: str | Path) -> None:
    """Rebuild ``data/bundled/profiles/vidur`` from a Vidur ``data/profiles`` folder.

    Reduces every file of :data:`BUNDLED_VIDUR_FILES` and copies
    ``LICENSE-SOURCE.txt`` (if present in ``src_root``) beside them.
    """
    src_root, dst_root = Path(src_root), Path(dst_root)
    for rel in (*BUNDLED_VIDUR_FILES, *BUNDLED_NETWORK_FILES):
        reduce_vidur_csv(src_root / rel, dst_root / rel)
    licence = src_root / "LICENSE-SOURCE.txt"
    if licence.exists():
        shutil.copyfile(licence, dst_root / "LICENSE-SOURCE.txt")


def _vidur_root() -> Traversable:
    """The bundled Vidur profile folder inside the installed package."""
    return resources.files("kvcost.data") / "bundled" / "profiles" / "vidur"


def available_vidur_profiles() -> list[tuple[str, str]]:
    """Bundled ``(gpu, model_dir)`` pairs, sorted."""
    compute = _vidur_root() / "compute"
    if not compute.is_dir():
        return []
    found = []
    for gpu in compute.iterdir():
        provider = gpu / VIDUR_PROVIDER_DIR
        if provider.is_dir():
            found += [(gpu.name, m.name) for m in provider.iterdir() if m.is_dir()]
    return sorted(found)


def load_vidur_profile(gpu: str, model_dir: str, tp: int = 1) -> OperatorProfile:
    """Load the bundled Vidur profile of ``model_dir`` (e.g. ``"Meta-Llama-3-8B"``) on ``gpu``, one
    GPU's shard at tensor-parallel degree ``tp``.

    Per ``num_tokens``, each operator's time is the median over repeat rows of
    Vidur's per-run median; ``per_layer_s`` sums the per-layer operators weighted by
    :data:`PER_LAYER_OP_COUNTS`; ``once_s`` sums :data:`ONCE_PER_STEP_OPS`.

    Raises:
        KeyError: no bundled profile for (gpu, model_dir, tp); the message lists those that exist.
    """
    rel = f"compute/{gpu}/{VIDUR_PROVIDER_DIR}/{model_dir}/{VIDUR_PROFILE_FILE}"
    path = _vidur_root().joinpath(*rel.split("/"))
    if not path.is_file():
        known = ", ".join(f"{g}/{m}" for g, m in available_vidur_profiles()) or "(none)"
        raise KeyError(f"no bundled Vidur profile for gpu {gpu!r}, model {model_dir!r}; available: {known}")
    with path.open("r") as handle:
        frame = pd.read_csv(handle)
    if tp not in set(frame["num_tensor_parallel_workers"]):
        degrees = sorted(set(frame["num_tensor_parallel_workers"].tolist()))
        raise KeyError(f"bundled Vidur profile {gpu}/{model_dir} has tensor-parallel degrees {degrees}, not {tp}")
    source = f"vidur/{rel}" + (f" (tp {tp})" if tp != 1 else "")
    return profile_from_frame(frame[frame["num_tensor_parallel_workers"] == tp], source=source)


def load_vidur_send_recv(system: str) -> pd.DataFrame:
    """The bundled point-to-point profile of ``system`` (``a100_dgx``, ``h100_dgx``): one row per
    (``size`` elements, ``devices_per_node``) with the median ``time_s`` over repeats.

    Raises:
        KeyError: no bundled profile for ``system``.
    """
    rel = f"network/{system}/send_recv.csv"
    path = _vidur_root().joinpath(*rel.split("/"))
    if not path.is_file():
        raise KeyError(f"no bundled Vidur network profile for {system!r}; expected one of {BUNDLED_NETWORK_FILES}")
    with path.open("r") as handle:
        frame = pd.read_csv(handle)
    medians = frame.groupby(["size", "devices_per_node"], sort=True)["time_stats.send_recv.median"].median()
    out = medians.reset_index().rename(columns={"time_stats.send_recv.median": "time_s"})
    out["time_s"] *= SECONDS_PER_MILLISECOND
    return out


def profile_from_frame(frame: pd.DataFrame, source: str) -> OperatorProfile:
    """Build an :class:`OperatorProfile` from Vidur-style rows of one tensor-parallel degree.

    Raises:
        ValueError: a required ``time_stats.<op>.median`` column is missing, or the rows mix
            tensor-parallel degrees.
    """
    if "num_tensor_parallel_workers" in frame.columns and frame["num_tensor_parallel_workers"].nunique() > 1:
        raise ValueError(f"profile {source!r} mixes tensor-parallel degrees; select one first")
    ops = (*ONCE_PER_STEP_OPS, *PER_LAYER_OP_COUNTS)
    columns = [f"time_stats.{op}.median" for op in ops]
    missing = [c for c in ["num_tokens", *columns] if c not in frame.columns]
    if missing:
        raise ValueError(f"profile {source!r} lacks columns {missing}")
    medians = frame.groupby("num_tokens", sort=True)[columns].median()
    per_layer_ms = sum(medians[f"time_stats.{op}.median"] * count for op, count in PER_LAYER_OP_COUNTS.items())
    once_ms = sum(medians[f"time_stats.{op}.median"] for op in ONCE_PER_STEP_OPS)
    return OperatorProfile(
        num_tokens=medians.index.to_numpy(dtype=np.int64),
        per_layer_s=per_layer_ms.to_numpy(dtype=np.float64) * SECONDS_PER_MILLISECOND,
        once_s=np.asarray(once_ms, dtype=np.float64) * SECONDS_PER_MILLISECOND,
        source=source,
    )
