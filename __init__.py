"""kvcost: an online learned cost model for cache-aware LLM request routing.

The repository root is the import package ``kvcost`` (see ``pyproject.toml``);
its packages, bottom layer first, are ``core``, ``features``, ``data``,
``calibration``, ``models``, ``eviction``, ``routing``, ``serving``, ``replay``
and the ``cli``, as laid out in ``docs/architecture.md``.
"""

__version__ = "0.1.0"
