"""kvcost.core: the floor every other package stands on.

Term composition, hardware and link models, operator profiles, the registry,
the routing types (``Namespace``, ``DirectoryMatch``, ``RouteRequest`` …) and
report helpers. It imports nothing else of kvcost.
"""
