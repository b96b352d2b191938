"""``headscope.load()`` and `Scope`: the server's numbers in plain Python.

A `Scope` holds one model (a `LoadedModel`) on its device and
computes what the REST API answers, synchronously, with the server's own pieces: pictures are
prepared by `Pictures` (the one decode and resize path, early
reduction of large photos included), captured by `forward_capture`
(the one forward), read through `CapturedImage` and sliced by
`app.serving.answers`; the long computations run the server's works
(`importance_work`, ...) with `run_now`.
No worker thread, no asyncio, no HTTP; a list of pictures runs as batches on the model's device.
"""

from __future__ import annotations

import contextlib
import operator
import os
import time
from collections.abc import Generator, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn as nn

from ..config import Settings
from ..engine.ablation import refuse_windowed_ablation
from ..engine.batching import BatchRunner, Buckets
from ..engine.device import PRECISIONS, autocast_dtype, resolve_device
from ..engine.model import LoadedModel
from ..engine.relevance import DEFAULT_METHOD
from ..serving.pictures import Pictures
from ..serving.preprocess import ImageError
from . import params as P
from .computing import computing, numerics
from .inputs import (
    PICTURE_TYPES,
    PreparedPicture,
    TensorBatch,
    TensorPicture,
    is_many,
    is_tensor,
    named,
    own_levels,
    picture,
)

if TYPE_CHECKING:
    from ..serving.zero_shot import Labels
    from .result import Attention, FaithfulnessResult


class Scope:
    """One model, ready to answer what the REST API answers, in Python.

    Made by `load`. Every method takes a picture (a path, bytes, a ``PIL.Image``, an ``HxWx3``
    numpy array of uint8 0..255 or float 0..1, or a torch tensor of pixels ``[3, H, W]``) or a
    list of them, or a tensor
    ``[B, 3, H, W]`` (one result each, in order). A tensor holds RGB pixels, channels first,
    **not** the model's normalised input: ``uint8`` 0..255, or floating 0..1 (quantised to the
    256 levels, ``round(x * 255)``); other ranges, shapes and dtypes are refused
    (``ValueError`` / ``TypeError``). A tensor already at the model's planned input size is
    used on its device (a CUDA tensor's forward runs on it, not on a copy made on the host; its
    ``image_id``, a hash of its pixels, is read from one host copy of the uint8 levels, made when
    a result's id is first needed: at once for every call but ``attention``); see
    `app.python.inputs`.

    Args:
        lm: the loaded model.
        settings: decoding limits and how pictures are resized (the server's ``Settings``).
        precision: ``fp32`` (the default: exact, no TF32), ``bf16`` or ``fp16`` (autocast on the
            model's device), ``auto`` (bf16/fp16 on CUDA, fp32 elsewhere). Every result says
            which it was computed in (``precision``).
        batch_size: most pictures per forward when a list is given; None: the server's batch
            size for the model's device (``settings.batching``: 64 on CUDA, 8 on the CPU and MPS).
    """

    def __init__(self, lm: LoadedModel, settings: Settings, precision: str = "fp32", batch_size: int | None = None):
        self.lm = lm
        self.settings = settings
        self.device = _device_of(lm.model)
        self.amp_dtype = autocast_dtype(self.device.type, precision)
        size = _batch_size(batch_size)
        self.batch_size = size if size is not None else settings.batching(self.device.type)[0]
        self.pictures = Pictures.for_model(lm, settings)
        self.runner = BatchRunner(lm, self.amp_dtype, self.batch_size)
        # what it computes in, ``auto`` resolved for the device (the name every result carries)
        self.precision = self.runner.precision

    # -- what it is -----------------------------------------------------------------------
    @property
    def model(self) -> nn.Module:
        """The timm module itself (Headscope's hooks are attached only while it computes)."""
        return self.lm.model

    @property
    def id(self) -> str:
        """The model's id, as answers and figures name it."""
        return self.lm.id

    def info(self) -> dict[str, Any]:
        """What ``GET /api/v1/models`` says of the model (layers, heads, patch and input size, ...)."""
        return {"id": self.lm.id, **self.lm.info()}

    def __repr__(self) -> str:
        lm = self.lm
        return (
            f"<headscope.Scope {lm.id!r}: {lm.arch}, {lm.num_layers} layers x {lm.num_heads} heads, "
            f"patch {lm.patch_size[0]}x{lm.patch_size[1]}, output {lm.output_kind}, on {self.device}>"
        )

    # -- pictures -------------------------------------------------------------------------
    def _read(self, image: Any) -> list[PreparedPicture]:
        """Read and prepare one picture or a list (one ``PreparedPicture`` each); errors name the item.

        The pictures of a list are decoded and resized in parallel (a thread pool the size of
        the machine's cores: Pillow releases the GIL), each exactly as alone.
        """
        items: dict[int, PreparedPicture] = {}
        for prepared in self._stream(image):
            items.update(prepared)
        return [items[i] for i in range(len(items))]

    def _stream(self, image: Any) -> Generator[dict[int, PreparedPicture], None, None]:
        """The prepared pictures of one picture or a list in batches of one input size (index ->
        picture), each batch yielded as soon as its pictures are prepared: the caller's forward of
        one batch runs while the thread pool prepares the next.

        A batch holds at most ``batch_size`` pictures. Where the model computes on another device
        than the pool's (CUDA, MPS) and the pictures must be decoded, a batch holds at most a
        quarter of the list (and no fewer than the pool's threads), so that preparation and the
        forwards overlap; on the CPU, and for tensors (nothing to decode), batches are as large
        as ``batch_size`` allows. An error names its item and stops the pool's other work.
        """
        many = is_many(image)
        if is_tensor(image):
            # The pictures as they are now, one copy where they are; their host copy and ids
            # only when a result reads them.
            tensors = TensorBatch(own_levels(image), _cores())
            items: list[Any] = tensors.pictures()
            if self.pictures.fit(tensors.W, tensors.H) == (tensors.W, tensors.H):
                # Nothing to prepare: the batches at once (each a view of that copy: no other).
                for s in range(0, len(items), self.batch_size):
                    yield {
                        i: PreparedPicture(p, p.prepared(self.pictures))
                        for i, p in enumerate(items[s : s + self.batch_size], s)
                    }
                return
        else:
            items = list(image) if many else [image]
        if many and not items:
            raise ValueError(f"an empty list of pictures; give {PICTURE_TYPES}, or a list of them")

        def one(i: int) -> PreparedPicture:
            try:
                prepared = self._prepare(items[i])
                if not isinstance(prepared.picture, TensorPicture):
                    # The id here, beside the decode, not on the caller's thread when the result
                    # is made: a PIL image's is a hash of its pixels (a millisecond for a photo),
                    # which held a list of images to 0.4x the speed of their preparation.
                    # A tensor's stays lazy (its host copy would wait for the device).
                    prepared.picture.image_id  # noqa: B018  # computed and cached
                return prepared
            except (TypeError, ValueError) as e:  # an ImageError too
                if not many:
                    raise
                raise named(e, f"pictures[{i}]") from None

        if len(items) == 1:
            yield {0: one(0)}
            return
        # One object given several times is prepared once (a PIL image is not safe to decode
        # from two threads at once); its results share the prepared picture.
        first = {id(it): i for i, it in reversed(list(enumerate(items)))}
        todo = sorted(set(first.values()))
        threads = min(len(todo), _cores())
        size = self.batch_size
        if self.device.type != "cpu" and not all(isinstance(it, TensorPicture) or is_tensor(it) for it in items):
            size = min(size, max(threads, -(-len(items) // 4)))
        pool = ThreadPoolExecutor(threads, thread_name_prefix="headscope-prepare")
        try:
            futures = {i: pool.submit(one, i) for i in todo}
            buckets: Buckets[tuple[int, PreparedPicture]] = Buckets(size)
            for i, it in enumerate(items):
                prepared = futures[first[id(it)]].result()
                full = buckets.add(tuple(prepared.prep.raw.shape), (i, prepared))
                if full is not None:
                    yield dict(full)
            for rest in buckets.rest():
                yield dict(rest)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def _prepare(self, item: Any) -> PreparedPicture:
        if isinstance(item, TensorPicture):  # a picture of a tensor batch, to be resized
            pic: Any = item
        elif is_tensor(item):
            if item.dim() != 3:
                raise ValueError(f"a tensor in a list is one picture [3, H, W]; got {tuple(item.shape)}")
            # 3, H, W uint8 on its device, as it is now (a copy: the caller's buffer may change)
            pic = TensorPicture(own_levels(item)[0])
        else:
            pic = picture(item, self.settings.max_upload_bytes)
        try:
            return PreparedPicture(pic, pic.prepared(self.pictures))
        except ImageError as e:
            if not isinstance(item, (str, os.PathLike)):
                raise
            raise named(e, item) from None  # a file that is not a picture: its message names the file

    def computing(self, lock: bool = True) -> contextlib.AbstractContextManager[None]:
        """The model in eval mode while Headscope computes (see `computing`)."""
        return computing(self.lm, lock)

    def _raws(self, batch: Mapping[int, PreparedPicture], idx: list[int]) -> list[torch.Tensor] | torch.Tensor:
        """The uint8 pixels of ``batch[i]`` for ``i`` in ``idx`` (a streamed batch): a view of their
        `TensorBatch` where they are its consecutive pictures as they are (no stack to copy
        them again), else one tensor each."""
        raws = [batch[i].prep.raw for i in idx]
        pic = batch[idx[0]].picture
        if isinstance(pic, TensorPicture) and pic._batch is not None:
            tensors, start, end = pic._batch, pic._index, pic._index + len(raws)
            if end <= len(tensors.levels) and all(r is lv for r, lv in zip(raws, tensors.levels[start:end])):
                return tensors.batch[start:end]
        return raws

    # -- attention ------------------------------------------------------------------------
    def attention(
        self,
        image: Any,
        query: Any = None,
        layers: Any = None,
        heads: Any = None,
        temperature: float = 1.0,
        ablate: Any = None,
        *,
        aggregate: str = "none",
        drop: str = "none",
        rollout_start: int | None = None,
        head_fusion: str = "mean",
        discard_ratio: float = 0.0,
        keep_capture: bool = False,
    ) -> Attention | list[Attention]:
        """The softmax attention of one picture (or of each picture of a list), as the API answers it.

        The parameters are those of ``POST /api/v1/attention`` (the same grammar, the same
        validation, the same messages), in Python spellings too.

        Args:
            image: a picture (a path, bytes, a ``PIL.Image``, an ``HxWx3`` array or a tensor
                ``[3, H, W]`` of pixels: uint8 0..255 or float 0..1, not the model's normalised
                input), a list of them, or a tensor ``[B, 3, H, W]``: one result each.
            query: None (the CLS row; on a model without a CLS token, SigLIP or Swin, the
                first patch's), ``"cls"``, ``"all"``, a token index, a grid cell ``(row, col)``,
                lists of either (cells also as ``[row, col]`` lists or an ``N x 2`` array), or
                the API's text (``"patch:3,5"``, ``"0,17"``).
            layers: None (every layer), an int, ints, or the API's text (``"0-3,-1"``). A
                windowed model (Swin) answers within one stage: None gives every stage
                (``Attention.maps`` is then a list, one tensor per stage), explicit layers must
                be of one stage.
            heads: None (every head), an int, ints, or text (counted within a Swin stage).
            temperature: every map is ``softmax(scores / temperature)``; 1 is the model itself.
            ablate: heads removed first: ``(layer, head)`` pairs or the text ``"0:1,11:5"``.
            aggregate: ``none``, ``mean``, ``max`` (over the heads) or ``rollout``.
            drop: ``none``, ``prefix``, ``artifacts`` or ``prefix,artifacts``: key tokens zeroed
                and rows renormalised.
            rollout_start: the rollout's first layer (default: 0; on a windowed model, the
                first layer of the selected stage).
            head_fusion: how the rollout fuses heads: ``mean``, ``max`` or ``min``.
            discard_ratio: the share of each row's smallest weights the rollout sets to 0.
            keep_capture: keep each picture's capture (every layer's q and k, megabytes) with
                its result; by default a result keeps its maps, their metadata and the picture's
                bytes, and computes the capture again when `select`, `stats`, `explain` or the
                widget first need it.

        Returns:
            An `Attention`, or a list of them for a list of pictures.

        Raises:
            ValueError: a bad parameter or picture, with the API's 4xx message.
            TypeError: an argument of the wrong type.
        """
        from .result import PendingAttention, batch_maps, batch_selections, found_of

        fields = dict(
            layers=P.indices(layers, "layers"),
            heads=P.indices(heads, "heads"),
            query=P.query(query),
            temperature=temperature,
            ablate=P.ablate(ablate),
            aggregate=aggregate,
            drop=drop,
            rollout_start=rollout_start,
            head_fusion=head_fusion,
            discard_ratio=discard_ratio,
        )
        from ..serving.params import AttentionParams

        params = P.build(AttentionParams, **fields)
        pairs = self.lm.ablation(params.ablate)
        every_stage = self.lm.windowed and layers is None
        results: dict[int, Attention] = {}
        many = is_many(image)
        templates: dict[tuple, Any] = {}  # what batch-mates' metadata share (AskedPart)

        def finish(waits: list[Any], pending: dict[int, PendingAttention], tensors: list[Any]) -> None:
            for wait in waits:
                wait()
            with _Naming(-1, many) as naming:  # one for the batch: this loop is what waits for the device
                for (i, asked), tensor in zip(pending.items(), tensors):
                    naming.i = i
                    results[i] = asked.answer(tensor)

        last: tuple[list[Any], dict[int, PendingAttention], list[Any]] | None = None
        # Each batch is computed as soon as it is prepared, while the pool prepares the next;
        # closing(): a failing batch stops the pool at once, whatever still holds the generator.
        with contextlib.closing(self._stream(image)) as batches:
            for batch in batches:
                idx = list(batch)
                input_size = batch[idx[0]].prep.input_size
                materialise = params.needs_every_row and self.lm.keeps_maps(input_size)

                def capture(ids: list[int], materialise: bool = materialise, batch: dict = batch) -> list[Any]:
                    raws = self._raws(batch, ids)
                    return list(self.runner.capture(raws, materialise=materialise, ablate=pairs))

                with self.computing():
                    atts = _raised(self.runner.run(capture, idx))
                    founds = [found_of(self.lm, batch[i], att, self.runner.precision) for i, att in zip(idx, atts)]
                    # The batch's maps in one product per layer (not image by image) and one copy
                    # out, only started: on a GPU the forward and the products still run while
                    # each result is prepared below, and the results wait for the copy once.
                    waits: list[Any] = []
                    sels: list[Any] = [None] * len(founds)
                    tensors: list[Any] = [None] * len(founds)
                    if not every_stage:  # Swin asked for every layer: one answer per stage, each alone
                        sels = batch_selections(founds, params)
                        tensors = batch_maps(founds, sels, waits)
                pending: dict[int, PendingAttention] = {}
                for i, found, sel in zip(idx, founds, sels):
                    with _Naming(i, many):
                        pending[i] = PendingAttention(
                            self.lm,
                            self.settings,
                            batch[i],
                            found,
                            params,
                            pairs,
                            every_stage,
                            self.amp_dtype,
                            keep_capture,
                            sel,
                            templates,
                        )
                # The batch before is finished only now, its maps long copied out: on a GPU its
                # results are made while this batch's forward runs, and the forwards follow
                # each other without the device waiting for the host in between (the price: two
                # batches' captures are alive at once).
                # Maps not made with batch-mates (a batch of one) are made in finish: fp32 there too.
                if last is not None:
                    with numerics(self.lm):
                        finish(*last)
                last = (waits, pending, tensors)
            if last is not None:
                with numerics(self.lm):
                    finish(*last)
        out = [results[i] for i in sorted(results)]
        return out if many else out[0]

    # -- the model's output, ablation, importance -----------------------------------------
    def output(self, image: Any, ablate: Any = None) -> dict[str, Any] | list[dict[str, Any]]:
        """The model's own output (``GET …/output``): saliency, classes or embedding, and with
        ``ablate`` its change against the unablated output. Arrays are torch tensors.

        Args:
            image: a picture (a path, bytes, a ``PIL.Image``, an ``HxWx3`` array or a tensor
                ``[3, H, W]`` of pixels: uint8 0..255 or float 0..1, not the model's normalised
                input), a list of them, or a tensor ``[B, 3, H, W]``: one result each.
        """
        from ..engine.output import describe
        from ..serving.ablation import Output, output_meta, outputs

        pairs = self.lm.ablation(P.ablate(ablate))
        items = self._read(image)
        res = []
        for it in items:
            with self.computing(lock=False):  # outputs() takes the model's lock
                base_t, out_t = outputs(self.lm, it.prep.raw, [(), pairs], self.amp_dtype, self.device)
            base = Output(base_t, it.prep.input_size, it.prep.image_size)
            out = Output(out_t, it.prep.input_size, it.prep.image_size)
            meta = output_meta(it.image_id, self.lm, pairs, base, out, False, self.runner.precision)
            meta["output"] = _tensors(describe(self.lm, out.tensor))
            res.append(meta)
        return res if is_many(image) else res[0]

    def importance(self, image: Any, method: str = "ablation") -> dict[str, Any] | list[dict[str, Any]]:
        """Every head's importance (``GET …/importance``): ``importance`` ``[layers, heads]``.

        Args:
            image: a picture (a path, bytes, a ``PIL.Image``, an ``HxWx3`` array or a tensor
                ``[3, H, W]`` of pixels: uint8 0..255 or float 0..1, not the model's normalised
                input), a list of them, or a tensor ``[B, 3, H, W]``: one result each.
            method: ``ablation`` (exact: the output change with each head removed alone) or
                ``gradient`` (Michel et al.'s ``|d loss / d m_h|``, one forward and backward).
        """
        from ..serving.params import ImportanceQuery

        method = P.build(ImportanceQuery, method=method).method
        refuse_windowed_ablation(self.lm.windowed, "importance")
        res = [self._importance(it, method) for it in self._read(image)]
        return (
            [_arrays(r, ("importance", "kl")) for r in res] if is_many(image) else _arrays(res[0], ("importance", "kl"))
        )

    def _importance(self, it: PreparedPicture, method: str) -> dict[str, Any]:
        from ..serving.ablation import importance_work
        from ..serving.tasks import TaskProgress, run_now

        with self.computing(lock=False):  # each piece takes the model's lock
            work = importance_work(
                it.image_id, self.lm, it.prep, method, TaskProgress("importance"), self.amp_dtype, self.device
            )
            return run_now(work)

    def pruning(
        self, image: Any, method: str = "ablation", points: int | None = None
    ) -> dict[str, Any] | list[dict[str, Any]]:
        """The pruning curve (``GET …/pruning``): heads removed least important first, the
        output change after each step (``change``); the importance by ``method`` first.

        Args:
            image: a picture (a path, bytes, a ``PIL.Image``, an ``HxWx3`` array or a tensor
                ``[3, H, W]`` of pixels: uint8 0..255 or float 0..1, not the model's normalised
                input), a list of them, or a tensor ``[B, 3, H, W]``: one result each.
        """
        from ..serving.ablation import pruning_work
        from ..serving.params import PruningQuery
        from ..serving.tasks import TaskProgress, run_now

        asked = P.build(PruningQuery, method=method, **({} if points is None else {"points": points}))
        method, points = asked.method, asked.points
        refuse_windowed_ablation(self.lm.windowed, "pruning")
        res = []
        for it in self._read(image):
            ranking = self._importance(it, method)
            with self.computing(lock=False):  # each piece takes the model's lock
                work = pruning_work(
                    it.image_id, self.lm, it.prep, ranking, points, TaskProgress("pruning"), self.amp_dtype, self.device
                )
                res.append(_arrays(run_now(work), ("change", "kl")))
        return res if is_many(image) else res[0]

    # -- relevance and faithfulness -------------------------------------------------------
    def relevance(
        self,
        image: Any,
        method: str = DEFAULT_METHOD,
        target: str | None = None,
        ablate: Any = None,
        start_layer: int | None = None,
        seed: int = 0,
    ) -> dict[str, Any] | list[dict[str, Any]]:
        """A relevance map for one scalar of the model's output (Chefer et al. 2021 and baselines).

        Args:
            image: a picture (a path, bytes, a ``PIL.Image``, an ``HxWx3`` array or a tensor
                ``[3, H, W]`` of pixels: uint8 0..255 or float 0..1, not the model's normalised
                input), a list of them, or a tensor ``[B, 3, H, W]``: one result each.
            method: ``chefer`` (the GAE rule, ICCV 2021), ``grad_attention``, ``rollout``,
                ``attention``, ``random``, ``chefer2021`` (the CVPR 2021 rule: LRP x gradient,
                rolled out), ``attnlrp`` (AttnLRP, ICML 2024; signed) or ``legrad`` (a phrase on
                a CLIP model).
            target: ``output`` / ``box:X0,Y0,X1,Y1`` (saliency), ``top`` / ``class:N``
                (classes), ``embedding``, ``text:PHRASE`` (CLIP-style models: the model's score
                of the picture against the phrase; the answer adds ``text_tokens``); None for the
                model's default.
            ablate: heads removed first.
            start_layer: ``chefer2021`` only: the first layer of its product, ``0..L-1`` (None:
                1, the authors' evaluation's; negative values are not counted from the end).
            seed: the seed of the ``random`` map (0 to 2**31 - 1; the API's ``seed=``); with another
                method it changes nothing (the answer's ``seed`` is then None), as in the API.

        Returns:
            ``relevance`` (``[rows, cols]`` on the patch grid, summing to 1), ``method``,
            ``target``, ``y`` (the target's value), ``grid``, ``start_layer`` (chefer2021's,
            else None) and the map's metadata.

        Raises:
            StartLayerError: ``start_layer`` with another method, or not a layer of the model
                (code ``bad_start_layer``, as the REST API's 422).
        """
        from ..engine.relevance import refuse_windowed_relevance, resolve_start_layer
        from ..engine.text_relevance import parse_method
        from ..serving.relevance import method_map, relevance_meta

        refuse_windowed_relevance(self.lm)
        name = parse_method(method, target, self.lm)
        start = resolve_start_layer(start_layer, (name,), self.lm.num_layers)
        drawn = P.seed(seed)
        pairs = self.lm.ablation(P.ablate(ablate))
        out: dict[int, dict[str, Any]] = {}
        with contextlib.closing(self._relevance(image, target, [name], pairs, start)) as parts:
            for batch, maps in parts:
                for (i, it), m in zip(batch.items(), maps):
                    meta = relevance_meta(it.image_id, self.lm, m, name, drawn, pairs)
                    out[i] = {**meta, "methods": {name: meta["method_text"]}, "relevance": method_map(m, name, drawn)}
        res = [out[i] for i in sorted(out)]
        return res if is_many(image) else res[0]

    def faithfulness(
        self,
        image: Any,
        methods: Any = None,
        target: str | None = None,
        fractions: Any = None,
        ablate: Any = None,
        protocol: str | None = "live",
        start_layer: int | None = None,
        seed: int = 0,
    ) -> FaithfulnessResult | list[FaithfulnessResult]:
        """The perturbation test of each method's relevance map: remove the most (``positive``)
        or least (``negative``) relevant patches and watch the target; the curves and their AUC.

        Args:
            image: a picture (a path, bytes, a ``PIL.Image``, an ``HxWx3`` array or a tensor
                ``[3, H, W]`` of pixels: uint8 0..255 or float 0..1, not the model's normalised
                input), a list of them, or a tensor ``[B, 3, H, W]``: one result each.
            methods: names (``["chefer", "attention", "random"]`` or ``"chefer,random"``); None: all.
            target: as for `relevance`.
            fractions: the fractions of patches removed (default 0, 0.1, ..., 0.9).
            ablate: heads removed first (maps and perturbed forwards alike).
            protocol: ``live`` (patches, mean-colour fill, the score's ratio; also None or
                ``""``) or ``paper`` (Chefer et al. 2021: pixels, black fill, top-1 hits, AUC in
                percent; class targets only), spelt exactly so: anything else is a
                ``ProtocolError`` (``bad_protocol``, as the REST API's 422).
            start_layer: ``chefer2021``'s first layer, as for `relevance`; only with
                ``chefer2021`` among the methods (``StartLayerError`` otherwise).
            seed: the seed of the ``random`` map, as for `relevance`.

        Returns:
            The API's answer as a dict (``methods``: curves and AUCs) whose ``verdicts``
            attribute (and key) says, per method, whether it beat the random map on both
            curves, one or neither, and by how much; its ``repr`` prints that in words.
        """
        from ..engine.faithfulness import check_protocol, parse_fractions, parse_protocol
        from ..engine.relevance import parse_target, refuse_windowed_relevance, resolve_start_layer
        from ..engine.text_relevance import parse_target_methods
        from ..serving.relevance import FaithfulnessSpec, faithfulness_result, method_map
        from .result import FaithfulnessResult

        refuse_windowed_relevance(self.lm)
        names = parse_target_methods(methods, target, self.lm)
        fracs = parse_fractions(fractions)
        proto = parse_protocol(protocol)
        check_protocol(proto, self.lm, parse_target(target, self.lm))
        start = resolve_start_layer(start_layer, names, self.lm.num_layers)
        drawn = P.seed(seed)
        pairs = self.lm.ablation(P.ablate(ablate))
        prepared: dict[int, PreparedPicture] = {}
        maps_of: dict[int, Any] = {}
        with contextlib.closing(self._relevance(image, target, names, pairs, start)) as parts:
            for batch, maps in parts:
                prepared.update(batch)
                maps_of.update(zip(batch, maps))
        order = sorted(prepared)
        items = [prepared[i] for i in order]
        found = [maps_of[i] for i in order]
        # every picture's perturbed forwards stacked across pictures (batch_size per input size)
        with self.computing():
            results = _raised(
                self.runner.faithfulness_many(
                    [it.prep.raw for it in items],
                    [{n: method_map(m, n, drawn) for n in names} for m in found],
                    [m.relevance.target for m in found],
                    fracs,
                    ablate=pairs,
                    protocol=proto,
                )
            )
        out: list[FaithfulnessResult] = []
        for it, m, res in zip(items, found, results):
            spec = FaithfulnessSpec(tuple(names), m.relevance.target, fracs, drawn, pairs, proto, start)
            out.append(FaithfulnessResult(faithfulness_result(it.image_id, self.lm, m, spec, res)))
        return out if is_many(image) else out[0]

    def zero_shot(
        self, image: Any, labels: Any, maps: bool = False, method: str = "chefer"
    ) -> dict[str, Any] | list[dict[str, Any]]:
        """Zero-shot classification by a CLIP-style model: each label's probability, highest first.

        CLIP: the softmax over the labels of ``exp(logit_scale)`` times the cosines; SigLIP: each
        label's sigmoid (``rule``). The labels' text embeddings are cached per model and phrase.

        Args:
            image: a picture (a path, bytes, a ``PIL.Image``, an ``HxWx3`` array or a tensor
                ``[3, H, W]`` of pixels: uint8 0..255 or float 0..1, not the model's normalised
                input), a list of them, or a tensor ``[B, 3, H, W]``: one result each.
            labels: phrases (``["a dog", "a cat"]``) or one comma-separated string.
            maps: also each label's relevance map (``method``) and its tokens' relevance.
            method: the relevance method of the maps.

        Returns:
            ``labels``: ``[{label, index, logit, probability}]`` ranked (with ``relevance`` and
            ``text_tokens`` when ``maps``), ``rule``, ``logit_scale``, ``logit_bias``.
        """
        from ..engine.text_relevance import parse_method, require_text
        from ..serving.zero_shot import ranked_rows

        tower = require_text(self.lm)
        labs = _labels(labels, tower)
        method = parse_method(method, "text:", self.lm)  # checked with or without maps: a typo is not ignored
        out = []
        for it in self._read(image):
            one = [it.prep.raw]
            with self.computing():
                res = _raised(self.runner.run(lambda raws: [self.runner.zero_shot(raws[0], labs.texts)], one))[0]
                rows = ranked_rows(labs, res)
                if maps:
                    for r in rows:
                        text = f"text:{r['label']}"

                        def rel_of(raws: list[torch.Tensor], text: str = text) -> list[Any]:
                            return self.runner.relevance(raws, text, [method])

                        rel = _raised(self.runner.run(rel_of, one))[0]
                        r["relevance"], r["text_tokens"] = rel.maps[method], rel.text_tokens
            out.append(
                {
                    "model": self.lm.id,
                    "image_id": it.image_id,
                    "rule": res["rule"],
                    "precision": self.runner.precision,
                    "logit_scale": tower.logit_scale,
                    "logit_bias": tower.logit_bias,
                    "labels": rows,
                }
            )
        return out if is_many(image) else out[0]

    def _relevance(
        self, image: Any, target: str | None, names: Any, pairs: Any, start_layer: int | None = None
    ) -> Generator[tuple[dict[int, PreparedPicture], list[Any]], None, None]:
        """Relevance maps of one picture or a list, a batch of one input size at a time (one
        forward and one backward each), each computed as soon as it is prepared while the pool
        prepares the next: the batch (index -> picture) and its ``RelevanceMaps``, in its order
        (``start_layer``: chefer2021's, checked; None for the engine's default)."""
        from ..serving.relevance import RelevanceMaps

        with contextlib.closing(self._stream(image)) as batches:
            for batch in batches:

                def run(ids: list[int], batch: dict[int, PreparedPicture] = batch) -> list[Any]:
                    t0 = time.perf_counter()
                    rels = self.runner.relevance(
                        self._raws(batch, ids), target, names, ablate=pairs, start_layer=start_layer
                    )
                    ms = (time.perf_counter() - t0) * 1000 / len(ids)
                    return [
                        RelevanceMaps(r, batch[i].prep.input_size, batch[i].prep.image_size, ms, self.runner.precision)
                        for i, r in zip(ids, rels)
                    ]

                with self.computing():
                    maps = _raised(self.runner.run(run, list(batch)))
                yield batch, maps  # outside the model's lock: the caller computes more with it


def _raised(results: list[Any]) -> list[Any]:
    """The results of a batch, or the first picture's error raised."""
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results


class _Naming:
    """A ``ValueError`` about picture ``i`` of a list names it (``pictures[i]: ...``); a loop over
    pictures moves ``i`` on as it goes."""

    def __init__(self, i: int, many: bool):
        self.i, self.many = i, many

    def __enter__(self) -> _Naming:
        return self

    def __exit__(self, kind: type[BaseException] | None, e: BaseException | None, tb: Any) -> None:
        if self.many and kind is not None and issubclass(kind, ValueError):
            raise kind(f"pictures[{self.i}]: {e}") from None


def _cores() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


def _tensors(value: Any) -> Any:
    """numpy arrays in a JSON-ready value as torch tensors (dicts and lists walked)."""
    import numpy as np

    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(value))
    if isinstance(value, dict):
        return {k: _tensors(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_tensors(v) for v in value]
    return value


def _arrays(res: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    """``res`` with the number lists under ``keys`` as float32 tensors (the API's float32 values)."""
    return {k: torch.tensor(v, dtype=torch.float32) if k in keys and v is not None else v for k, v in res.items()}


def _device_of(model: nn.Module) -> torch.device:
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


def load(
    model_or_id: str | nn.Module | LoadedModel | None = None,
    device: str | torch.device = "auto",
    precision: str = "fp32",
    models_dir: str | Path | None = None,
    *,
    settings: Settings | None = None,
    batch_size: int | None = None,
    model_id: str | None = None,
) -> Scope:
    """A model ready for `Scope.attention` and the rest.

    Args:
        model_or_id: a model id as the server takes it (None: the default, the embedded
            ``dinov2-s14-focus`` unless ``HEADSCOPE_MODEL`` says otherwise; ``timm:NAME``,
            ``local:ARCH@/path/weights.safetensors``, ``random:ARCH``), or a timm model object
            already in memory (one just fine-tuned: used as it is, on its device).
        device: ``auto`` (CUDA, then MPS, then CPU; a model object stays where it is), ``cpu``,
            ``cuda``, ``cuda:N`` or ``mps``. A model object given another device is moved there.
        precision: ``fp32`` (the default on every device: exact, no TF32), ``bf16``, ``fp16``
            (autocast), ``auto`` (bf16/fp16 on CUDA, fp32 elsewhere).
        models_dir: where models are converted and kept (default as the server's:
            ``HEADSCOPE_MODELS_DIR``, a checkout's ``models/``, else the user's cache).
        settings: the server's ``Settings`` (default: from ``HEADSCOPE_*`` variables, as the
            server and the command line read them): decoding limits, resize mode.
        batch_size: most pictures per forward when a list is given; None: the server's batch
            size for the device (64 on CUDA, 8 on the CPU and MPS; ``HEADSCOPE_CUDA_MAX_BATCH_SIZE``
            and ``HEADSCOPE_MAX_BATCH_SIZE`` change them).
        model_id: the id a model object's results and figures show (default: its architecture,
            ``vit_small_patch16_224``: Headscope cannot tell which weights a module holds, so it
            does not name a pretrained tag); only with a model object.

    ``HEADSCOPE_THREADS``, when set, sets torch's thread count for the whole process
    (``torch.set_num_threads``), as it does for the server.

    Raises:
        ValueError: an unknown model id (also a ``KeyError``), device or precision; a
            ``batch_size`` under 1; a model object whose weights are not float32 (``model.half()``:
            give ``model.float()`` and ``precision="fp16"``).
        TypeError: ``model_or_id`` of another type; a ``batch_size`` that is not a whole number.
    """
    settings = settings or Settings()
    if models_dir is not None:
        settings = settings.model_copy(update={"models_dir": Path(models_dir)})
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: use auto, fp32, fp16 or bf16")
    _batch_size(batch_size)  # before the model loads
    if settings.threads > 0:
        torch.set_num_threads(settings.threads)
    if model_id is not None and (not isinstance(model_id, str) or not model_id.strip()):
        raise TypeError(f"model_id: a non-empty string; got {model_id!r}")
    if model_id is not None and not isinstance(model_or_id, nn.Module):
        raise TypeError("model_id names a timm model object given to load(); a model id or a loaded model names itself")
    if isinstance(model_or_id, (LoadedModel, nn.Module)):
        from ..zoo.loaders import wrap_module

        lm = model_or_id if isinstance(model_or_id, LoadedModel) else wrap_module(model_or_id, model_id)
        if str(device) != "auto":
            lm.to(resolve_device(str(device)))
    elif model_or_id is None or isinstance(model_or_id, str):
        from ..zoo.registry import Registry

        dev = resolve_device(str(device))
        lm = Registry([model_or_id or settings.model], settings.models_dir, dev).get()
    else:
        raise TypeError(
            f"load() takes a model id, a timm model or nothing (the default model); got {type(model_or_id).__name__}"
        )
    return Scope(lm, settings, precision, batch_size)


def _batch_size(value: Any) -> int | None:
    """A ``batch_size`` argument checked: None, or a whole number of at least 1."""
    if value is None:
        return None
    try:
        if isinstance(value, bool):
            raise TypeError
        n = operator.index(value)  # ints and numpy's; not 2.5 or "8"
    except TypeError:
        raise TypeError(f"batch_size: a whole number of at least 1, or None; got {value!r}") from None
    if n < 1:
        raise ValueError(f"batch_size: at least 1; got {n}")
    return n


def _labels(labels: Any, tower: Any) -> Labels:
    """Zero-shot labels: one comma-separated string (as the API reads them) or a sequence of
    phrases, each checked (against ``tower``'s context length too), repeats dropped.

    Raises:
        TypeError: neither a string nor a sequence of strings.
        TextError: no label, an empty or too long one, more than ``MAX_LABELS``.
    """
    from ..serving.zero_shot import check_labels, parse_labels

    if isinstance(labels, str):
        return parse_labels(labels, tower)
    if isinstance(labels, bytes) or not isinstance(labels, Iterable):
        raise TypeError(
            f"labels: phrases (['a dog', 'a cat']) or one comma-separated string; got {type(labels).__name__}"
        )
    items = list(labels)
    for i, s in enumerate(items):
        if not isinstance(s, str):
            raise TypeError(f"labels[{i}]: a phrase is a str; got {type(s).__name__}")
    return check_labels(items, tower)


__all__ = ["Scope", "load"]
