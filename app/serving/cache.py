"""A byte-bounded LRU cache for uploads and their captured attention, and its key types.

Every field of a key is canonical: a request's parameters are resolved before they become a key
(the model's id, ``ablate`` as sorted ``(layer, head)`` pairs, the points a pruning curve really
has), so that two spellings of one question share one entry and one computation.

A key with a non-empty ``ablate`` field is one of many possible variants of its image (a capture,
an output, anything else computed with heads removed): the variants of one image, per key type,
may take at most ``max_variant_bytes`` of the cache, so that one client asking for many variants
of one image evicts that image's variants, not other people's uploads. A new key type gets this
by naming its fields ``image_id`` and ``ablate``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ImageKey:
    """An upload, by content hash."""

    image_id: str


@dataclass(frozen=True)
class DisplayKey:
    """The PNG of an upload shown on the page (``GET /api/v1/images/{id}``)."""

    image_id: str


@dataclass(frozen=True)
class PreparedKey:
    """An upload prepared for a model: its uint8 pixels at the input size (``pictures``: the
    preparation, every field of which decides the pixels)."""

    image_id: str
    pictures: Any


@dataclass(frozen=True)
class CaptureKey:
    """The capture of an image under a model, with heads removed (``ablate``: sorted
    ``(layer, head)`` pairs, empty for the model as it is)."""

    image_id: str
    model_id: str
    ablate: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class OutputKey:
    """The model's own output for an image with heads removed (``ablate`` as in CaptureKey)."""

    image_id: str
    model_id: str
    ablate: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class ImportanceKey:
    """Head importance of an image (``method``: ablation or gradient)."""

    image_id: str
    model_id: str
    method: str


@dataclass(frozen=True)
class PruningKey:
    """The pruning curve of an image: heads removed in ``method``'s order, ``points`` steps (the
    points the curve has: at most heads + 1, whatever the request asked for)."""

    image_id: str
    model_id: str
    method: str
    points: int


@dataclass(frozen=True)
class RelevanceKey:
    """Every relevance map of an image for one target (``target``: its normalised spelling, e.g.
    ``output``, ``box:0,0,8,8``; ``ablate`` as in CaptureKey). One forward and one backward give
    all the methods, so the key has none."""

    image_id: str
    model_id: str
    ablate: tuple[tuple[int, int], ...]
    target: str
    group: str = ""  # "": the methods of one forward and backward; else an LRP method, its own forward
    start_layer: int | None = None  # group chefer2021: the first layer of its product; else None


@dataclass(frozen=True)
class FaithfulnessKey:
    """The perturbation test of an image: ``methods`` sorted (the request's order is the
    answer's, not the key's), ``fractions`` as numbers, ``seed`` 0 unless ``random`` is tested."""

    image_id: str
    model_id: str
    ablate: tuple[tuple[int, int], ...]
    target: str
    methods: tuple[str, ...]
    fractions: tuple[float, ...]
    seed: int
    protocol: str = "live"
    start_layer: int | None = None  # chefer2021 tested: the first layer of its product; else None


class ByteLRU:
    """Least-recently-used mapping charged by the bytes its values keep alive.

    Values may share buffers: the captures of one batch are views of that forward's tensors.
    Such buffers are passed as ``shared={buffer_key: nbytes}`` and charged once, while at least
    one cached value uses them; the total is then what the cache really keeps alive, and
    evicting a value frees its shared buffers only with the last value that uses them.

    A key with a non-empty ``ablate`` belongs to the group of its image's variants of its type
    (an image's ablated captures): when a group's values take more than ``max_variant_bytes``
    (each charged its own bytes and all of its shared buffers), the group's least recently used
    values are evicted first, before anything else; the newest one always stays.

    Args:
        max_bytes: evict least-recently-used entries until the total fits this.
        on_change: called with (bytes, entries) after every change (metrics).
        max_variant_bytes: bytes each group of variants may take (None: no bound but the total).
    """

    def __init__(
        self,
        max_bytes: int,
        on_change: Callable[[int, int], None] | None = None,
        max_variant_bytes: int | None = None,
    ):
        self.max_bytes = max_bytes
        self.max_variant_bytes = max_variant_bytes
        self._data: OrderedDict[Hashable, tuple[Any, int, tuple[Hashable, ...]]] = OrderedDict()
        self._shared: dict[Hashable, list[int]] = {}  # buffer key -> [nbytes, values using it]
        self._groups: dict[Hashable, _Group] = {}  # variant group -> its values, least recently used first
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
            group = self._groups.get(_group_of(key))
            if group is not None:
                group.sizes.move_to_end(key)
            return item[0]

    def put(self, key: Hashable, value: Any, size: int, shared: Mapping[Hashable, int] | None = None) -> bool:
        """Store ``value``; returns False (and stores nothing) if it alone exceeds the limit.

        Args:
            size: bytes only this value holds.
            shared: buffers it may share with other values, ``{key: nbytes}``.
        """
        shared = dict(shared or {})
        with self._lock:
            if key in self._data:
                self._drop(key)
            if size + sum(shared.values()) > self.max_bytes:
                self._changed()
                return False
            self._data[key] = (value, size, tuple(shared))
            self._bytes += size
            for buf, n in shared.items():
                ref = self._shared.get(buf)
                if ref is None:
                    self._shared[buf] = [n, 1]
                    self._bytes += n
                else:
                    ref[1] += 1
            self._add_variant(key, size + sum(shared.values()))
            while self._bytes > self.max_bytes:
                self._drop(next(iter(self._data)))
            self._changed()
            return True

    def recharge(self, key: Hashable, size: int) -> bool:
        """Charge ``key``'s own bytes anew (a value that grew: memoised statistics); evicts
        least-recently-used entries, ``key`` last, until the total fits. False if it is gone."""
        with self._lock:
            item = self._data.get(key)
            if item is None:
                return False
            value, old, shared = item
            self._data[key] = (value, size, shared)
            self._bytes += size - old
            group = self._groups.get(_group_of(key))
            if group is not None:
                group.resize(key, group.sizes[key] + size - old)
                self._trim(group)
            while self._bytes > self.max_bytes and self._data:
                victim = next(iter(self._data))
                if victim == key and len(self._data) > 1:
                    self._data.move_to_end(key)
                    victim = next(iter(self._data))
                self._drop(victim)
            self._changed()
            return key in self._data

    def evict_where(self, predicate: Callable[[Any], bool]) -> int:
        """Drop every value for which ``predicate`` holds; returns the bytes that freed."""
        with self._lock:
            before = self._bytes
            for key in [k for k, (v, _, _) in self._data.items() if predicate(v)]:
                self._drop(key)
            self._changed()
            return before - self._bytes

    def _add_variant(self, key: Hashable, nbytes: int) -> None:
        """Count ``key`` in its group of variants, if it has one, and keep the group in bounds."""
        group_key = _group_of(key)
        if group_key is None:
            return
        group = self._groups.setdefault(group_key, _Group())
        group.resize(key, nbytes)
        self._trim(group)

    def _trim(self, group: _Group) -> None:
        """Evict a group's least recently used values while it is over its bound (the newest stays)."""
        while self.max_variant_bytes is not None and group.nbytes > self.max_variant_bytes and len(group.sizes) > 1:
            self._drop(next(iter(group.sizes)))

    def _drop(self, key: Hashable) -> None:
        _, size, shared = self._data.pop(key)
        self._bytes -= size
        group_key = _group_of(key)
        group = self._groups.get(group_key)
        if group is not None:
            group.remove(key)
            if not group.sizes:
                del self._groups[group_key]
        for buf in shared:
            ref = self._shared[buf]
            ref[1] -= 1
            if ref[1] == 0:
                del self._shared[buf]
                self._bytes -= ref[0]

    def _changed(self) -> None:
        if self._on_change:
            self._on_change(self._bytes, len(self._data))


class _Group:
    """The values of one group of variants, least recently used first, and the bytes they take."""

    def __init__(self) -> None:
        self.sizes: OrderedDict[Hashable, int] = OrderedDict()
        self.nbytes = 0

    def resize(self, key: Hashable, nbytes: int) -> None:
        self.nbytes += nbytes - self.sizes.get(key, 0)
        self.sizes[key] = nbytes
        self.sizes.move_to_end(key)

    def remove(self, key: Hashable) -> None:
        self.nbytes -= self.sizes.pop(key, 0)


def _group_of(key: Hashable) -> Hashable | None:
    """The group of variants ``key`` belongs to: its type and image when it has heads removed."""
    if not getattr(key, "ablate", None):
        return None
    return type(key).__name__, getattr(key, "image_id", None)
