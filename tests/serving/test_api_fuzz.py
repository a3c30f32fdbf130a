"""Fuzz every operation of the API's own OpenAPI schema with schemathesis, every check, bounded examples.

The schema comes from ``app.openapi()`` (pure: building an app opens
nothing); the calls go in-process to an app whose log lives in a temporary
folder (schemathesis runs its lifespan). The app has a token file, given to
schemathesis, so that its auth checks see the write endpoints refuse a missing
or wrong token (the read endpoints need none, and the document says so).
schemathesis generates valid and invalid bodies, path parameters and headers,
and checks status codes, content types, response bodies and headers against
the document, that schema-invalid input is refused and schema-valid input
accepted.

What JSON Schema cannot state is allowed to be refused (422) although the
schema admits it: on ``/v1/score`` and ``/v1/route``, a candidate with no
snapshot (inline or pushed earlier), more block hashes than ``input_tokens``
holds blocks, ``input_tokens`` other than ``len(token_ids)``, no candidate
serving the request's namespace; on ``/v1/evict/rank``, a node created after
its last access or accessed after ``now_s``, a parent that is not a shallower
node of the list, more reused blocks than the request had.
"""

import json
import tempfile
from pathlib import Path

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.config import SchemathesisConfig

from kvcost.serving.api import create_app
from kvcost.serving.schemas import MAX_BLOCK_SIZE_TOKENS, MAX_COUNT, MAX_ID, MAX_SECONDS, MAX_TOKENS
from kvcost.serving.settings import ServiceSettings

pytestmark = pytest.mark.slow
MAX_EXAMPLES = 30
TOKEN = "fuzz-token"
CROSS_FIELD_RULES = {
    "operations": [
        {
            "include-path": ["/v1/score", "/v1/route", "/v1/evict/rank"],
            "checks": {"positive_data_acceptance": {"expected-statuses": ["2XX", "409", "422"]}},
        }
    ]
}


def _settings(folder: Path, **overrides) -> ServiceSettings:
    (folder / "token").write_text(TOKEN)
    fields = {"db_path": folder / "log.duckdb", "token_file": folder / "token", "segment_roll_interval_s": 0}
    return ServiceSettings(**(fields | overrides))


#: The fuzzed app's folder, removed when the test process exits.
_FOLDER = tempfile.TemporaryDirectory(prefix="kvcost-fuzz-")


def _schema():
    """The fuzzed app (its lifespan opens its log in a temporary folder at the first call) and its document."""
    app = create_app(_settings(Path(_FOLDER.name), max_body_bytes=2**20))
    return schemathesis.openapi.from_asgi("/openapi.json", app, config=SchemathesisConfig.from_dict(CROSS_FIELD_RULES))


schema = _schema()


@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
def test_every_schemathesis_check_passes(case):
    case.call_and_validate(headers={"Authorization": f"Bearer {TOKEN}"})


# Schema-valid bodies rarely satisfy the cross-field rules (one prompt form, a snapshot per candidate),
# so the scoring path itself is fuzzed with bodies that do, at the extremes of every limit.
seconds = st.floats(0, MAX_SECONDS, allow_nan=False)
count = st.integers(0, MAX_COUNT)
snapshots = st.fixed_dictionaries(
    {},
    optional={
        "gpu": st.sampled_from(["a100", "h100"]),
        "waiting_prefill": st.lists(st.tuples(st.integers(0, MAX_TOKENS), count), max_size=4),
        "running_requests": count,
        "decode_context_tokens": count,
        "kv_usage": st.floats(0, 1),
        "idle_cached_blocks": count,
        "recent_step_s": seconds,
        "step_remaining_s": seconds,
        "kv_capacity_blocks": count,
        "waiting_prompt_blocks": count,
        "oldest_waiting_s": seconds,
        "recent_step_nominal_s": seconds,
    },
)
bodies = st.fixed_dictionaries(
    {
        "request": st.fixed_dictionaries(
            {
                "request_id": st.integers(0, MAX_ID),
                "namespace": st.fixed_dictionaries(
                    {"model": st.text(min_size=1, max_size=8)},
                    optional={"block_size_tokens": st.integers(1, MAX_BLOCK_SIZE_TOKENS), "cache_salt": st.text()},
                ),
                "token_ids": st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=200),
            }
        ),
        "candidates": st.lists(
            st.fixed_dictionaries({"worker_id": st.integers(0, MAX_ID), "snapshot": snapshots}),
            min_size=1,
            max_size=6,
            unique_by=lambda c: c["worker_id"],
        ),
    }
)


def _no_non_finite(constant):
    raise AssertionError(f"non-finite number {constant} in a response")


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    db = tmp_path_factory.mktemp("fuzz-valid") / "log.duckdb"
    with TestClient(create_app(ServiceSettings(db_path=db, segment_roll_interval_s=0))) as c:
        yield c


@given(body=bodies)
@settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
def test_valid_bodies_score_and_route_with_finite_numbers(client, body):
    scored = client.post("/v1/score", json=body)
    assert scored.status_code == 200, scored.text
    json.loads(scored.text, parse_constant=_no_non_finite)
    routed = client.post("/v1/route", json=body)
    assert routed.status_code in (200, 409), routed.text  # 409: a request id drawn twice
