"""kvcost: an online learned cost model for cache-aware LLM request routing.

The repository root is the import package ``kvcost`` (see ``pyproject.toml``);
its subpackages are ``data``, ``features``, ``models``, ``calibration``,
``serving`` and ``replay`` as laid out in DESIGN.md §3.
"""

__version__ = "0.1.0"
