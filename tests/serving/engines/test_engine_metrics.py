"""Tests for kvcost.serving.engines.engine_metrics: vLLM / SGLang /metrics → worker snapshots, over real HTTP."""

import asyncio
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from fastapi.testclient import TestClient

from kvcost.serving.api import create_app
from kvcost.serving.engines.engine_metrics import (
    EngineMetrics,
    EngineMetricsError,
    EngineMetricsScraper,
    ScrapeTarget,
    parse_engine_metrics,
    parse_scrape_target,
    prefix_cache_hit_ratio,
    snapshot_from_metrics,
    wanted_lines,
)
from kvcost.serving.engines.liveness import EngineLiveness
from kvcost.serving.gateway.load import SentLoad
from kvcost.serving.metrics import ServiceMetrics
from kvcost.serving.schemas import SnapshotIn
from kvcost.serving.scraping import engine_scraper
from kvcost.serving.service import ScoringService
from kvcost.serving.settings import ServiceSettings

MODEL = 'model_name="meta-llama/Llama-3.1-8B-Instruct"'


def vllm_text(
    prompt_sum=20000.0, prompt_count=10.0, itl_sum=25.0, itl_count=1000.0, queries=1000.0, hits=250.0, started_s=1.7e9
):
    """A vLLM /metrics page (V1 names) of two data-parallel engines, with the histograms cut to a few buckets."""
    e0, e1 = f'engine="0",{MODEL}', f'engine="1",{MODEL}'
    config = 'cache_dtype="auto",enable_prefix_caching="True",prefix_caching_hash_algo="sha256"'
    return f"""\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{{e0}}} 3.0
vllm:num_requests_running{{{e1}}} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{{e0}}} 2.0
vllm:num_requests_waiting{{{e1}}} 1.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{{e0}}} 0.25
vllm:kv_cache_usage_perc{{{e1}}} 0.75
# HELP vllm:prefix_cache_queries Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{{{e0}}} {queries}
# HELP vllm:prefix_cache_hits Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{{{e0}}} {hits}
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{{block_size="16",{config},engine="0",num_gpu_blocks="1000"}} 1.0
vllm:cache_config_info{{block_size="16",{config},engine="1",num_gpu_blocks="1000"}} 1.0
# HELP vllm:request_prompt_tokens Number of prefill tokens processed.
# TYPE vllm:request_prompt_tokens histogram
vllm:request_prompt_tokens_bucket{{{e0},le="1.0"}} 0.0
vllm:request_prompt_tokens_bucket{{{e0},le="+Inf"}} {prompt_count}
vllm:request_prompt_tokens_count{{{e0}}} {prompt_count}
vllm:request_prompt_tokens_sum{{{e0}}} {prompt_sum}
# HELP vllm:inter_token_latency_seconds Histogram of inter-token latency in seconds.
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_bucket{{{e0},le="0.01"}} 0.0
vllm:inter_token_latency_seconds_bucket{{{e0},le="+Inf"}} {itl_count}
vllm:inter_token_latency_seconds_count{{{e0}}} {itl_count}
vllm:inter_token_latency_seconds_sum{{{e0}}} {itl_sum}
# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.
# TYPE process_start_time_seconds gauge
process_start_time_seconds {started_s}
"""


def sglang_text(sep=":"):
    labels = f'{MODEL},engine_type="unified",tp_rank="0",pp_rank="0"'
    return f"""\
# TYPE sglang{sep}num_running_reqs gauge
sglang{sep}num_running_reqs{{{labels}}} 4.0
# TYPE sglang{sep}num_queue_reqs gauge
sglang{sep}num_queue_reqs{{{labels}}} 2.0
# TYPE sglang{sep}token_usage gauge
sglang{sep}token_usage{{{labels}}} 0.3
# TYPE sglang{sep}decode_sum_seq_lens gauge
sglang{sep}decode_sum_seq_lens{{{labels}}} 12000.0
# TYPE sglang{sep}cache_hit_rate gauge
sglang{sep}cache_hit_rate{{{labels}}} 0.4
# TYPE sglang{sep}prompt_tokens counter
sglang{sep}prompt_tokens_total{{{labels}}} 9000.0
# TYPE sglang{sep}num_requests counter
sglang{sep}num_requests_total{{{labels}}} 30.0
# TYPE sglang{sep}inter_token_latency_seconds histogram
sglang{sep}inter_token_latency_seconds_bucket{{{labels},le="+Inf"}} 100.0
sglang{sep}inter_token_latency_seconds_count{{{labels}}} 100.0
sglang{sep}inter_token_latency_seconds_sum{{{labels}}} 2.0
"""


VLLM = EngineMetrics(
    engine="vllm",
    running_requests=5.0,
    waiting_requests=3.0,
    kv_usage=0.5,
    kv_capacity_blocks=2000,
    block_size_tokens=16,
    prompt_tokens_sum=20000.0,
    prompt_requests=10.0,
    step_s_sum=25.0,
    step_count=1000.0,
    prefix_cache_queries_tokens=1000.0,
    prefix_cache_hits_tokens=250.0,
    process_start_time_s=1.7e9,
)


def test_vllm_metrics_are_summed_over_engines_and_ratios_averaged():
    assert parse_engine_metrics(vllm_text()) == VLLM


@pytest.mark.parametrize("sep", [":", "_"])
def test_sglang_metrics_under_either_prefix(sep):
    assert parse_engine_metrics(sglang_text(sep)) == EngineMetrics(
        engine="sglang",
        running_requests=4.0,
        waiting_requests=2.0,
        kv_usage=0.3,
        prompt_tokens_sum=9000.0,
        prompt_requests=30.0,
        step_s_sum=2.0,
        step_count=100.0,
        prefix_cache_hit_ratio=0.4,
        decode_context_tokens=12000.0,
    )


def test_first_snapshot_uses_the_means_since_the_engine_started():
    assert snapshot_from_metrics(VLLM) == SnapshotIn(
        waiting_prefill=[(2000, 0)] * 3,  # 20,000 prompt tokens / 10 requests for each of the 3 waiting
        running_requests=5,
        decode_context_tokens=16000,  # 0.5 × 2000 blocks × 16 tokens
        kv_usage=0.5,
        recent_step_s=0.025,  # 25 s / 1000 inter-token latencies
        kv_capacity_blocks=2000,
        waiting_prompt_blocks=375,  # 3 × ceil(2000 / 16)
    )
    assert prefix_cache_hit_ratio(VLLM) == 0.25


def test_later_snapshots_use_the_means_over_the_interval():
    before = parse_engine_metrics(vllm_text(prompt_sum=15000.0, prompt_count=8.0, itl_sum=20.0, itl_count=900.0))
    snapshot = snapshot_from_metrics(VLLM, before)
    assert (snapshot.waiting_prefill, snapshot.recent_step_s) == ([(2500, 0)] * 3, 0.05)  # 5000 / 2, 5 s / 100
    assert snapshot.waiting_prompt_blocks == 3 * 157  # ceil(2500 / 16)


def test_prefix_cache_hit_ratio_over_the_interval():
    before = parse_engine_metrics(vllm_text(queries=600.0, hits=50.0))
    assert prefix_cache_hit_ratio(VLLM, before) == 0.5  # (250 − 50) / (1000 − 600)
    assert prefix_cache_hit_ratio(parse_engine_metrics(sglang_text())) == 0.4
    assert prefix_cache_hit_ratio(parse_engine_metrics(vllm_text(queries=0.0, hits=0.0))) is None


def test_sglang_snapshot_reads_decode_lengths_and_has_no_capacity():
    snapshot = snapshot_from_metrics(parse_engine_metrics(sglang_text()))
    assert snapshot == SnapshotIn(
        waiting_prefill=[(300, 0)] * 2,
        running_requests=4,
        decode_context_tokens=12000,
        kv_usage=0.3,
        recent_step_s=0.02,
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("<html>502 Bad Gateway</html>", "not Prometheus text exposition"),
        ("vllm:num_requests_running{engine=0} one", "not Prometheus text exposition"),
        ("# TYPE http_requests counter\nhttp_requests_total 3\n", "no vLLM or SGLang load metrics"),
        ("", "no vLLM or SGLang load metrics"),
    ],
)
def test_text_without_engine_metrics_is_an_error(text, message):
    with pytest.raises(EngineMetricsError, match=message):
        parse_engine_metrics(text)


def test_scrape_entries_are_validated():
    assert parse_scrape_target("3=http://127.0.0.1:8000/metrics") == ScrapeTarget(3, "http://127.0.0.1:8000/metrics")
    with pytest.raises(ValueError, match="scrape entry 'x:8000', expected WORKER=http://HOST:PORT/metrics"):
        parse_scrape_target("x:8000")
    with pytest.raises(ValueError, match="scrape names worker ids \\[1, 1\\]; each worker may be scraped once"):
        ServiceSettings(db_path="log.duckdb", scrape=["1=http://a/metrics", "1=http://b/metrics"])


# ------------------------------------------------------------------- real HTTP servers


class MetricsServer:
    """A loopback HTTP server answering GET /metrics with ``self.body`` and ``self.status`` (changeable)."""

    def __init__(self, body: str, status: int = 200):
        self.body, self.status = body, status
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                data = outer.body.encode()
                self.send_response(outer.status)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def servers():
    made = []

    def make(body, status=200):
        made.append(MetricsServer(body, status))
        return made[-1]

    yield make
    for server in made:
        server.close()


def closed_port_url() -> str:
    server = MetricsServer("")
    url = server.url
    server.close()
    return url


def test_scrapes_become_snapshots_and_failures_age_them(tmp_path, servers):
    vllm, garbage, failing = servers(vllm_text()), servers("<html>not metrics</html>"), servers("oops", status=500)
    now = [100.0]
    settings = ServiceSettings(db_path=tmp_path / "log.duckdb", segment_roll_interval_s=0)
    service = ScoringService(settings, clock=lambda: now[0], model_loader=None, registry_lister=None, roll=None)
    service.start()
    try:
        targets = [
            ScrapeTarget(0, vllm.url),
            ScrapeTarget(1, garbage.url),
            ScrapeTarget(2, failing.url),
            ScrapeTarget(3, closed_port_url()),
        ]
        seen = []
        scraper = EngineMetricsScraper(
            targets, service.push_snapshot, service.metrics, timeout_s=2.0, on_scrape=lambda *a: seen.append(a)
        )
        results = asyncio.run(scraper.scrape_once())
        assert results == {0: "ok", 1: "parse_error", 2: "http_error", 3: "unreachable"}
        assert sorted(seen, key=lambda a: a[0]) == [(0, VLLM), (2, None), (3, None)]  # a parse error is an answer
        snapshot, received_s = service.routing.snapshots[0]
        assert received_s == 100.0 and sorted(service.routing.snapshots) == [0]
        assert (snapshot.running_requests, snapshot.kv_capacity_blocks, snapshot.gpu) == (5, 2000, "a100")
        assert snapshot == service.routing.snapshot(0, snapshot_from_metrics(VLLM), ())  # as a POST would store it

        vllm.body = "garbage now"  # the engine's endpoint breaks: the last snapshot stays and ages
        now[0] = 105.0
        assert asyncio.run(scraper.scrape_once())[0] == "parse_error"
        assert service.routing.snapshots[0] == (snapshot, 100.0)
        assert scraper.results(0) == {"ok": 1, "parse_error": 1}
        text = service.metrics.render().decode()
        assert 'kvcost_snapshot_age_seconds{worker="0"} 5.0' in text
        assert 'kvcost_engine_scrapes_total{result="ok",worker="0"} 1.0' in text
        assert 'kvcost_engine_scrapes_total{result="parse_error",worker="0"} 1.0' in text
        assert 'kvcost_engine_scrapes_total{result="http_error",worker="2"} 2.0' in text
        assert 'kvcost_engine_scrapes_total{result="unreachable",worker="3"} 2.0' in text
        assert 'kvcost_engine_scrape_consecutive_failures{worker="0"} 1.0' in text
        assert 'kvcost_engine_scrape_consecutive_failures{worker="1"} 2.0' in text
        assert 'kvcost_engine_prefix_cache_hit_ratio{worker="0"} 0.25' in text
    finally:
        service.stop()


def test_a_slow_engine_times_out(servers):
    slow = servers(vllm_text())
    release = threading.Event()
    original = slow.server.RequestHandlerClass.do_GET

    def stall(handler):
        release.wait(5)
        try:
            original(handler)
        except (BrokenPipeError, ConnectionResetError):  # the scraper gave up and closed: what the test wants
            pass

    slow.server.RequestHandlerClass.do_GET = stall
    pushed = []
    scraper = EngineMetricsScraper([ScrapeTarget(0, slow.url)], lambda w, s: pushed.append(w), ServiceMetrics(), 1, 0.2)
    try:
        assert asyncio.run(scraper.scrape_once()) == {0: "timeout"} and pushed == []
    finally:
        release.set()


def scripted_transport(failures: list[Exception | None], calls: list[str]) -> httpx.MockTransport:
    """Answers each GET with the next scripted failure raised, or (None) a vLLM /metrics text."""

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(str(request.url))
        failure = failures.pop(0)
        if failure is not None:
            raise failure
        return httpx.Response(200, text=vllm_text())

    return httpx.MockTransport(handler)


@pytest.mark.parametrize(
    ("failures", "result", "calls"),
    [
        ([httpx.RemoteProtocolError("Server disconnected without sending a response."), None], "ok", 2),
        ([httpx.ReadError("connection reset"), None], "ok", 2),
        ([httpx.RemoteProtocolError("closed"), httpx.RemoteProtocolError("closed again")], "unreachable", 2),
        ([httpx.ConnectError("All connection attempts failed"), None], "unreachable", 1),
        ([httpx.ReadTimeout("slow"), None], "timeout", 1),
    ],
)
def test_a_stale_kept_alive_connection_is_retried_once_and_nothing_else_is(failures, result, calls):
    seen, pushed, urls = [], [], []
    scraper = EngineMetricsScraper(
        [ScrapeTarget(0, "http://engine/metrics")], lambda w, s: pushed.append(w), ServiceMetrics(),
        transport=scripted_transport(list(failures), urls), on_scrape=lambda *a: seen.append(a),
    )  # fmt: skip
    assert asyncio.run(scraper.scrape_once()) == {0: result}
    assert urls == ["http://engine/metrics"] * calls
    assert pushed == ([0] if result == "ok" else [])
    assert seen == [(0, VLLM if result == "ok" else None)]  # the liveness hook hears only the final outcome


def test_serve_scrapes_on_an_interval_and_scores_with_the_snapshot(tmp_path, servers):
    engine = servers(vllm_text())
    settings = ServiceSettings(
        db_path=tmp_path / "log.duckdb",
        segment_roll_interval_s=0,
        scrape=[f"7={engine.url}"],
        scrape_interval_s=0.05,
    )
    with TestClient(create_app(settings)) as client:
        scraper = client.app.state.engine_scraper
        deadline = time.monotonic() + 5.0
        while scraper.results(7).get("ok", 0) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert scraper.results(7).get("ok", 0) >= 2
        body = {
            "request": {"request_id": 1, "namespace": {"model": "m", "block_size_tokens": 16}, "token_ids": [1] * 64},
            "candidates": [{"worker_id": 7}],
        }
        scraped = client.post("/v1/score", json=body).json()["candidates"][0]
        inline = snapshot_from_metrics(VLLM).model_dump(mode="json")
        body["candidates"] = [{"worker_id": 7, "snapshot": inline}]
        sent = client.post("/v1/score", json=body).json()["candidates"][0]
        assert (scraped["snapshot"], sent["snapshot"]) == ("pushed", "inline")
        assert scraped["ttft_s"] == sent["ttft_s"] > 0.4  # 3 × 2,000 waiting prompt tokens ahead of it
    assert client.app.state.engine_scraper._task is None  # stopped with the app


def test_only_the_lines_read_reach_the_parser_and_the_reading_is_unchanged():
    buckets = "\n".join(
        f'vllm:e2e_request_latency_seconds_bucket{{engine="0",le="{le}",{MODEL}}} {i}'
        for i, le in enumerate(range(3000))
    )
    noisy = vllm_text() + "# TYPE vllm:e2e_request_latency_seconds histogram\n" + buckets + "\n"
    assert parse_engine_metrics(noisy) == parse_engine_metrics(vllm_text())
    assert "e2e_request_latency" not in wanted_lines(noisy) and "vllm:num_requests_running" in wanted_lines(noisy)


def test_a_gateways_scrape_notes_the_gateways_own_requests_as_they_stood(tmp_path, servers):
    engine = servers(vllm_text())  # 3 requests waiting and 5 running, over its two data-parallel engines
    now = [100.0]
    settings = ServiceSettings(db_path=tmp_path / "log.duckdb", segment_roll_interval_s=0, scrape=[f"0={engine.url}"])
    service = ScoringService(settings, clock=lambda: now[0], model_loader=None, registry_lister=None, roll=None)
    service.start()
    try:
        load = SentLoad()
        load.routed(1, worker_id=0, input_tokens=100, reusable_tokens=0)  # one of the 3 waiting is the gateway's
        liveness = EngineLiveness(service.directory, service.lock, service.clock, None)
        scraper = engine_scraper(settings, service, liveness, load)
        assert asyncio.run(scraper.scrape_once()) == {0: "ok"}
        stored, stored_at_s = service.routing.snapshots[0]
        load.finished(1)  # it ends before the next scrape: the page's copy of it is not counted
        snap = load.snapshot(0, "a100", stored, 16, stored_at_s)
        assert (stored_at_s, snap.waiting_requests, snap.running_requests) == (100.0, 2, 5)
    finally:
        service.stop()
