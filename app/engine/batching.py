"""The one batch runner: pictures in as uint8, batches of one shape, one forward each, results out.

Every caller that computes on pictures goes through here: the server's worker (captures), the
relevance and faithfulness requests, the Python API's `Scope`, the survey and ``headscope
extract``. What they used to do each in their own way is done once:

* **pictures in as uint8** ``[3, H, W]`` (the resized picture, what
  :class:`app.serving.preprocess.PreparedPixels` holds as ``raw``): a quarter of the bytes of the float
  input to copy to the device. On CUDA the host batch is pinned once and copied without
  blocking (:func:`to_device`); a picture already on the device is not copied at all.
* **normalised on the device** by a table (:func:`normal_table`): each channel's 256 levels
  normalised on the host with numpy, exactly as the host preparation always did
  (``(v / 255 - mean) / std`` in float32), and looked up on the device
  (:func:`normalise`). No arithmetic runs on the device, so the input is bit for bit the
  host's on every device (a device's division by a constant may multiply by its reciprocal).
* **batches grouped by shape**, at most ``batch_size`` each: :func:`groups` for pictures all
  at hand, :class:`Buckets` for pictures that arrive one by one (a stream being prepared).
* **the out-of-memory split** (:func:`split_on_oom`): a batch that runs out of memory frees
  what the caller can free and retries, else is split in halves; a batch that fails otherwise
  is rerun one picture at a time so that only the culprit gets the error.
* **the computations**: the capture (:meth:`BatchRunner.capture`), relevance
  (:meth:`BatchRunner.relevance`), the faithfulness test (:meth:`BatchRunner.faithfulness`) and
  zero-shot classification (:meth:`BatchRunner.zero_shot`), each the engine's own entry point
  (:func:`~app.engine.forward.forward_capture`, :func:`~app.engine.relevance.relevance`,
  :func:`~app.engine.faithfulness.faithfulness`, :func:`~app.engine.text_relevance.zero_shot`)
  under :func:`~app.engine.device.exact_fp32` (no TF32) with the precision asked for (fp32,
  or bf16/fp16 autocast).

The results (one per picture, in order) are built by the callers' one builder each:
``serving/answers.py`` for maps, ``serving/relevance.py`` for relevance and faithfulness.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any, Generic, TypeVar

import numpy as np
import torch

from .ablation import Ablation
from .capture_base import CapturedAttention
from .device import exact_computing, is_oom, precision_name, release_memory
from .model import LoadedModel

log = logging.getLogger(__name__)

T = TypeVar("T")


def normal_table(mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """``[3, 256]`` float32: channel ``c``'s level ``v`` normalised, ``(v / 255 - mean[c]) / std[c]``.

    Computed with numpy in float32, the very operations the host preparation applies to each
    pixel, so a lookup in this table gives exactly the host's values.
    """
    levels = np.arange(256, dtype=np.float32)[:, None] / 255.0  # 256, 1
    table = (levels - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)  # 256, 3
    return torch.from_numpy(np.ascontiguousarray(table.T))


def normalise(raw: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """uint8 pixels ``[..., 3, H, W]`` -> the model's normalised float32 input, on ``raw``'s device.

    Args:
        raw: uint8 RGB pixels, channels first.
        table: :func:`normal_table` of the model's mean and std (any device; moved to ``raw``'s).
    """
    if raw.dtype != torch.uint8:
        raise TypeError(f"normalise takes uint8 pixels; got {raw.dtype}")
    if raw.dim() < 3 or raw.shape[-3] != 3:
        raise ValueError(f"normalise takes [..., 3, H, W] pixels; got {tuple(raw.shape)}")
    if table.device != raw.device:
        table = table.to(raw.device)
    offsets = _OFFSETS.get(raw.device)
    if offsets is None:  # made once per device: three operators of every call otherwise
        offsets = _OFFSETS[raw.device] = torch.arange(3, device=raw.device, dtype=torch.int32).mul_(256).view(3, 1, 1)
    # index_select over the flat index: the same lookup as advanced indexing, ~40 % faster on the CPU
    idx = (raw.to(torch.int32) + offsets).flatten()
    return table.view(-1).index_select(0, idx).view(raw.shape)  # ..., 3, H, W


_OFFSETS: dict[torch.device, torch.Tensor] = {}  # per device, each channel's first row of a normal table, 3, 1, 1


def to_device(raws: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    """A batch ``[B, 3, H, W]`` of pictures of one shape, on ``device``.

    Pictures already there are stacked there (no trip to the host); host pictures are stacked
    on the host, pinned when the device is CUDA (once, the whole batch) and copied without
    blocking: the copy is ordered before the forward on the device's stream.
    """
    if all(r.device == device for r in raws):
        return torch.stack(list(raws))
    host = [r.cpu() for r in raws]
    if device.type == "cuda":
        x = torch.empty((len(host), *host[0].shape), dtype=host[0].dtype, pin_memory=True)  # B, 3, H, W
        # Stacked by numpy on this thread, straight into pinned memory: torch's stack (and
        # pin_memory's copy) start an OpenMP team, which waits for cores while the preparation
        # threads decode the next pictures on all of them (the first GPU run: 14 ms a batch of 16).
        np.stack([h.numpy() for h in host], out=x.numpy())
        return x.to(device, non_blocking=True)
    return torch.stack(host).to(device)


def device_input(
    lm: LoadedModel, pictures: torch.Tensor | Sequence[torch.Tensor], device: torch.device | str | None = None
) -> torch.Tensor:
    """One picture ``[3, H, W]`` (or a list of one shape) as the model's input ``[B, 3, H, W]``
    on ``device`` (default: the model's): uint8 normalised there, float32 taken as normalised."""
    dev = torch.device(device) if device is not None else model_device(lm)
    raws = [pictures] if isinstance(pictures, torch.Tensor) and pictures.dim() == 3 else list(pictures)
    x = to_device(raws, dev)
    if x.dtype != torch.uint8:
        return x.float()
    return normalise(x, normal_table(lm.mean, lm.std))


def groups(keys: Sequence[Hashable], size: int) -> list[list[int]]:
    """Indices of ``keys`` grouped by key (first seen first), in chunks of at most ``size``."""
    by_key: dict[Hashable, list[int]] = {}
    for i, k in enumerate(keys):
        by_key.setdefault(k, []).append(i)
    size = max(1, int(size))
    return [idx[j : j + size] for idx in by_key.values() for j in range(0, len(idx), size)]


class Buckets(Generic[T]):
    """Items grouped by key (input shape) as they arrive: what :func:`groups` does for items
    all at hand, for a stream that is still being prepared.

    :meth:`add` hands a bucket out as soon as it holds ``size`` items; :meth:`fullest` takes the
    part-filled bucket that holds most (a caller bounding how many items wait); :meth:`rest`
    empties what is left, in chunks of at most ``size``, first key seen first.
    """

    def __init__(self, size: int) -> None:
        self.size = max(1, int(size))
        self._by_key: dict[Hashable, list[T]] = {}

    def add(self, key: Hashable, item: T) -> list[T] | None:
        """Put ``item`` in its key's bucket; the bucket, taken out, when that makes it full."""
        bucket = self._by_key.setdefault(key, [])
        bucket.append(item)
        if len(bucket) < self.size:
            return None
        del self._by_key[key]
        return bucket

    def waiting(self) -> int:
        """How many items wait in part-filled buckets."""
        return sum(len(b) for b in self._by_key.values())

    def fullest(self) -> list[T]:
        """The bucket that holds most, taken out (the first such when several tie)."""
        key = max(self._by_key, key=lambda k: len(self._by_key[k]))
        return self._by_key.pop(key)

    def rest(self) -> Iterator[list[T]]:
        """Every bucket left, taken out, in chunks of at most ``size``."""
        while self._by_key:
            bucket = self._by_key.pop(next(iter(self._by_key)))
            for i in range(0, len(bucket), self.size):
                yield bucket[i : i + self.size]


class OutOfMemory(RuntimeError):
    """A single picture does not fit on the device (the server answers 503)."""


def split_on_oom(
    run: Callable[[list[T]], list[Any]],
    items: list[T],
    device: torch.device,
    *,
    free: Callable[[], int] | None = None,
    on_split: Callable[[int], None] | None = None,
    on_error: Callable[[BaseException], None] | None = None,
) -> list[Any]:
    """``run(items)``, one result per item; a failure stays with the item that caused it.

    Out of memory: ``free()`` (what the caller can give back, e.g. cached device captures; the
    bytes freed) is called once and the batch retried; then the batch is split in halves until
    it fits; a single item that still does not fit gets :class:`OutOfMemory`. Any other error
    of a batch reruns it one item at a time; a single item's error is its result.

    Args:
        run: computes a batch; returns one result per item.
        device: where it runs (its allocator's cache is emptied after an out-of-memory error).
        free: gives back cached device memory; returns the bytes freed.
        on_split: called with the batch size at each split (metrics).
        on_error: called with each single item's error (metrics, logs).
    """

    return _OomSplit(run, device, free, on_split, on_error).attempt(items, False)


class _OomSplit(Generic[T]):
    """:func:`split_on_oom`'s recursion, as methods: as nested functions it was a reference cycle
    (``attempt`` in its own closure) holding the caller's ``on_error`` and everything that closes
    over (the worker's batch: its pictures and their captures) until Python's rare full
    collection. A soak's heap in use grew by hundreds of MB of finished captures that way."""

    def __init__(
        self,
        run: Callable[[list[T]], list[Any]],
        device: torch.device,
        free: Callable[[], int] | None,
        on_split: Callable[[int], None] | None,
        on_error: Callable[[BaseException], None] | None,
    ):
        self.run, self.device, self.free, self.on_split, self.on_error = run, device, free, on_split, on_error

    def _try(self, batch: list[T]) -> tuple[list[Any] | None, Exception | None]:
        """The batch's results, or its error. Caught here, not in ``attempt``: the error's
        traceback starts at this frame, which does not keep it (``except … as`` drops the name),
        while a frame in its own error's traceback holding the error is a reference cycle, which
        holds the failed forward's tensors until a full collection."""
        try:
            out = self.run(batch)
            if len(out) != len(batch):
                raise RuntimeError(f"the batch gave {len(out)} results for {len(batch)} pictures")
            return out, None
        except Exception as e:
            return None, e

    def attempt(self, batch: list[T], freed: bool) -> list[Any]:
        out, error = self._try(batch)
        if out is not None:
            return out
        assert error is not None
        # Recovered outside the except block, the error's traceback dropped first: while it is
        # held, its frames hold the failed forward's tensors (activations, the capture's q, k, v
        # on the device), so emptying the allocator's cache freed nothing and the retry and the
        # halves ran beside them (PyTorch's FAQ: recover outside the except clause).
        if is_oom(error):
            error.__traceback__ = None  # the device's message stays
            evicted = 0 if freed or self.free is None else self.free()
            release_memory(self.device)
            if evicted:
                log.warning("out of memory at batch %d; freed %d cached bytes, retrying", len(batch), evicted)
                return self.attempt(batch, True)
            if len(batch) == 1:
                err = OutOfMemory("the image does not fit in device memory; try a smaller image")
                err.__cause__ = error  # the device's own message, for callers that record it
                return [self.failed(err)]
            if self.on_split is not None:
                self.on_split(len(batch))
            half = len(batch) // 2
            log.warning("out of memory at batch %d; splitting", len(batch))
            return self.attempt(batch[:half], freed) + self.attempt(batch[half:], freed)
        if len(batch) == 1:
            return [self.failed(error)]  # with its traceback, for the log
        # Isolate the culprit: rerun one at a time so batch-mates still get answers (the batch's
        # own error is not kept: each picture's rerun says its own).
        error.__traceback__ = None
        return [r for it in batch for r in self.attempt([it], freed)]

    def failed(self, e: BaseException) -> BaseException:
        if self.on_error is not None:
            self.on_error(e)
        return e


def model_device(lm: LoadedModel) -> torch.device:
    """Where ``lm``'s weights are (the CPU for a model without parameters)."""
    p = next(lm.model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


class BatchRunner:
    """One model's computations on batches of uint8 pictures.

    Args:
        lm: the loaded model (on its device).
        amp_dtype: None for fp32 (the default), ``torch.bfloat16`` or ``torch.float16`` (autocast).
        batch_size: most pictures in one forward.
        to: where captures go (None: where the forward ran; ``"cpu"``: host memory).

    The caller holds the model's lock (``lm.lock``) around a computation, as it always has.
    """

    def __init__(
        self,
        lm: LoadedModel,
        amp_dtype: torch.dtype | None = None,
        batch_size: int = 8,
        to: torch.device | str | None = None,
    ):
        self.lm = lm
        self.amp_dtype = amp_dtype
        self.batch_size = max(1, int(batch_size))
        self.to = to
        self.device = model_device(lm)
        self._table = normal_table(lm.mean, lm.std).to(self.device)

    @property
    def precision(self) -> str:
        """``fp32``, ``bf16`` or ``fp16``: what the answers' metadata says."""
        return precision_name(self.amp_dtype)

    def numerics(self) -> contextlib.ExitStack:
        """Around every computation: fp32 without TF32 and without the caller's autocast
        (:func:`~app.engine.device.exact_computing`; the engine's entry points autocast to
        ``amp_dtype`` themselves, where one is asked for)."""
        return exact_computing(self.device.type)

    # -- inputs ----------------------------------------------------------------------------
    def inputs(self, raws: Sequence[torch.Tensor] | torch.Tensor) -> torch.Tensor:
        """Pictures of one shape (a list of ``[3, H, W]`` or one ``[B, 3, H, W]``) -> the
        normalised input ``[B, 3, H, W]`` on the model's device.

        uint8 pictures are RGB levels, normalised here on the device; float32 ones are taken
        as the model's input already normalised (as the engine's functions take them).
        """
        if isinstance(raws, torch.Tensor):
            x = raws if raws.device == self.device else to_device(list(raws), self.device)
        else:
            x = to_device(raws, self.device)
        if x.dim() != 4:
            raise ValueError(f"a batch of pictures is [B, 3, H, W]; got {tuple(x.shape)}")
        if x.dtype != torch.uint8:
            return x.float()
        if self._table.device != x.device:  # the model moved since
            self._table = self._table.to(x.device)
        return normalise(x, self._table)

    def groups(self, shapes: Sequence[Hashable]) -> list[list[int]]:
        """Indices of pictures grouped by shape (or any key), at most ``batch_size`` each."""
        return groups(shapes, self.batch_size)

    def run(
        self,
        fn: Callable[[list[T]], list[Any]],
        items: list[T],
        *,
        free: Callable[[], int] | None = None,
        on_split: Callable[[int], None] | None = None,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> list[Any]:
        """``fn`` on one batch with the out-of-memory split (:func:`split_on_oom`)."""
        return split_on_oom(fn, items, self.device, free=free, on_split=on_split, on_error=on_error)

    # -- the computations --------------------------------------------------------------------
    def capture(
        self, raws: Sequence[torch.Tensor] | torch.Tensor, *, materialise: bool = False, ablate: Ablation = ()
    ) -> Sequence[CapturedAttention]:
        """The attention captures of a batch of one shape (one per picture, in order)."""
        from .forward import forward_capture

        x = self.inputs(raws)
        with self.numerics():
            return forward_capture(
                self.lm, x, materialise=materialise, amp_dtype=self.amp_dtype, to=self.to, ablate=ablate
            )

    def relevance(
        self,
        raws: Sequence[torch.Tensor] | torch.Tensor,
        target: Any,
        methods: Any,
        *,
        seed: int = 0,
        ablate: Ablation = (),
        start_layer: int | None = None,
        **kwargs: Any,
    ) -> list[Any]:
        """:func:`app.engine.relevance.relevance` of a batch of one shape (one per picture);
        ``start_layer``: chefer2021's (its ``chefer2021_start``; None: the engine's default);
        ``kwargs`` go to it as they are."""
        from .relevance import relevance

        if start_layer is not None:
            kwargs["chefer2021_start"] = start_layer
        x = self.inputs(raws)
        with self.numerics():
            return relevance(self.lm, x, target, methods, seed=seed, amp_dtype=self.amp_dtype, ablate=ablate, **kwargs)

    def faithfulness(
        self,
        raw: torch.Tensor,
        maps: dict[str, torch.Tensor],
        target: Any,
        fractions: Sequence[float] | str | None = None,
        *,
        ablate: Ablation = (),
        **kwargs: Any,
    ) -> Any:
        """:func:`app.engine.faithfulness.faithfulness` of one picture ``[3, H, W]``; ``kwargs``
        go to it as they are."""
        from .faithfulness import faithfulness

        x = self.inputs(raw[None] if raw.dim() == 3 else raw)[0]  # 3, H, W
        with self.numerics():
            return faithfulness(self.lm, x, maps, target, fractions, amp_dtype=self.amp_dtype, ablate=ablate, **kwargs)

    def zero_shot(self, raw: torch.Tensor, labels: list[str]) -> dict[str, Any]:
        """:func:`app.engine.text_relevance.zero_shot` of one picture ``[3, H, W]`` over ``labels``."""
        from .text_relevance import zero_shot

        x = self.inputs(raw[None] if raw.dim() == 3 else raw)  # 1, 3, H, W
        with self.numerics():
            return zero_shot(self.lm, x, labels, amp_dtype=self.amp_dtype)

    def faithfulness_many(
        self,
        raws: Sequence[torch.Tensor],
        maps: Sequence[dict[str, torch.Tensor]],
        targets: Sequence[Any],
        fractions: Sequence[float] | str | None = None,
        *,
        ablate: Ablation = (),
        protocol: str | None = None,
        progress: Callable[[int, int], None] | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> list[Any]:
        """The perturbation tests of several pictures (each ``[3, H, W]``, any sizes), their
        perturbed forwards stacked across pictures in batches of ``batch_size`` per input size
        (:func:`app.engine.faithfulness.run_tests`), with the out-of-memory split: one
        :class:`~app.engine.faithfulness.Faithfulness` per picture, or the error of that picture
        alone (a bad target, a picture that does not fit)."""
        from .faithfulness import DEFAULT_PROTOCOL, PerturbationTest, run_tests

        tests: list[Any] = []
        for raw, m, t in zip(raws, maps, targets, strict=True):
            try:
                x = self.inputs(raw[None] if raw.dim() == 3 else raw)[0]  # 3, H, W
                tests.append(
                    PerturbationTest(
                        self.lm,
                        x,
                        m,
                        t,
                        fractions,
                        batch_size=self.batch_size,
                        amp_dtype=self.amp_dtype,
                        ablate=ablate,
                        protocol=protocol or DEFAULT_PROTOCOL,
                    )
                )
            except Exception as e:  # that picture's own error (its target, its maps)
                tests.append(e)
        live = [t for t in tests if not isinstance(t, BaseException)]
        with self.numerics():
            results = iter(run_tests(live, self.batch_size, run=self.run, progress=progress, cancelled=cancelled))
        return [t if isinstance(t, BaseException) else next(results) for t in tests]
