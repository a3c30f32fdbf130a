"""Server-sent events of OpenAI streams, as the gateway reads them while forwarding, and OpenAI's error shape.

An OpenAI stream (``"stream": true``) is a sequence of events ``data: <JSON
chunk>\\n\\n`` ended by ``data: [DONE]\\n\\n``; an error in the stream is a chunk
``{"error": {...}}``. The gateway forwards the engine's bytes event by event,
reading each chunk on the way for what it measures (the first token, the usage
with ``prompt_tokens_details.cached_tokens``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

DONE = b"[DONE]"


class OpenAIError(Exception):
    """An error the gateway answers in OpenAI's shape ``{"error": {message, type, param, code}}``.

    Args:
        status: HTTP status.
        message: what went wrong; names the engine when one is involved.
        kind: OpenAI's ``type`` (``invalid_request_error``, ``authentication_error``, ``engine_error`` …).
        param: the request field at fault, or None.
    """

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.param = param

    def body(self) -> dict[str, Any]:
        """The JSON body."""
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}

    def event(self) -> bytes:
        """The error as one stream event, followed by the end marker (what vLLM sends on an error mid-stream)."""
        return b"data: " + json.dumps(self.body()).encode() + b"\n\ndata: [DONE]\n\n"


@dataclass(slots=True)
class Event:
    """One event of a stream: its raw bytes (with the blank line), and its parsed chunk.

    Attributes:
        raw: the event's bytes as received, ending in the blank line.
        chunk: the JSON object of its ``data:`` line; None for ``[DONE]``, comments and unparsable data.
        done: the event is ``data: [DONE]``.
    """

    raw: bytes
    chunk: dict[str, Any] | None
    done: bool = False

    @property
    def has_choices(self) -> bool:
        """The chunk carries generated output (a non-empty ``choices`` list)."""
        return bool(self.chunk and self.chunk.get("choices"))


class EventReader:
    """Splits a byte stream into :class:`Event` objects (events end at a blank line, ``\\n\\n`` or ``\\r\\n\\r\\n``)."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[Event]:
        """The events completed by ``data`` (an incomplete tail is kept for the next call)."""
        self._buffer += data
        events = []
        while True:
            cut, width = _boundary(self._buffer)
            if cut < 0:
                return events
            raw, self._buffer = self._buffer[: cut + width], self._buffer[cut + width :]
            events.append(parse_event(raw))

    @property
    def pending(self) -> bytes:
        """Bytes received after the last complete event."""
        return self._buffer


def _boundary(buffer: bytes) -> tuple[int, int]:
    lf, crlf = buffer.find(b"\n\n"), buffer.find(b"\r\n\r\n")
    if crlf >= 0 and (lf < 0 or crlf < lf):
        return crlf, 4
    return lf, 2


def parse_event(raw: bytes) -> Event:
    """Parse one event's bytes: the concatenated ``data:`` lines as JSON (or ``[DONE]``)."""
    data = b"\n".join(
        line[5:].lstrip(b" ") for line in raw.replace(b"\r\n", b"\n").split(b"\n") if line.startswith(b"data:")
    )
    if data == DONE:
        return Event(raw, None, done=True)
    try:
        chunk = json.loads(data) if data else None
    except ValueError:
        chunk = None
    return Event(raw, chunk if isinstance(chunk, dict) else None)


def without_usage(event: Event) -> bytes | None:
    """``event`` as a client that did not ask for usage receives it: a usage-only chunk is dropped (None), and
    ``"usage": null`` removed from the others (the gateway asks the engine for usage to read the cached tokens)."""
    chunk = event.chunk
    if chunk is None or "usage" not in chunk:
        return event.raw
    if not chunk.get("choices"):
        return None
    trimmed = {k: v for k, v in chunk.items() if k != "usage"}
    return b"data: " + json.dumps(trimmed, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


def cached_tokens(usage: Any) -> int | None:
    """``usage.prompt_tokens_details.cached_tokens`` (vLLM with ``--enable-prompt-tokens-details``), or None."""
    if not isinstance(usage, dict):
        return None
    details = usage.get("prompt_tokens_details")
    value = details.get("cached_tokens") if isinstance(details, dict) else None
    return value if type(value) is int and value >= 0 else None


def completion_tokens(usage: Any) -> int | None:
    """``usage.completion_tokens``, or None."""
    value = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return value if type(value) is int and value >= 0 else None


def queue_time_s(answer: dict[str, Any]) -> float | None:
    """The engine's queue time of the request, seconds: vLLM's per-request ``metrics.queue_time_ms``
    (``--enable-per-request-metrics``; ``vllm/entrypoints/generate/base/protocol.py`` ``PerRequestMetrics``,
    arrival to first scheduled), or None."""
    metrics = answer.get("metrics")
    value = metrics.get("queue_time_ms") if isinstance(metrics, dict) else None
    if type(value) not in (int, float) or not 0 <= value < 1e9:
        return None
    return value / 1000.0
