"""The ids of observations recorded without a decision (``unjoined_observations``), for idempotence."""

from __future__ import annotations

import asyncio
from collections import OrderedDict


class UnjoinedIds:
    """Ids of unjoined observations, newest last, at most ``max_ids`` (the oldest forgotten first).

    An id's state is ``False`` (unknown), the commit's future while its row is being written, or
    None once committed. Not thread-safe: the service's event loop owns it.
    """

    def __init__(self, max_ids: int) -> None:
        self.max_ids = max_ids
        self._ids: OrderedDict[int, asyncio.Future | None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._ids)

    def state(self, request_id: int) -> asyncio.Future | None | bool:
        """``False`` when unknown, the pending commit's future, or None once committed."""
        return self._ids.get(request_id, False)

    def committing(self, request_id: int, future: asyncio.Future) -> None:
        """The id's row is being written; ``future`` settles when it is."""
        self._ids[request_id] = future

    def failed(self, request_id: int) -> None:
        """The write failed: the id is unknown again (a retry may record it)."""
        del self._ids[request_id]

    def committed(self, request_id: int) -> None:
        """The id's row is in the log (also for ids reloaded after a restart)."""
        self._ids[request_id] = None
        self._ids.move_to_end(request_id)
        while len(self._ids) > self.max_ids:
            self._ids.popitem(last=False)
