"""Errors the scoring service raises and the HTTP layer maps to status codes (422, 409, 503)."""

from __future__ import annotations

from kvcost.data.log_writer import LogUnavailableError

__all__ = ["ConflictError", "FieldError", "LogUnavailableError"]


class FieldError(ValueError):
    """Input that passed the schema but is wrong given the service's state; the API answers 422 at ``loc``."""

    def __init__(self, loc: tuple[str | int, ...], message: str) -> None:
        super().__init__(f"{'.'.join(map(str, loc))}: {message}")
        self.loc = loc
        self.message = message


class ConflictError(RuntimeError):
    """A request id routed twice, or a table full (409)."""
