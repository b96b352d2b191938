"""The request path of relevance maps and of the faithfulness test (issue #27).

* :meth:`RelevanceService.relevance` (``GET …/relevance``): one relevance map of an image for
  one target. One forward that keeps every softmax map and one backward give *every* method's
  map at once (:func:`relevance_maps`), so they are computed together and cached together per
  image, model, ablation set and target (:class:`~.cache.RelevanceKey`): asking for another
  method of the same target is a cache hit. ``random`` with another seed is drawn from the
  seed alone, without a forward.
* :meth:`RelevanceService.faithfulness` (``GET …/faithfulness``): the perturbation test of
  several maps, as a task in pieces on the worker thread (:func:`faithfulness_work`: the maps,
  then one batch of perturbed forwards per piece, so uploads run between them), with progress
  (``GET …/faithfulness/progress``) and ``wait=``, like ``…/importance``
  (:class:`~.tasks.ImageTasks`). Cached per image, model, ablation set, target, methods (as a
  set), fractions and seed (:class:`~.cache.FaithfulnessKey`); the answer lists the methods in
  the order the request named them.

Parameters are normalised before they become keys: the target by its parsed spelling (``""``
and ``output`` are one key), methods as a sorted set, fractions as numbers (``0.10`` is
``0.1``), the seed only where ``random`` is tested. The computations are plain functions
(:func:`relevance_maps`, :func:`relevance_answer`, :func:`faithfulness_work` with
:func:`~.tasks.run_now`): the numbers the API answers, without a server.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal, get_args

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from ..engine import faithfulness as faith
from ..engine.ablation import Ablation, ablate_text
from ..engine.batching import BatchRunner, device_input
from ..engine.model import LoadedModel
from ..engine.output import class_names
from ..engine.relevance import (
    METHOD_TEXT,
    METHODS,
    Relevance,
    Target,
    check_target,
    parse_methods,
    parse_target,
    random_map,
    refuse_windowed,
)
from ..engine.selection import MAX_SPEC
from . import images
from .answers import Answer, server_timing
from .cache import FaithfulnessKey, RelevanceKey
from .encoders import MEDIA_TYPES, encode
from .params import Ablate
from .tasks import TASK_DEADLINE_S, ImageTasks, Progress, Tasks, Work, run_on
from .uploads import ImageNotFound
from .waiting import Disconnected

MethodName = Literal["chefer", "grad_attention", "rollout", "attention", "random"]  # an enum in the schema
assert get_args(MethodName) == METHODS
DEFAULT_METHOD: MethodName = "chefer"
DEFAULT_TEST_METHODS = "chefer,attention,random"
MAPS_OVERHEAD_BYTES = 4096  # what a cached set of maps costs beyond its arrays
# Units of progress of the relevance maps, in perturbed forwards: one forward keeping the maps
# and one backward cost about 2.5 plain forwards of one picture.
MAPS_UNITS = 3.0
_SEED = Field(0, ge=0, le=2**31 - 1, description="the seed of the `random` map (the same seed, the same map)")
_TARGET = Field(
    None,
    max_length=MAX_SPEC,
    description="the scalar of the output to explain: `output` (saliency: the mean of the map; the default), "
    "`box:X0,Y0,X1,Y1` (saliency: the mean over output-map rows Y0:Y1, columns X0:X1, pixels, end-exclusive), "
    "`top` (classes: the logit of the top class; the default), `class:N` (the logit of class N), `embedding` "
    "(models with neither: <e, e0>/|e0|^2; the default)",
    examples=["output", "box:60,40,150,120", "top", "class:281", "embedding"],
)


class RelevanceParams(BaseModel):
    """``GET …/relevance``: one method's map for one target."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    model: str | None = Field(None, description="model id (default: the server's default model)")
    method: MethodName = Field(
        DEFAULT_METHOD,
        description="chefer (Chefer et al. 2021), grad_attention (the last layer's gradient-weighted attention), "
        "rollout (attention rollout), attention (the last layer's raw attention), random (a seeded baseline)",
    )
    target: str | None = _TARGET
    seed: int = _SEED
    format: Literal["json", "npy", "safetensors"] = Field(
        "json",
        description="answer format: JSON, or the map alone as npy or safetensors (tensor `relevance`), "
        "metadata in the X-Headscope-Meta header (and the safetensors header)",
    )
    ablate: Ablate = ""


class FaithfulnessQuery(BaseModel):
    """What names one perturbation test (``GET …/faithfulness`` and its ``…/progress``)."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    model: str | None = Field(None, description="model id (default: the server's default model)")
    methods: str = Field(
        DEFAULT_TEST_METHODS,
        max_length=MAX_SPEC,
        description="the maps to test, comma-separated (any of chefer, grad_attention, rollout, attention, "
        "random); the answer lists them in this order",
        examples=[DEFAULT_TEST_METHODS, "chefer,grad_attention,attention,rollout,random"],
    )
    target: str | None = _TARGET
    fractions: str | None = Field(
        None,
        max_length=MAX_SPEC,
        description="the shares of patches removed, comma-separated, in [0, 1), strictly ascending, at most 50 "
        "(default 0,0.1,...,0.9)",
        examples=["0,0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9", "0,0.25,0.5"],
    )
    seed: int = _SEED
    ablate: Ablate = ""


class FaithfulnessParams(FaithfulnessQuery):
    """``GET …/faithfulness``: the test, and how long to wait for it."""

    wait: float | None = Field(
        None,
        ge=0,
        le=3600,
        description="seconds to wait for the result; if it is not ready by then, answer 202 with the progress "
        "(the computation goes on; ask again). By default (absent) the request waits up to the server's request "
        "timeout and then answers 504 (the computation goes on too).",
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

    def key(self, image_id: str, model_id: str) -> FaithfulnessKey:
        seed = self.seed if "random" in self.methods else 0
        return FaithfulnessKey(
            image_id, model_id, self.ablate, str(self.target), tuple(sorted(self.methods)), self.fractions, seed
        )


def faithfulness_spec(lm: LoadedModel, q: FaithfulnessQuery) -> FaithfulnessSpec:
    """``q`` resolved against ``lm`` (422 errors: methods, target, fractions, ablate; a windowed model)."""
    methods = parse_methods(q.methods)
    fractions = faith.parse_fractions(q.fractions)
    refuse_windowed(lm)
    return FaithfulnessSpec(methods, parse_target(q.target, lm), fractions, q.seed, lm.ablation(q.ablate))


# -- the computations (any thread; the server runs them on its worker) ---------------------------
def relevance_maps(
    lm: LoadedModel,
    prep: images.Prepared,
    target: Target,
    ablate: Ablation = (),
    amp_dtype: torch.dtype | None = None,
    device: torch.device | str = "cpu",
) -> RelevanceMaps:
    """Every method's map of one prepared picture for ``target`` (one forward, one backward)."""
    t0 = time.perf_counter()
    check_target(target, prep.input_size)
    runner = BatchRunner(lm, amp_dtype)
    with lm.lock:
        rel = runner.relevance([prep.raw], target, METHODS, ablate=ablate)[0]
    ms = (time.perf_counter() - t0) * 1000
    return RelevanceMaps(rel, prep.input_size, prep.image_size, ms, runner.precision)


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
        "precision": maps.precision,
    }


def relevance_meta(
    image_id: str, lm: LoadedModel, maps: RelevanceMaps, method: str, seed: int = 0, ablate: Ablation = ()
) -> dict[str, Any]:
    """The one relevance result: everything ``GET …/relevance`` says of one method's map but the
    map itself, the request's own fields (``cached``, ``timing_ms``) and the Python API's."""
    m = method_map(maps, method, seed)
    return {
        **_common(image_id, lm, maps, ablate),
        "method": method,
        "method_text": METHOD_TEXT[method],
        "seed": seed if method == "random" else None,
        "uniform": method in maps.relevance.uniform,
        "shape": list(m.shape),
        "dtype": "float32",
    }


def faithfulness_result(
    image_id: str, lm: LoadedModel, maps: RelevanceMaps, spec: FaithfulnessSpec, result: faith.Faithfulness
) -> dict[str, Any]:
    """The one faithfulness result: what ``GET …/faithfulness`` answers but ``cached`` and
    ``timing_ms`` (the Python API's too); methods in ``spec.methods``' order."""
    return {
        **_common(image_id, lm, maps, spec.ablate),
        **result.as_dict(),
        "seed": spec.seed if "random" in spec.methods else None,
        "method_text": {m: METHOD_TEXT[m] for m in spec.methods},
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
    slug = str(maps.relevance.target).replace(":", "-").replace(",", "_")
    stem = f"relevance-{image_id[:12]}-{lm.id}-{method}-{slug}"
    body, headers = encode(np.ascontiguousarray(m.numpy(), np.float32), meta, fmt, stem, key="relevance")
    headers["Server-Timing"] = server_timing(timing)
    return Answer(list(body), headers, MEDIA_TYPES[fmt], meta)


def _new_test(
    lm: LoadedModel,
    prep: images.Prepared,
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
    )


def _step(lm: LoadedModel, test: faith.PerturbationTest) -> None:
    with lm.lock:
        test.step()


def faithfulness_work(
    image_id: str,
    lm: LoadedModel,
    prep: images.Prepared,
    maps: RelevanceMaps,
    spec: FaithfulnessSpec,
    progress: Progress,
    amp_dtype: torch.dtype | None = None,
    device: torch.device | str = "cpu",
    batch_size: int = faith.DEFAULT_BATCH,
) -> Work:
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
    texts = {m: METHOD_TEXT[m] for m in methods}
    return {**res, "methods": {m: res["methods"][m] for m in methods}, "method_text": texts}


# -- the service --------------------------------------------------------------------------------
class RelevanceService(ImageTasks):
    """Relevance maps and the faithfulness test on top of :class:`~.service.AttentionService`.

    Args:
        service: the attention service (uploads, cache, worker, models, settings).
        max_tasks: faithfulness tests at once, and relevance computations at once (each its own
            pool); more get 429.
    """

    def __init__(self, service, max_tasks: int = 4):
        super().__init__(service, max_tasks)
        self.map_tasks = Tasks(max_tasks)  # the maps: joined by a test that needs the same ones

    async def _model(self, model_id: str | None) -> LoadedModel:
        lm = await self.svc.model(model_id)
        refuse_windowed(lm)
        return lm

    async def maps(
        self,
        image_id: str,
        lm: LoadedModel,
        ablate: Ablation,
        target: Target,
        prep: images.Prepared | None = None,
        is_disconnected: Disconnected | None = None,
        deadline: float | None = None,
    ) -> tuple[RelevanceMaps, bool]:
        """Every method's map for ``target``, from the cache or computed once (joined by
        identical requests meanwhile); and whether it came from the cache."""
        key = RelevanceKey(image_id, lm.id, ablate, str(target))
        hit = self.cache.get(key)
        if hit is not None:
            return hit, True
        self.svc.uploads.require(image_id)

        async def job(progress: Progress) -> RelevanceMaps:
            p = prep or await self.prepared(image_id, lm)
            check_target(target, p.input_size)  # a box outside this picture's map: 422 before the forward
            progress.stage = "forward and backward pass"
            m = await self.piece(partial(relevance_maps, lm, p, target, ablate, self.worker.amp_dtype, self.device))
            self.cache.put(key, m, m.nbytes)
            return m

        due = self.deadline() if deadline is None else deadline
        return await self.map_tasks.run(key, "relevance", job, due, is_disconnected), False

    async def relevance(
        self, image_id: str, params: RelevanceParams, is_disconnected: Disconnected | None = None
    ) -> Answer:
        """``GET …/relevance``: one method's map for one target."""
        t0 = time.perf_counter()
        method = params.method
        lm = await self._model(params.model)
        ablate = lm.ablation(params.ablate)
        target = parse_target(params.target, lm)
        maps, cached = await self.maps(image_id, lm, ablate, target, is_disconnected=is_disconnected)
        return await self.worker.run_answer(
            relevance_answer, image_id, lm, maps, method, params.seed, ablate, params.format, cached, t0
        )

    async def faithfulness(
        self, image_id: str, params: FaithfulnessParams, is_disconnected: Disconnected | None = None
    ) -> dict:
        """``GET …/faithfulness``: the perturbation test (``{"pending": progress}`` when ``wait``
        ran out first; the computation goes on)."""
        lm = await self._model(params.model)
        spec = faithfulness_spec(lm, params)

        async def compute(progress: Progress) -> dict:
            progress.total = MAPS_UNITS + 1 + 2 * len(spec.methods) * sum(1 for f in spec.fractions if f > 0)
            progress.stage = "relevance maps"
            prep = await self.prepared(image_id, lm)
            deadline = time.monotonic() + TASK_DEADLINE_S  # the test outlives the request that started it
            maps, _ = await self.maps(image_id, lm, spec.ablate, spec.target, prep, deadline=deadline)
            progress.advance(MAPS_UNITS)
            work = faithfulness_work(image_id, lm, prep, maps, spec, progress, self.worker.amp_dtype, self.device)
            return await run_on(work, self.piece)

        key = spec.key(image_id, lm.id)
        res = await self.result(key, "faithfulness", image_id, compute, is_disconnected, params.wait)
        return res if "pending" in res else ordered(res, spec.methods)

    def progress(self, image_id: str, params: FaithfulnessQuery) -> dict:
        """What ``GET …/faithfulness/progress`` reports (ImageNotFound for an unknown image):
        ``state`` ``done`` (cached), ``running`` (``done`` of ``total`` forwards, ``fraction``,
        ``eta_s``, ``stage``) or ``idle``."""
        mid = self.svc.registry.resolve(params.model)
        lm = self.svc.registry.loaded(mid)
        if lm is not None:
            state = self.state(faithfulness_spec(lm, params).key(image_id, lm.id), "faithfulness")
            if state is not None:
                return state
        else:
            # not loaded yet: check what can be checked without the model
            parse_methods(params.methods)
            faith.parse_fractions(params.fractions)
        if self.svc.uploads.get(image_id) is None:
            raise ImageNotFound(image_id)
        return {"state": "idle", "task": "faithfulness", "done": 0, "total": None, "fraction": 0.0}
