"""End-to-end tests against a real ``kvcost serve`` (uvicorn) process on 127.0.0.1: scoring, routing, kill -9.

Every wait is bounded; the process is always stopped (SIGKILL as a last resort).
"""

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import duckdb
import httpx
import pytest

from kvcost.data.segments import connect_segments, segments_dir_for
from tests.serving.heavy_bodies import forest_body
from tests.serving.test_api import make_body

pytestmark = pytest.mark.slow

TOKEN = "e2e-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
START_TIMEOUT_S = 30.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``kvcost serve`` in a subprocess, working directory ``tmp_path`` (its relative paths stay there)."""

    def __init__(
        self, tmp_path: Path, db: Path, env: dict[str, str] | None = None, extra_args: tuple[str, ...] = ()
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        (tmp_path / "token").write_text(TOKEN)
        args = [sys.executable, "-m", "kvcost.cli", "serve", "--host", "127.0.0.1", "--port", str(self.port)]
        args += ["--db", str(db), "--analytic-only", "--token-file", str(tmp_path / "token"), "--log-level", "warning"]
        args += extra_args
        self.log = (tmp_path / f"serve-{self.port}.log").open("w")
        env = {**os.environ, **(env or {})}
        self.proc = subprocess.Popen(args, cwd=tmp_path, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"kvcost serve exited with {self.proc.returncode}: {self._log_text()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"kvcost serve not healthy after {START_TIMEOUT_S} s: {self._log_text()}")
            time.sleep(0.05)

    def _log_text(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text()[-2000:]

    def kill(self) -> None:
        """SIGKILL: no shutdown, no flush, no checkpoint."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self.log.close()

    def stop(self) -> None:
        """SIGTERM: uvicorn's graceful shutdown (the lifespan closes the log)."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self.log.close()


@pytest.fixture
def servers():
    started: list[Server] = []
    yield started
    for server in started:
        if server.proc.poll() is None:
            server.kill()


def test_end_to_end_score_route_observe_over_http(tmp_path, servers):
    db = tmp_path / "log.duckdb"
    server = Server(tmp_path, db)
    servers.append(server)
    with httpx.Client(base_url=server.url, timeout=10.0) as http:
        assert http.get("/readyz").json()["status"] == "ready"
        scored = http.post("/v1/score", json=make_body(request_id=1))
        assert scored.status_code == 200 and len(scored.json()["candidates"]) == 2
        assert http.post("/v1/route", json=make_body(request_id=1)).status_code == 401
        routed = http.post("/v1/route", json=make_body(request_id=1), headers=AUTH)
        assert routed.status_code == 200 and routed.json()["worker_id"] == 1
        observed = http.post("/v1/observe", json={"request_id": 1, "ttft_s": 0.02}, headers=AUTH)
        assert observed.json()["status"] == "recorded"
        metrics = http.get("/metrics").text
        assert 'kvcost_observations_total{result="recorded"} 1.0' in metrics
    server.stop()
    assert server.proc.returncode in (0, -signal.SIGTERM)  # uvicorn re-raises the signal after its shutdown
    assert not Path(f"{db}.wal").exists()  # the lifespan closed the log: DuckDB checkpointed and removed its WAL
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT request_id, worker_id, actual_ttft_s FROM requests").fetchall() == [(1, 1, 0.02)]
    with connect_segments(segments_dir_for(db)) as con:  # rolled on shutdown, for readers such as kvcost retrain
        assert con.execute("SELECT request_id FROM requests").fetchall() == [(1,)]


def test_acknowledged_observations_survive_kill_9(tmp_path, servers):
    db = tmp_path / "log.duckdb"
    n = 20
    server = Server(tmp_path, db)
    servers.append(server)
    with httpx.Client(base_url=server.url, timeout=10.0, headers=AUTH) as http:
        # routed before the observed ones, never observed before the kill
        assert http.post("/v1/route", json=make_body(request_id=1000)).status_code == 200
        for request_id in range(n):
            assert http.post("/v1/route", json=make_body(request_id=request_id)).status_code == 200
            ack = http.post("/v1/observe", json={"request_id": request_id, "ttft_s": 0.01 * (request_id + 1)})
            assert ack.json()["status"] == "recorded"
    server.kill()
    assert server.proc.returncode == -signal.SIGKILL
    assert Path(f"{db}.wal").exists()  # not checkpointed: the observations are only in DuckDB's WAL

    restarted = Server(tmp_path, db)  # same database: DuckDB replays its WAL on open
    servers.append(restarted)
    with httpx.Client(base_url=restarted.url, timeout=10.0, headers=AUTH) as http:
        statuses = {http.post("/v1/observe", json={"request_id": i, "ttft_s": 9.0}).json()["status"] for i in range(n)}
        assert statuses == {"duplicate"}
        late = http.post("/v1/observe", json={"request_id": 1000, "ttft_s": 0.5})
        assert late.json()["status"] == "recorded"  # its decision was reloaded from the log
    restarted.stop()
    with duckdb.connect(str(db), read_only=True) as con:
        got = con.execute("SELECT request_id, actual_ttft_s FROM requests ORDER BY request_id").fetchall()
        chosen = con.execute("SELECT count(*) FROM candidates WHERE chosen").fetchall()
    assert got == [(i, pytest.approx(0.01 * (i + 1))) for i in range(n)] + [(1000, 0.5)]
    assert chosen == [(n + 1,)]


def test_observations_of_routes_lost_in_a_kill_9_are_recorded_unjoined(tmp_path, servers):
    db = tmp_path / "log.duckdb"
    n = 30
    server = Server(tmp_path, db, env={"KVCOST_DECISION_LINGER_S": "10"})  # the decisions stay queued
    servers.append(server)
    with httpx.Client(base_url=server.url, timeout=10.0, headers=AUTH) as http:
        routed = [http.post("/v1/route", json=make_body(request_id=i)).status_code for i in range(n)]
    assert routed == [200] * n
    server.kill()

    restarted = Server(tmp_path, db)
    servers.append(restarted)
    with httpx.Client(base_url=restarted.url, timeout=10.0, headers=AUTH) as http:
        answers = [http.post("/v1/observe", json={"request_id": i, "ttft_s": 0.01 * (i + 1)}) for i in range(n)]
        again = http.post("/v1/observe", json={"request_id": 0, "ttft_s": 9.0}).json()["status"]
    assert [a.json()["status"] for a in answers] == ["unjoined"] * n
    assert again == "duplicate"
    restarted.kill()
    with duckdb.connect(str(db), read_only=True) as con:
        decisions = con.execute("SELECT count(*) FROM candidates").fetchall()
        kept = con.execute("SELECT request_id, actual_ttft_s FROM unjoined_observations ORDER BY 1").fetchall()
    assert decisions == [(0,)]  # every acknowledged route was lost with the process
    assert kept == [(i, pytest.approx(0.01 * (i + 1))) for i in range(n)]  # and no observation of one


def test_healthz_and_route_answer_while_a_100k_node_rank_runs(tmp_path, servers):
    server = Server(tmp_path, tmp_path / "log.duckdb")
    servers.append(server)
    body = forest_body(100_000)
    done: list[float] = []

    def rank() -> None:
        answer = httpx.post(f"{server.url}/v1/evict/rank", content=body, timeout=120.0)
        done.append(time.monotonic())
        assert answer.status_code == 200 and len(answer.json()["nodes"]) == 100_000

    ranking = threading.Thread(target=rank)
    ranking.start()
    time.sleep(1.0)  # the body is sent, and the worker has started
    with httpx.Client(base_url=server.url, timeout=10.0, headers=AUTH) as http:
        health = http.get("/healthz").status_code
        routed = http.post("/v1/route", json=make_body(request_id=1)).status_code
        answered = time.monotonic()
    ranking.join(120)
    assert (health, routed) == (200, 200)
    assert done and answered < done[0]  # both answered before the rank did: it ran off the event loop


def _read_all(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(4096):
        data += chunk
    return data


def test_slow_clients_get_408_and_are_closed_after_the_head_and_body_timeouts(tmp_path, servers):
    server = Server(tmp_path, tmp_path / "log.duckdb", extra_args=("--head-timeout-s", "1", "--body-timeout-s", "1"))
    servers.append(server)
    sends = {
        "silent": b"",
        "part of a head": b"POST /v1/score HTTP/1.1\r\nhost: x\r\n",
        "a head and one body byte": b"POST /v1/score HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{",
    }
    answers = {}
    for name, data in sends.items():
        with socket.create_connection(("127.0.0.1", server.port), timeout=10.0) as sock:
            sock.sendall(data)
            answers[name] = _read_all(sock)  # returns when the server closes the connection
    assert answers["silent"].endswith(b'{"detail": "request head not received within 1 s"}')
    assert answers["part of a head"].startswith(b"HTTP/1.1 408 Request Timeout\r\n")
    assert answers["a head and one body byte"].endswith(b'{"detail": "request body not received within 1 s"}')
    with httpx.Client(base_url=server.url, timeout=10.0) as http:  # a whole request is not limited
        assert http.post("/v1/score", json=make_body(request_id=1)).status_code == 200
    log = server._log_text()  # read after a request served later, so that what the timeouts logged is there
    closed = [line for line in log.splitlines() if "closed a connection from" in line]
    assert [line.rpartition(": ")[2] for line in closed] == [
        "request head not received within 1 s",
        "request head not received within 1 s",
        "request body not received within 1 s",
    ]  # logged, so that an operator sees why a client was reset
    assert "Traceback" not in log  # the handler left reading the closed body logs nothing more


def test_the_heavy_workers_start_with_the_server_and_end_with_a_kill_9(tmp_path, servers):
    server = Server(tmp_path, tmp_path / "log.duckdb")
    servers.append(server)
    deadline = time.monotonic() + 30
    while not (workers := _children(server.proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.2)  # warmed at start: no heavy request was sent
    assert workers, "no worker process started with the server"
    server.kill()
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{pid}").exists() for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(Path(f"/proc/{pid}").exists() for pid in workers), f"workers {workers} outlived a kill -9"


def _children(pid: int) -> list[int]:
    """Process ids whose parent is ``pid`` (Linux ``/proc``)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def test_past_the_concurrency_limit_a_request_gets_503_with_retry_after(tmp_path, servers):
    server = Server(tmp_path, tmp_path / "log.duckdb", extra_args=("--limit-concurrency", "1"))
    servers.append(server)
    with socket.create_connection(("127.0.0.1", server.port), timeout=10.0) as holding:
        holding.sendall(b"POST /v1/score HTTP/1.1\r\nhost: x\r\n")  # one connection open, its head unfinished
        time.sleep(0.2)
        refused = httpx.get(f"{server.url}/healthz", timeout=10.0)
    assert (refused.status_code, refused.headers["retry-after"]) == (503, "1")
    assert refused.json() == {"detail": "too many open connections or requests; retry after 1 s"}
    assert httpx.get(f"{server.url}/healthz", timeout=10.0).status_code == 200  # the other one closed
