"""kvcost.serving: the embedded router, the cache directory and (later) the scoring API."""

from kvcost.serving.directory import CacheDirectory, DirectoryMatch, Namespace
from kvcost.serving.router import Router, RouterSettings
from kvcost.serving.types import RouteDecision, RouteRequest, WorkerSnapshot

__all__ = [
    "CacheDirectory",
    "DirectoryMatch",
    "Namespace",
    "RouteDecision",
    "RouteRequest",
    "Router",
    "RouterSettings",
    "WorkerSnapshot",
]
