"""HTTP tests of kvcost.serving.api's bearer token: which endpoints need it, and the token file's checks."""

import pytest
from fastapi.testclient import TestClient

from kvcost.serving.api import create_app
from kvcost.serving.settings import ServiceSettings
from tests.serving.test_api import AUTH, TOKEN, make_body, settings_for


@pytest.fixture
def client(tmp_path):
    with TestClient(create_app(settings_for(tmp_path))) as c:
        yield c


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("post", "/v1/route", make_body()),
        ("post", "/v1/observe", {"request_id": 1, "ttft_s": 0.1}),
        ("post", "/v1/workers/1/snapshot", {}),
        ("post", "/v1/cost-models/reload", None),
    ],
)
def test_write_endpoints_need_the_bearer_token(client, method, path, body):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}, {"Authorization": "Basic x"}):
        response = client.request(method, path, json=body, headers=headers)
        assert response.status_code == 401, headers
        assert response.headers["www-authenticate"] == "Bearer"
    assert client.request(method, path, json=body, headers=AUTH).status_code != 401


def test_read_endpoints_need_no_token(client):
    assert client.post("/v1/score", json=make_body()).status_code == 200
    for path in ("/healthz", "/readyz", "/metrics", "/v1/cost-models", "/openapi.json"):
        assert client.get(path).status_code == 200, path


def test_without_token_file_write_endpoints_are_open(tmp_path):
    with TestClient(create_app(settings_for(tmp_path, token=False))) as client:
        assert client.post("/v1/route", json=make_body()).status_code == 200


def test_empty_or_missing_token_file_refused(tmp_path):
    (tmp_path / "empty").write_text(" \n")
    with pytest.raises(ValueError, match="is empty"):
        create_app(ServiceSettings(db_path=tmp_path / "log.duckdb", token_file=tmp_path / "empty"))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        create_app(ServiceSettings(db_path=tmp_path / "log.duckdb", token_file=tmp_path / "nope"))


def test_protect_reads_gates_the_read_endpoints_too(tmp_path):
    with TestClient(create_app(settings_for(tmp_path, protect_reads=True))) as client:
        assert client.post("/v1/score", json=make_body()).status_code == 401
        assert client.get("/v1/cost-models").status_code == 401
        assert client.post("/v1/score", json=make_body(), headers=AUTH).status_code == 200
        assert client.get("/v1/cost-models", headers=AUTH).status_code == 200
        assert client.get("/healthz").status_code == 200 and client.get("/metrics").status_code == 200
    with pytest.raises(ValueError, match="protect_reads = True needs token_file"):
        settings_for(tmp_path, token=False, protect_reads=True)
