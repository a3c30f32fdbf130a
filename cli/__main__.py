"""``python -m kvcost.cli``: the ``kvcost`` command."""

from kvcost.cli import app

app()
