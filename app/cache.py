"""A byte-bounded LRU cache for uploads and their captured attention."""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Callable, Hashable


class ByteLRU:
    """Least-recently-used mapping whose values are charged by a size function.

    Args:
        max_bytes: evict least-recently-used entries until the total fits this.
        on_change: called with (bytes, entries) after every change (metrics).
    """

    def __init__(self, max_bytes: int, on_change: Callable[[int, int], None] | None = None):
        self.max_bytes = max_bytes
        self._data: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._on_change = on_change

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._data)

    def get(self, key: Hashable) -> Any | None:
        with self._lock:
            item = self._data.get(key)
            if item is None:
                return None
            self._data.move_to_end(key)
            return item[0]

    def put(self, key: Hashable, value: Any, size: int) -> bool:
        """Store ``value``; returns False (and stores nothing) if it alone exceeds the limit."""
        with self._lock:
            if key in self._data:
                self._bytes -= self._data.pop(key)[1]
            if size > self.max_bytes:
                self._changed()
                return False
            self._data[key] = (value, size)
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, (_, s) = self._data.popitem(last=False)
                self._bytes -= s
            self._changed()
            return True

    def _changed(self) -> None:
        if self._on_change:
            self._on_change(self._bytes, len(self._data))
