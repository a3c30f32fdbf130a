"""Tests for kvcost.serving.gateway.tokenize's engine tokenizer against a real socket server (the local
tokenizer runs against the tiny model in tests/e2e)."""

import asyncio

from kvcost.serving.gateway.engine_http import engine_client
from kvcost.serving.gateway.tokenize import EngineTokenizer
from kvcost.serving.settings import ServiceSettings
from tests.serving.gateway.closing_server import ClosingServer


def test_the_engine_tokenizer_sends_again_when_the_engine_closes_a_reused_connection():
    server = ClosingServer(body=b'{"tokens": [5, 6, 7], "count": 3}', content_type="application/json")

    async def run() -> list[list[int]]:
        url = await server.start(path="")
        settings = ServiceSettings()
        client, fresh = engine_client(settings), engine_client(settings, fresh=True)
        try:
            tokenizer = EngineTokenizer(client, fresh, url)
            return [await tokenizer.completion_ids({"model": "tiny", "prompt": "a b c"}) for _ in range(2)]
        finally:
            await client.close()
            await fresh.close()
            server.server.close()

    assert asyncio.run(run()) == [[5, 6, 7], [5, 6, 7]]
    assert (server.connections, server.answered) == (2, 2)  # the second on a new connection
