"""The request path of relevance maps and of the faithfulness test (issue #27).

* :meth:`RelevanceService.relevance` (``GET …/relevance``): one relevance map of an image for
  one target. One forward that keeps every softmax map and one backward give *every* method's
  map at once (:func:`relevance_maps`), so they are computed together and cached together per
  image, model, ablation set and target (:class:`~.cache.RelevanceKey`): asking for another
  method of the same target is a cache hit. The computation is a worker job
  (:class:`RelevanceWork`): concurrent requests for one target, model, input size and ablation
  run in one batched forward and backward, collected as uploads are. ``random`` with another seed is drawn from the
  seed alone, without a forward.
* :meth:`RelevanceService.faithfulness` (``GET …/faithfulness``): the perturbation test of
  several maps, as a task on the worker thread: the maps, then each perturbed forward a worker
  job (:class:`PerturbedWork`), stacked with those of every test running at the time into batches
  of ``max_batch_size`` (uploads, at a higher priority, run between them;
  :func:`faithfulness_work`, in pieces, where no worker loop runs), with progress
  (``GET …/faithfulness/progress``) and ``wait=``, like ``…/importance``
  (:class:`~.tasks.ImageTasks`). Cached per image, model, ablation set, target, methods (as a
  set), fractions, seed, protocol and ``chefer2021``'s start layer
  (:class:`~.cache.FaithfulnessKey`); the answer lists the methods in the order the request
  named them.

``start_layer`` (``chefer2021``'s first layer; refused with any other method) is part of every
key that holds a ``chefer2021`` map: the maps' and the test's (the keys' ``start_layer``,
:func:`resolved_start`) and the worker's batch (:class:`RelevanceWork`), so two start layers
never share an answer; the default is spelt out in the key, so leaving it out and asking for it
share one.

Parameters are normalised before they become keys: the target by its parsed spelling (``""``
and ``output`` are one key), methods as a sorted set, fractions as numbers (``0.10`` is
``0.1``), the seed only where ``random`` is tested. The computations are plain functions
(:func:`relevance_maps`, :func:`relevance_answer`, :func:`faithfulness_work` with
:func:`~.tasks.run_now`): the numbers the API answers, without a server.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch

from ..engine import faithfulness as faith
from ..engine.ablation import Ablation, ablate_text
from ..engine.batching import BatchRunner, device_input
from ..engine.model import LoadedModel
from ..engine.output import class_names
from ..engine.relevance import (
    CHEFER2021_START_LAYER,
    LRP_METHODS,
    METHODS,
    START_LAYER_METHOD,
    Relevance,
    Target,
    check_target,
    method_text,
    parse_methods,
    parse_target,
    random_map,
    refuse_windowed_relevance,
    resolve_start_layer,
)
from ..engine.selection import SelectionError
from ..engine.text_relevance import TEXT_METHODS, is_text, parse_method, parse_target_methods, text_methods
from . import preprocess
from .admission import HEAVY, PRIORITY, current_client_left, current_ticket
from .answers import Answer, server_timing
from .cache import FaithfulnessKey, RelevanceKey
from .encoders import MEDIA_TYPES, ablate_detail, answer_stem, encode
from .params import FaithfulnessParams, FaithfulnessQuery, RelevanceParams
from .tasks import TASK_DEADLINE_S, ImageTasks, TaskProgress, Tasks, TaskWork, run_on
from .uploads import ImageNotFound, Upload
from .worker import Job

# The maps of one forward and backward, computed and cached together; each LRP method runs a
# forward of its own under its rules, so it is computed (and cached) only when asked for.
BASE_METHODS = tuple(m for m in METHODS if m not in LRP_METHODS)


def method_group(method: str) -> tuple[str, ...]:
    """The methods computed together with ``method``."""
    return (method,) if method in LRP_METHODS else BASE_METHODS


def resolved_start(methods: tuple[str, ...], start_layer: int | None) -> int | None:
    """The start layer a cache key holds: chefer2021's, the default spelt out (leaving it out and
    asking for the default share one answer), where ``methods`` hold chefer2021; else None."""
    if START_LAYER_METHOD not in methods:
        return None
    return CHEFER2021_START_LAYER if start_layer is None else start_layer


MAPS_OVERHEAD_BYTES = 4096  # what a cached set of maps costs beyond its arrays
# Units of progress of the relevance maps, in perturbed forwards: one forward keeping the maps
# and one backward cost about 2.5 plain forwards of one picture.
MAPS_UNITS = 3.0


class TaskTooLargeError(SelectionError):
    """A faithfulness test that asks for more perturbed forwards than the server allows."""

    code = "task_too_large"


def perturbed_forwards(methods: Sequence[str], fractions: Sequence[float]) -> int:
    """The perturbed forwards a test costs: each method's positive and negative curve, one
    forward per non-zero fraction (the picture itself is one forward, shared)."""
    return 2 * len(methods) * sum(1 for f in fractions if f > 0)


def check_cost(spec: FaithfulnessSpec, max_forwards: int) -> None:
    """Raise :class:`TaskTooLargeError` (422) when ``spec`` asks for over ``max_forwards`` forwards."""
    n = perturbed_forwards(spec.methods, spec.fractions)
    if n > max_forwards:
        raise TaskTooLargeError(
            f"this test would run {n} perturbed forwards (2 x {len(spec.methods)} methods x "
            f"{n // max(1, 2 * len(spec.methods))} non-zero fractions), over the server's {max_forwards} "
            "(HEADSCOPE_MAX_TEST_FORWARDS); ask for fewer methods or fractions"
        )


@dataclass
class RelevanceMaps:
    """Every method's relevance map of one image for one target, on the host (what is cached)."""

    relevance: Relevance
    input_size: tuple[int, int]
    image_size: tuple[int, int]
    compute_ms: float
    precision: str = "fp32"  # fp32, bf16 or fp16: what the forward and backward computed in

    @property
    def nbytes(self) -> int:
        return sum(m.numel() * m.element_size() for m in self.relevance.maps.values()) + MAPS_OVERHEAD_BYTES


@dataclass(frozen=True)
class FaithfulnessSpec:
    """A faithfulness request, normalised: ``methods`` in the request's order."""

    methods: tuple[str, ...]
    target: Target
    fractions: tuple[float, ...]
    seed: int
    ablate: Ablation
    protocol: str = faith.DEFAULT_PROTOCOL
    start_layer: int | None = None  # chefer2021's first layer, where chefer2021 is tested; else None

    def key(self, image_id: str, model_id: str) -> FaithfulnessKey:
        seed = self.seed if "random" in self.methods else 0
        return FaithfulnessKey(
            image_id,
            model_id,
            self.ablate,
            str(self.target),
            tuple(sorted(self.methods)),
            self.fractions,
            seed,
            self.protocol,
            resolved_start(self.methods, self.start_layer),
        )


def faithfulness_spec(lm: LoadedModel, q: FaithfulnessQuery) -> FaithfulnessSpec:
    """``q`` resolved against ``lm`` (422 errors: methods, target, fractions, ablate, protocol,
    start_layer; a windowed model)."""
    refuse_windowed_relevance(lm)
    target = parse_target(q.target, lm)
    methods = parse_target_methods(q.methods, target, lm)
    fractions = faith.parse_fractions(q.fractions)
    protocol = faith.parse_protocol(q.protocol)
    faith.check_protocol(protocol, lm, target)
    start = resolve_start_layer(q.start_layer, methods, lm.num_layers)
    return FaithfulnessSpec(methods, target, fractions, q.seed, lm.ablation(q.ablate), protocol, start)


# -- the computations (any thread; the server runs them on its worker) ---------------------------
def relevance_maps(
    lm: LoadedModel,
    prep: preprocess.PreparedPixels,
    target: Target,
    ablate: Ablation = (),
    amp_dtype: torch.dtype | None = None,
    device: torch.device | str = "cpu",
    methods: Sequence[str] = BASE_METHODS,
    start_layer: int | None = None,
) -> RelevanceMaps:
    """The maps of ``methods`` (by default every method of one forward and one backward) of one
    prepared picture for ``target`` (``start_layer``: chefer2021's, None for the default)."""
    t0 = time.perf_counter()
    check_target(target, prep.input_size)
    runner = BatchRunner(lm, amp_dtype)
    with lm.lock:
        if is_text(target):  # a phrase: its own forward of both towers gives every map it has
            methods = text_methods(lm)
        rel = runner.relevance([prep.raw], target, methods, ablate=ablate, start_layer=start_layer)[0]
    ms = (time.perf_counter() - t0) * 1000
    return RelevanceMaps(rel, prep.input_size, prep.image_size, ms, runner.precision)


def merge_maps(parts: Sequence[RelevanceMaps]) -> RelevanceMaps:
    """Maps of several groups of one picture and target as one :class:`RelevanceMaps`."""
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    rel = first.relevance
    merged = Relevance(
        target=rel.target,
        y=rel.y,
        grid=rel.grid,
        maps={k: v for p in parts for k, v in p.relevance.maps.items()},
        class_index=rel.class_index,
        rows=rel.rows,
        seed=rel.seed,
        uniform=[u for p in parts for u in p.relevance.uniform],
        start_layer=next((p.relevance.start_layer for p in parts if p.relevance.start_layer is not None), None),
    )
    return RelevanceMaps(merged, first.input_size, first.image_size, sum(p.compute_ms for p in parts), first.precision)


def method_map(maps: RelevanceMaps, method: str, seed: int = 0) -> torch.Tensor:
    """One method's ``[rows, cols]`` map (``random`` drawn for ``seed``: no forward needed)."""
    rel = maps.relevance
    if method == "random" and seed != rel.seed:
        return random_map(rel.grid[0] * rel.grid[1], seed).reshape(rel.grid)
    return rel.maps[method]


def _class_label(lm: LoadedModel, index: int | None) -> str | None:
    if index is None:
        return None
    names = class_names(lm.model)
    return names[0][index] if names else f"class {index}"


def _common(image_id: str, lm: LoadedModel, maps: RelevanceMaps, ablate: Ablation) -> dict[str, Any]:
    rel = maps.relevance
    return {
        "model": lm.id,
        "image_id": image_id,
        "kind": lm.output_kind,
        "target": str(rel.target),
        "y": rel.y,
        "class_index": rel.class_index,
        "class_label": _class_label(lm, rel.class_index),
        "grid": list(rel.grid),
        "patch_size": list(lm.patch_size),
        "input_size": list(maps.input_size),
        "image_size": list(maps.image_size),
        "rows": rel.rows,
        "ablated": [list(pair) for pair in ablate],
        "ablate": ablate_text(ablate),
        "text_tokens": rel.text_tokens,
        "precision": maps.precision,
    }


def relevance_meta(
    image_id: str, lm: LoadedModel, maps: RelevanceMaps, method: str, seed: int = 0, ablate: Ablation = ()
) -> dict[str, Any]:
    """The one relevance result: everything ``GET …/relevance`` says of one method's map but the
    map itself, the request's own fields (``cached``, ``timing_ms``) and the Python API's
    (``start_layer``: the first layer of chefer2021's product, null for other methods)."""
    m = method_map(maps, method, seed)
    start = maps.relevance.start_layer if method == START_LAYER_METHOD else None
    return {
        **_common(image_id, lm, maps, ablate),
        "method": method,
        "method_text": method_text(method, start),
        "seed": seed if method == "random" else None,
        "start_layer": start,
        "uniform": method in maps.relevance.uniform,
        "shape": list(m.shape),
        "dtype": "float32",
    }


def faithfulness_result(
    image_id: str, lm: LoadedModel, maps: RelevanceMaps, spec: FaithfulnessSpec, result: faith.Faithfulness
) -> dict[str, Any]:
    """The one faithfulness result: what ``GET …/faithfulness`` answers but ``cached`` and
    ``timing_ms`` (the Python API's too); methods in ``spec.methods``' order; ``start_layer``:
    chefer2021's, null when it is not tested."""
    return {
        **_common(image_id, lm, maps, spec.ablate),
        **result.as_dict(),
        "seed": spec.seed if "random" in spec.methods else None,
        "start_layer": spec.start_layer,
        "method_text": {m: method_text(m, spec.start_layer) for m in spec.methods},
    }


def relevance_answer(
    image_id: str,
    lm: LoadedModel,
    maps: RelevanceMaps,
    method: str,
    seed: int = 0,
    ablate: Ablation = (),
    fmt: str = "json",
    cached: bool = False,
    t0: float | None = None,
) -> Answer:
    """The answer of ``GET …/relevance``: one method's map with its metadata (JSON, npy or safetensors)."""
    t0 = time.perf_counter() if t0 is None else t0
    m = method_map(maps, method, seed)
    meta = {**relevance_meta(image_id, lm, maps, method, seed, ablate), "cached": cached}
    timing = {"compute": 0.0 if cached else maps.compute_ms, "total": (time.perf_counter() - t0) * 1000}
    meta["timing_ms"] = timing
    target = str(maps.relevance.target).replace(":", "-").replace(",", "_")
    seeded = [f"seed{seed}"] if method == "random" else []  # the one method whose map the seed changes
    # and the one whose map the first layer changes: two starts never share a name, as never an answer
    started = [f"start{meta['start_layer']}"] if meta["start_layer"] is not None else []
    stem = answer_stem("relevance", image_id, lm.id, method, target, *seeded, *started, *ablate_detail(ablate))
    body, headers = encode(np.ascontiguousarray(m.numpy(), np.float32), meta, fmt, stem, key="relevance")
    headers["Server-Timing"] = server_timing(timing)
    return Answer(list(body), headers, MEDIA_TYPES[fmt], meta)


def _new_test(
    lm: LoadedModel,
    prep: preprocess.PreparedPixels,
    maps: RelevanceMaps,
    spec: FaithfulnessSpec,
    amp_dtype: torch.dtype | None,
    device,
    batch_size: int,
) -> faith.PerturbationTest:
    wanted = {m: method_map(maps, m, spec.seed) for m in spec.methods}
    return faith.PerturbationTest(
        lm,
        device_input(lm, prep.raw, device)[0],
        wanted,
        maps.relevance.target,
        spec.fractions,
        batch_size=batch_size,
        amp_dtype=amp_dtype,
        ablate=spec.ablate,
        protocol=spec.protocol,
    )


def _step(lm: LoadedModel, test: faith.PerturbationTest) -> None:
    with lm.lock:
        test.step()


def faithfulness_work(
    image_id: str,
    lm: LoadedModel,
    prep: preprocess.PreparedPixels,
    maps: RelevanceMaps,
    spec: FaithfulnessSpec,
    progress: TaskProgress,
    amp_dtype: torch.dtype | None = None,
    device: torch.device | str = "cpu",
    batch_size: int = faith.DEFAULT_BATCH,
) -> TaskWork:
    """The perturbation test of ``spec.methods``' maps (``GET …/faithfulness``), in pieces: the
    test's set-up, then one batch of perturbed forwards per piece.

    ``progress`` counts forwards of one picture (the maps, already computed, count
    :data:`MAPS_UNITS`). The answer lists the methods in ``spec.methods``' order.
    """
    t0 = time.perf_counter()
    test = yield partial(_new_test, lm, prep, maps, spec, amp_dtype, device, batch_size)
    progress.total = MAPS_UNITS + test.total
    progress.done = MAPS_UNITS
    progress.stage = "perturbed forwards"
    while not test.finished:
        before = test.done
        yield partial(_step, lm, test)
        progress.advance(test.done - before, f"perturbed forwards: {test.done} of {test.total}")
    result = yield test.result
    progress.stage = "done"
    res = faithfulness_result(image_id, lm, maps, spec, result)
    res["timing_ms"] = {"maps": maps.compute_ms, "compute": (time.perf_counter() - t0) * 1000}
    return res


def ordered(res: dict, methods: Sequence[str]) -> dict:
    """A cached answer with its methods in the request's order."""
    texts = {m: method_text(m, res.get("start_layer")) for m in methods}
    out = {**res, "methods": {m: res["methods"][m] for m in methods}, "method_text": texts}
    if "verdicts" in res:
        out["verdicts"] = {m: res["verdicts"][m] for m in methods}
    return out


# -- batched on the worker (app/serving/worker.py: jobs of one key share a call) -------------------
@dataclass(frozen=True)
class RelevanceWork:
    """The maps of ``methods`` for ``target`` of each job's picture: concurrent requests for one
    target, model, input size and ablation run in one forward and one backward (the worker
    collects them as it collects uploads). Each job's result: ``(Relevance, compute ms)``."""

    target: Target
    methods: tuple[str, ...]
    start_layer: int | None = None  # chefer2021's (None: the default): jobs of two starts never share a call

    @property
    def key(self) -> tuple:
        return ("relevance", str(self.target), self.methods, self.start_layer)

    def run(self, runner: BatchRunner, jobs: list) -> list[Any]:
        t0 = time.perf_counter()
        rels = runner.relevance(
            [j.pixels for j in jobs],
            self.target,
            self.methods,
            ablate=jobs[0].ablate,
            start_layer=self.start_layer,
        )
        ms = (time.perf_counter() - t0) * 1000 / len(jobs)
        return [(r, ms) for r in rels]


@dataclass(eq=False)
class PerturbedWork:
    """One forward of a perturbation test (``entry`` of :attr:`~app.engine.faithfulness.
    PerturbationTest.queue`): the jobs of every test running at the time, stacked into one
    forward per input size and ablation. Each job's result: None (the output goes to its test)."""

    test: faith.PerturbationTest
    entry: int | None

    @property
    def key(self) -> tuple:
        return ("perturbed",)

    def run(self, runner: BatchRunner, jobs: list) -> list[Any]:
        by_test: dict[int, tuple[faith.PerturbationTest, list[int | None]]] = {}
        for j in jobs:
            by_test.setdefault(id(j.work.test), (j.work.test, []))[1].append(j.work.entry)
        parts = [test.inputs(entries) for test, entries in by_test.values()]
        out = faith.forward_outputs(runner.lm, torch.cat(parts), runner.amp_dtype, jobs[0].ablate)
        start = 0
        for test, entries in by_test.values():
            test.take(entries, out[start : start + len(entries)])
            start += len(entries)
        return [None] * len(jobs)


def _job(
    lm: LoadedModel,
    pixels: torch.Tensor,
    deadline: float,
    ablate: Ablation,
    work: Any,
    faults: bool = True,
    counted: bool = True,
) -> Job:
    """A worker job at the current request's priority (heavy work outside a request); with the
    request's injected fault (tests only) where ``faults``; ``counted``: see :class:`Job`."""
    ticket = current_ticket()
    priority = ticket.priority if ticket else PRIORITY[HEAVY]
    fault = ticket.fault if faults and ticket and ticket.priority > 0 else None
    return Job(
        lm=lm,
        pixels=pixels,
        deadline=deadline,
        fault=fault,
        ablate=ablate,
        priority=priority,
        work=work,
        counted=counted,
    )


# -- the service --------------------------------------------------------------------------------
class RelevanceService(ImageTasks):
    """Relevance maps and the faithfulness test of uploaded images (:class:`~.tasks.ImageTasks`;
    ``max_tasks``: faithfulness tests at once, and relevance computations at once, each its own
    pool; more get 429)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.map_tasks = Tasks(self.tasks.limit, self.tasks.per_client)  # the maps: joined by a test that needs them

    def pools(self) -> list[Tasks]:
        return [self.tasks, self.map_tasks]

    async def _model(self, model_id: str | None) -> LoadedModel:
        lm = await self.model(model_id)
        refuse_windowed_relevance(lm)
        return lm

    async def maps(
        self,
        image_id: str,
        lm: LoadedModel,
        ablate: Ablation,
        target: Target,
        prep: preprocess.PreparedPixels | None = None,
        deadline: float | None = None,
        group: tuple[str, ...] = BASE_METHODS,
        upload: Upload | None = None,
        start_layer: int | None = None,
        admitted: bool = False,
    ) -> tuple[RelevanceMaps, bool]:
        """The maps of ``group`` (:func:`method_group`) for ``target``, from the cache or computed
        once (joined by identical requests meanwhile); and whether it came from the cache
        (``upload``: the image, when the caller has already looked it up; ``start_layer``:
        chefer2021's, checked, None for the default; ``admitted``: asked by a faithfulness test
        that already holds a slot, answered 202 and runs unattended, so the maps' pool being
        full must not fail it: the map task is not counted against that pool's limit)."""
        start_layer = start_layer if START_LAYER_METHOD in group else None  # no other group reads it
        group_name = "" if group == BASE_METHODS else ",".join(group)
        key = RelevanceKey(image_id, lm.id, ablate, str(target), group_name, resolved_start(group, start_layer))
        hit = self.cache.get(key)
        if hit is not None:
            return hit, True
        picture = upload or self.uploads.require(image_id)

        async def job(progress: TaskProgress) -> RelevanceMaps:
            p = prep or await self.prepared(picture, lm)
            check_target(target, p.input_size)  # a box outside this picture's map: 422 before the forward
            progress.stage = "forward and backward pass"
            if is_text(target) or not self.worker.running:  # a phrase: both towers, alone
                m = await self.piece(
                    partial(
                        relevance_maps, lm, p, target, ablate, self.worker.amp_dtype, self.device, group, start_layer
                    )
                )
            else:  # batched with concurrent requests of the same target, size, ablation and start layer
                work = RelevanceWork(target, group, start_layer)
                rel, ms = await self.worker.compute(_job(lm, p.raw, due, ablate, work))
                m = RelevanceMaps(rel, p.input_size, p.image_size, ms, self.worker.precision)
            self.cache.put(key, m, m.nbytes)
            return m

        due = self.deadline() if deadline is None else deadline
        left = current_client_left()
        return await self.map_tasks.run(key, "relevance", job, due, left, bounded=not admitted), False

    async def relevance(self, image_id: str, params: RelevanceParams) -> Answer:
        """``GET …/relevance``: one method's map for one target."""
        t0 = time.perf_counter()
        lm = await self._model(params.model)
        ablate = lm.ablation(params.ablate)
        target = parse_target(params.target, lm)
        method = parse_method(params.method, target, lm)
        start = resolve_start_layer(params.start_layer, (method,), lm.num_layers)
        maps, cached = await self.maps(image_id, lm, ablate, target, group=method_group(method), start_layer=start)
        return await self.worker.run_answer(
            relevance_answer, image_id, lm, maps, method, params.seed, ablate, params.format, cached, t0
        )

    async def faithfulness(self, image_id: str, params: FaithfulnessParams) -> dict:
        """``GET …/faithfulness``: the perturbation test (``{"pending": progress}`` when ``wait``
        ran out first; the computation goes on)."""
        lm = await self._model(params.model)
        spec = faithfulness_spec(lm, params)
        check_cost(spec, self.settings.max_test_forwards)
        key = spec.key(image_id, lm.id)
        checked: preprocess.PreparedPixels | None = None
        upload: Upload | None = None
        if self.cache.get(key) is None and self.tasks.progress(key) is None:
            # What would fail inside the task fails here, before it takes a slot (a box outside
            # this picture's output map: 422 now, not on the next request).
            upload = self.uploads.require(image_id)
            maps = self.cache.get(RelevanceKey(image_id, lm.id, spec.ablate, str(spec.target)))
            if maps is None:
                checked = await self.prepared(upload, lm)
                check_target(spec.target, checked.input_size)

        async def compute(progress: TaskProgress, upload: Upload) -> dict:
            progress.total = MAPS_UNITS + 1 + perturbed_forwards(spec.methods, spec.fractions)
            progress.stage = "relevance maps"
            prep = checked or await self.prepared(upload, lm)
            deadline = time.monotonic() + TASK_DEADLINE_S  # the test outlives the request that started it
            groups = list(dict.fromkeys(method_group(m) for m in spec.methods))
            parts = [
                (
                    await self.maps(
                        image_id,
                        lm,
                        spec.ablate,
                        spec.target,
                        prep,
                        deadline=deadline,
                        group=g,
                        upload=upload,
                        start_layer=spec.start_layer,
                        admitted=True,
                    )
                )[0]
                for g in groups
            ]
            maps = merge_maps(parts)
            progress.advance(MAPS_UNITS)
            if not self.worker.running:
                work = faithfulness_work(image_id, lm, prep, maps, spec, progress, self.worker.amp_dtype, self.device)
                return await run_on(work, self.piece)
            return await self._perturbed(image_id, lm, prep, maps, spec, progress, deadline)

        res = await self.result(key, "faithfulness", image_id, compute, params.wait, upload)
        return res if "pending" in res else ordered(res, spec.methods)

    async def _perturbed(
        self,
        image_id: str,
        lm: LoadedModel,
        prep: preprocess.PreparedPixels,
        maps: RelevanceMaps,
        spec: FaithfulnessSpec,
        progress: TaskProgress,
        deadline: float,
    ) -> dict:
        """The perturbed forwards of one test as worker jobs (one per forward), batched with
        those of every other test and relevance request running at the time."""
        t0 = time.perf_counter()
        amp = self.worker.amp_dtype
        test = await self.piece(partial(_new_test, lm, prep, maps, spec, amp, self.device, self.worker.max_batch_size))
        progress.total = MAPS_UNITS + test.total
        progress.done = MAPS_UNITS
        progress.stage = "perturbed forwards"
        # one job per forward: an injected fault stays with the test's worker calls (its set-up and
        # result), not once per perturbed picture (a batch acts out every job's fault)
        futures = [
            self.worker.submit(
                _job(lm, test.pixels, deadline, spec.ablate, PerturbedWork(test, e), faults=False, counted=False)
            )
            for e in test.queue
        ]
        given_up = False
        try:
            for i, fut in enumerate(futures):
                await fut
                progress.advance(1, f"perturbed forwards: {i + 1} of {test.total}")
        except asyncio.CancelledError:
            given_up = True
            raise
        finally:
            left = [fut for fut in futures if not fut.done()]
            for fut in left:
                fut.cancel()
            if left:  # the rest out of the queue now; a test given up counts once, not per forward
                if given_up:
                    self.worker.metrics.rejections.labels("cancelled_before_compute").inc()
                self.worker.drop_cancelled()
        result = await self.piece(test.result)
        progress.stage = "done"
        res = faithfulness_result(image_id, lm, maps, spec, result)
        res["timing_ms"] = {"maps": maps.compute_ms, "compute": (time.perf_counter() - t0) * 1000}
        return res

    def progress(self, image_id: str, params: FaithfulnessQuery) -> dict:
        """What ``GET …/faithfulness/progress`` reports (ImageNotFound for an unknown image):
        ``state`` ``done`` (cached), ``running`` (``done`` of ``total`` forwards, ``fraction``,
        ``eta_s``, ``stage``) or ``idle``."""
        mid = self.registry.resolve(params.model)
        lm = self.registry.loaded(mid)
        if lm is not None:
            state = self.state(faithfulness_spec(lm, params).key(image_id, lm.id), "faithfulness")
            if state is not None:
                return state
        else:
            # not loaded yet: check what can be checked without the model
            rest = [m for m in params.methods.split(",") if m.strip().lower() not in TEXT_METHODS]
            if rest:
                names = parse_methods(rest)
                if params.start_layer is not None and START_LAYER_METHOD not in names:
                    resolve_start_layer(params.start_layer, names, 1)  # raises: no chefer2021 to take it
            faith.parse_fractions(params.fractions)
            faith.parse_protocol(params.protocol)
        if self.uploads.get(image_id) is None:
            raise ImageNotFound(image_id)
        return {"state": "idle", "task": "faithfulness", "done": 0, "total": None, "fraction": 0.0}
