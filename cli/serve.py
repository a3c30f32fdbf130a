"""``kvcost serve``: the scoring API on uvicorn; its options are :class:`ServiceSettings`' fields (``KVCOST_*`` too)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

import typer

from kvcost.cli.common import MlflowOpt, console, guard
from kvcost.cli.options import env_name, env_value, with_settings
from kvcost.cli.tables import SERVE
from kvcost.serving.settings import ServiceSettings


@with_settings(SERVE, parameter="make_settings", lazy=True)
def serve(
    make_settings: Callable[..., ServiceSettings],
    mlflow_uri: MlflowOpt = None,
    analytic_only: Annotated[
        bool, typer.Option(help="Score with the analytic model; do not contact the model registry.")
    ] = False,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
    access_log: Annotated[
        bool, typer.Option(help="uvicorn's line per HTTP request (every request is in the DuckDB log anyway).")
    ] = False,
    keep_alive_timeout_s: Annotated[
        float,
        typer.Option(
            min=1,
            help="Close a client's idle keep-alive connection after this long. Keep it above the clients' own "
            "pool expiry (httpx 5 s, aiohttp 15 s; Go's default is 90 s), so the client closes first.",
        ),
    ] = 75.0,
    head_timeout_s: Annotated[
        float, typer.Option(min=0.1, help="Close a connection whose request head has not arrived within this long.")
    ] = 10.0,
    body_timeout_s: Annotated[
        float, typer.Option(min=0.1, help="Close a connection whose request body has not arrived within this long.")
    ] = 60.0,
    limit_concurrency: Annotated[
        int,
        typer.Option(
            min=1, help="Answer 503 to new requests while this many connections or requests are open (uvicorn)."
        ),
    ] = 2048,
) -> None:
    """Run the scoring API (POST /v1/score, /v1/route, /v1/observe …) on uvicorn until interrupted.

    Every setting can also come from an environment variable KVCOST_<FIELD> (KVCOST_PORT=9000,
    KVCOST_GPU_DEFAULT=h100); an option given wins.

    The server runs on uvloop with the httptools parser: in front of a vLLM engine they
    cut the gateway's CPU per proxied request by about 15 % against asyncio and h11
    (docs/gateway.md). Idle client connections are kept for --keep-alive-timeout-s
    (75 s, not uvicorn's 5 s): a server that closes an idle connection as the client
    reuses it fails that request with a reset before it is read (httpx's pool also
    expires at 5 s, and a loaded event loop widens the window); a client-side expiry
    shorter than the server's avoids the race, as proxies advise for their upstreams.
    Raise it above 90 s for Go clients (their default idle timeout).

    Slow clients are bounded (kvcost.serving.http_protocol; uvicorn has no read
    timeouts): a request head must arrive within --head-timeout-s and its body
    within --body-timeout-s of the head, else the connection gets 408 and is
    closed; past --limit-concurrency open connections or requests, new requests
    get 503.
    """
    import uvicorn

    from kvcost.serving.api import create_app
    from kvcost.serving.http_protocol import timed_protocol

    def build() -> tuple[ServiceSettings, object]:
        settings = make_settings(**registry(mlflow_uri, analytic_only))
        return settings, create_app(settings)

    settings, api = guard(build, aliases=SERVE.renames)
    api.state.warm_heavy = True  # the first /v1/evict/rank must not wait for a worker process to start
    registry_text = settings.mlflow_uri or "none (analytic model)"
    auth = "bearer token required on write endpoints" if settings.token_file else "no token"
    reuse_dir = settings.reuse_model_dir
    reuse = f"reuse model {reuse_dir}" if reuse_dir else "eviction P(reuse): recency prior"
    console.print(
        f"kvcost serve on http://{settings.host}:{settings.port} — log {settings.db_path}, registry {registry_text}, "
        f"policy {settings.policy}, {reuse}, {auth}"
    )
    uvicorn.run(  # uvloop where installed (a dependency); httptools with read timeouts
        api, host=settings.host, port=settings.port, log_level=log_level, access_log=access_log,
        timeout_keep_alive=keep_alive_timeout_s, loop="auto",
        http=timed_protocol(head_timeout_s, body_timeout_s, limit_concurrency),
    )  # fmt: skip


def registry(mlflow_uri: str | None, analytic_only: bool) -> dict[str, str | None]:
    """The ``mlflow_uri`` setting of ``--mlflow-uri`` / ``--analytic-only``: None with ``--analytic-only``,
    else the option, else ``KVCOST_MLFLOW_URI`` (nothing passed), else the default store under ``runs/``."""
    from kvcost.models.mlflow_store import DEFAULT_TRACKING_URI

    if analytic_only:
        return {"mlflow_uri": None}
    if mlflow_uri:
        return {"mlflow_uri": mlflow_uri}
    if env_value(env_name(ServiceSettings, "mlflow_uri")) is not None:
        return {}
    return {"mlflow_uri": DEFAULT_TRACKING_URI}
