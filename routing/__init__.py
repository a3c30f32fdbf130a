"""kvcost.routing: the embedded router, its policies, the cache directory and block hashing."""

from kvcost.routing.directory import CacheDirectory
from kvcost.routing.router import Router, RouterSettings

__all__ = ["CacheDirectory", "Router", "RouterSettings"]
