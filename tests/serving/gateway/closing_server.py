"""A real socket server that closes a kept-alive connection as the next request arrives on it
(tests of the gateway's engine leg: tests/serving/gateway/test_engine_http.py, test_tokenize.py)."""

import asyncio


class ClosingServer:
    """An HTTP/1.1 server on a real socket that answers the first request of each connection and closes
    the connection when a second request arrives on it, unanswered: what an engine's keep-alive timeout
    does to a pooled connection at the moment it is reused. ``answer_none`` closes every connection so."""

    def __init__(self, answer_none: bool = False, body: bytes = b"ok", content_type: str = "text/plain") -> None:
        self.answer_none = answer_none
        self.body, self.content_type = body, content_type
        self.connections = 0
        self.answered = 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        served = 0
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:  # the client closed it
                break
            length = next(int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length"))
            await reader.readexactly(length)
            if served or self.answer_none:
                break
            served += 1
            self.answered += 1
            head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(self.body)}\r\nContent-Type: {self.content_type}\r\n\r\n"
            writer.write(head.encode() + self.body)
            await writer.drain()
        writer.close()

    async def start(self, path: str = "/v1/completions") -> str:
        """Listen on a free port; returns ``path``'s URL there (``path`` ``""``: the base URL)."""
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}{path}"
