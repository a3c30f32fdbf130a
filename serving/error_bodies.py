"""The service's one error body shape: ``{"detail": [{loc, msg, type}], "message": "<field>: <msg>"}`` (422).

Built here for the HTTP layer's exception handlers (:mod:`kvcost.serving.api`)
and for the endpoints that parse their body in a worker process
(:mod:`kvcost.serving.heavy`), so that both answer alike.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import TypeVar

from pydantic import BaseModel, ValidationError

ModelT = TypeVar("ModelT", bound=BaseModel)

#: Longest input value echoed back in a 422 (a 1M-token body must not come back whole).
MAX_ECHO_CHARS = 80


def error_message(loc: Sequence, msg: str) -> str:
    """``"<dotted field path>: <msg>"``, the path without its leading ``body``."""
    path = ".".join(str(p) for p in (loc[1:] if loc and loc[0] == "body" else loc))
    return f"{path}: {msg}" if path else msg


def error_entry(error: dict) -> dict:
    """One pydantic error as ``{loc, msg, type}``; a short scalar input is named in ``msg`` (never echoed whole)."""
    entry = {"loc": list(error.get("loc", ())), "msg": error.get("msg", ""), "type": error.get("type", "")}
    if entry["type"] == "json_invalid":  # FastAPI's loc ends with the character; pydantic's error names it
        position = entry["loc"][-1] if entry["loc"] else None
        why = error.get("ctx", {}).get("error", "")
        entry["msg"] = f"body is not valid JSON ({f'at character {position}: ' if type(position) is int else ''}{why})"
        entry["loc"] = ["body"]
        return entry
    entry["msg"] = entry["msg"].removeprefix("Value error, ")  # our validators' messages stand alone
    value = error.get("input")
    if isinstance(value, str | int | float | bool) and len(repr(value)) <= MAX_ECHO_CHARS:
        if repr(value) not in entry["msg"]:
            entry["msg"] = f"{entry['msg']}, got {value!r}"
    return entry


def validation_error_body(errors: Iterable[dict]) -> dict:
    """The 422 body of pydantic ``errors`` whose ``loc`` starts with ``body`` (as FastAPI's do)."""
    entries = [error_entry(e) for e in errors]
    message = error_message(entries[0]["loc"], entries[0]["msg"]) if entries else "invalid request"
    return {"detail": entries, "message": message}


def parse_json_body(raw: bytes, model: type[ModelT]) -> ModelT | bytes:
    """``raw`` validated as ``model`` by pydantic's JSON parser (every JSON body of the service is read this way,
    so that each error is worded alike), or the 422 error body (JSON bytes) naming each invalid field under
    ``body``. Nesting deeper than the parser's limit (about 200 levels) is such an error."""
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]
        return json.dumps(validation_error_body(errors)).encode()


def field_error_body(loc: Sequence, msg: str) -> dict:
    """The 422 body of one error at ``body.<loc>``."""
    full = ["body", *loc]
    return {"detail": [{"loc": full, "msg": msg, "type": "value_error"}], "message": error_message(full, msg)}
