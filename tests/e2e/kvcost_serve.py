"""``kvcost serve`` as a real process for the end-to-end tests, and what its metrics and log say (``make e2e``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx

from kvcost.data.segments import connect_segments
from tests.e2e.engines import free_port
from tests.e2e.traffic import Result, metric


class KvcostServe:
    """``kvcost serve`` as a process (the real CLI), stopped with SIGINT as a user would."""

    def __init__(self, args: list[str], workdir: Path, roll_interval_s: float = 1.0) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.db = workdir / "log.duckdb"
        self.log = workdir / "serve.log"
        self.args = ["--host", "127.0.0.1", "--port", str(self.port), "--db", str(self.db), *args]
        self.process: subprocess.Popen | None = None
        self.roll_interval_s = roll_interval_s  # segments roll this often (the tests read them; default 60 s)

    def start(self, timeout_s: float = 120.0) -> None:
        env = {
            **os.environ,
            "KVCOST_SEGMENT_ROLL_INTERVAL_S": str(self.roll_interval_s),
            "KVCOST_SCRAPE_TIMEOUT_S": "2",
        }
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [str(Path(sys.executable).parent / "kvcost"), "serve", *self.args],
                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"kvcost serve exited:\n{self.log.read_text()[-3000:]}"
            try:
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"kvcost serve not ready:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()

    def metrics(self) -> str:
        return httpx.get(f"{self.url}/metrics", timeout=5).text

    def requests(self, where: str = "true") -> list[dict]:
        """The gateway's ``requests`` rows read from its closed segments (the log itself is locked)."""
        time.sleep(2.5)  # segments roll every second
        con = connect_segments(self.db.parent / f"{self.db.stem}-segments")
        frame = con.execute(f"SELECT * FROM requests WHERE {where}").fetch_df()
        return frame.to_dict("records")


def print_gateway_stalls(serve: KvcostServe, urls: dict[int, str]) -> None:
    """How often the gateway's event loop woke late (a stall every request shared) and why, by the service's
    warnings (serving.metrics.stall_cause), the requests it sent again on a new connection because an
    engine closed a pooled one under them (gateway.engine_http.post), and the client connections it closed
    because a request's head or body came too late (serving.http_protocol: the client's own stall)."""
    text = serve.metrics()
    wakes = metric(text, "kvcost_event_loop_lag_seconds_count")
    late = [wakes - metric(text, "kvcost_event_loop_lag_seconds_bucket", le=le) for le in ("0.5", "1.0", "2.5")]
    lines = serve.log.read_text().splitlines()
    causes = Counter(line.rpartition(": ")[2] for line in lines if "loop stalled" in line)
    timed_out = Counter(line.rpartition(": ")[2] for line in lines if "closed a connection from" in line)
    retries = {w: metric(text, "kvcost_gateway_connection_retries_total", worker=str(w)) for w in urls}
    print(f"[e2e] gateway event loop late by more than 0.5/1/2.5 s: {late} times (of {wakes:.0f}, since start); "
          f"stalls ≥ 1 s by cause {dict(causes)}; sent again on a new connection: {retries}; client connections "
          f"closed for a read timeout: {dict(timed_out)}")  # fmt: skip


def print_resets(serve: KvcostServe, reset: list[Result], id_prefix: str = "e2e") -> None:
    """What the gateway logged of each request whose connection was reset before the answer's head."""
    for r in reset[:5]:
        client_id = f"{id_prefix}-{r.spec.index}"
        logged = serve.requests(f"client_request_id = '{client_id}'")
        lines = [line for line in serve.log.read_text().splitlines() if client_id in line]
        print(f"[e2e] reset: request {r.spec.index}: {r.resets}; gateway rows {[x['outcome'] for x in logged]}")
        print("\n".join(f"[e2e]   log: {line[:300]}" for line in lines[:5]))


def await_scrapes(serve: KvcostServe, workers: int, rounds: int, timeout_s: float = 30.0) -> None:
    """Wait until every worker ``0 … workers − 1`` has ``rounds`` more successful scrapes than now
    (``kvcost_engine_scrapes_total{result="ok"}``); two rounds hold one begun after this call."""

    def ok_counts() -> list[float]:
        text = serve.metrics()
        return [metric(text, "kvcost_engine_scrapes_total", worker=str(w), result="ok") for w in range(workers)]

    before = ok_counts()
    deadline = time.monotonic() + timeout_s
    while any(now < then + rounds for now, then in zip(ok_counts(), before, strict=True)):
        assert time.monotonic() < deadline, f"no {rounds} scrapes of every engine within {timeout_s} s"
        time.sleep(0.1)


def stored_blocks(serve: KvcostServe, settle_s: float = 0.3, timeout_s: float = 10.0) -> float:
    """Blocks the gateway's directory has ingested (``kvcost_kv_blocks_total{op="stored"}``, all workers),
    read once two reads ``settle_s`` apart agree (the KV event stream has caught up), or after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    before = metric(serve.metrics(), "kvcost_kv_blocks_total", op="stored")
    while time.monotonic() < deadline:
        time.sleep(settle_s)
        now = metric(serve.metrics(), "kvcost_kv_blocks_total", op="stored")
        if now == before:
            return now
        before = now
    return before
