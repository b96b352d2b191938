"""The request path of the model's output, head ablation and head importance.

* :meth:`AblationService.output`: the model's own output (saliency, classes or embedding) for
  an image with heads removed, and its change against the unablated output. Both come from one
  batched forward on the worker thread and are cached per image, model and ablation set.
* :meth:`AblationService.importance`: every head's importance (exact sweep or gradient),
  :meth:`AblationService.pruning`: the pruning curve. Both run as tasks in pieces on the worker
  thread so uploads interleave (:class:`~.tasks.ImageTasks`), report
  :class:`~.tasks.TaskProgress` (``GET …/importance/progress``) and are cached.

The computations themselves are plain functions (:func:`output_answer`, :func:`importance_work`,
:func:`pruning_work`): :func:`~.tasks.run_now` runs the works without a server, with the same
numbers. The attention endpoints' ``ablate`` goes through the capture store (the capture is
cached per image and ablation set there).
"""

from __future__ import annotations

import asyncio
import io
import json
import time
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import orjson
import torch

from ..engine import importance as imp
from ..engine.ablation import Ablation, ablate_text, refuse_windowed_ablation
from ..engine.batching import device_input
from ..engine.device import precision_name
from ..engine.model import LoadedModel
from ..engine.output import METRIC_TEXT, METRICS, change, describe, describe_change, kl_divergence
from . import preprocess
from .admission import current_client_left
from .cache import ImportanceKey, OutputKey, PruningKey
from .encoders import ablate_detail, answer_stem
from .params import DEFAULT_POINTS
from .tasks import TASK_DEADLINE_S, ImageTasks, TaskProgress, TaskWork, run_on
from .uploads import ImageNotFound, Upload
from .waiting import wait_for_result

OUTPUT_OVERHEAD_BYTES = 1024


@dataclass
class Output:
    """One image's output under one ablation set, on the host."""

    tensor: torch.Tensor  # saliency [H, W] | classes [C] log-probabilities | embedding [D]
    input_size: tuple[int, int]
    image_size: tuple[int, int]


@dataclass
class OutputAnswer:
    body: list[bytes]
    headers: dict[str, str]
    media_type: str


def _json(obj: Any) -> bytes:
    return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY)


# -- the computations (any thread; the server runs them on its worker) ---------------------------
def outputs(
    lm: LoadedModel, pixels: torch.Tensor, ablations: list[Ablation], amp_dtype: torch.dtype | None, device
) -> list[torch.Tensor]:
    """The outputs of one image (``[3, H, W]`` pixels: uint8, or float32 normalised) under several
    ablation sets, one batch."""
    with lm.lock:
        out = imp.masked_outputs(lm, device_input(lm, pixels, device), ablations, amp_dtype)
    return list(out.cpu())


def output_answer(
    image_id: str,
    lm: LoadedModel,
    pairs: Ablation,
    base: Output,
    out: Output,
    fmt: str,
    t0: float,
    cached: bool,
    precision: str,
) -> OutputAnswer:
    """The answer of ``GET …/output``: ``out`` (with ``pairs`` removed) and its change against ``base``."""
    kind = lm.output_kind
    meta = output_meta(image_id, lm, pairs, base, out, cached, precision)
    if fmt == "json":
        meta["output"] = describe(lm, out.tensor)
        meta["timing_ms"] = {"total": (time.perf_counter() - t0) * 1000}
        return OutputAnswer([_json(meta)], {}, "application/json")
    arrays = {"output": _plain(kind, out.tensor)}
    if pairs:
        arrays["baseline"] = _plain(kind, base.tensor)
    if kind == "classes":
        meta["top5"] = describe(lm, out.tensor)["top5"]
    meta_json = json.dumps(meta, ensure_ascii=True, separators=(",", ":"))
    name = answer_stem("output", image_id, lm.id, *ablate_detail(pairs))
    headers = {"X-Headscope-Meta": meta_json}
    if fmt == "safetensors":
        from safetensors.numpy import save

        body = save(arrays, metadata={"headscope": meta_json})
        headers["Content-Disposition"] = f'attachment; filename="{name}.safetensors"'
    else:
        buf = io.BytesIO()
        np.save(buf, arrays["output"], allow_pickle=False)
        body = buf.getvalue()
        headers["Content-Disposition"] = f'attachment; filename="{name}.npy"'
    return OutputAnswer([body], headers, "application/octet-stream")


def output_meta(
    image_id: str, lm: LoadedModel, pairs: Ablation, base: Output, out: Output, cached: bool, precision: str
) -> dict:
    """What the answer of ``GET …/output`` says besides the output itself (and its timing): the
    answer (:func:`output_answer`) and the Python API (``Scope.output``) both come from here."""
    kind = lm.output_kind
    return {
        "model": lm.id,
        "image_id": image_id,
        "kind": kind,
        "ablated": [list(pair) for pair in pairs],
        "ablate": ablate_text(pairs),
        "metric": METRICS[kind],
        "metric_text": METRIC_TEXT[METRICS[kind]],
        "input_size": list(out.input_size),
        "image_size": list(out.image_size),
        "note": lm.output_note or None,
        "change": describe_change(lm, base.tensor, out.tensor) if pairs else None,
        "precision": precision,
        "cached": cached,
    }


def _plain(kind: str, t: torch.Tensor) -> np.ndarray:
    """Binary answers carry probabilities (not log-probabilities) for classifiers."""
    return np.ascontiguousarray((t.exp() if kind == "classes" else t).float().numpy())


def _locked(fn, lm: LoadedModel, *args) -> Any:
    with lm.lock:
        return fn(lm, *args)


def _on_device(fn, lm: LoadedModel, pixels: torch.Tensor, device, *args) -> Any:
    """``fn(lm, pixels as a batch of one on device, *args)`` under the model's lock."""
    with lm.lock:
        return fn(lm, device_input(lm, pixels, device), *args)


def importance_work(
    image_id: str,
    lm: LoadedModel,
    prep: preprocess.PreparedPixels,
    method: str,
    progress: TaskProgress,
    amp_dtype: torch.dtype | None,
    device,
) -> TaskWork:
    """Every head's importance (``GET …/importance``), in pieces: one unablated forward and one
    piece per block (``ablation``), or one forward and backward pass (``gradient``)."""
    t0 = time.perf_counter()
    L, H = lm.num_layers, lm.num_heads
    kind = lm.output_kind
    pixels = prep.raw
    res: dict[str, Any] = {
        "model": lm.id,
        "image_id": image_id,
        "method": method,
        "kind": kind,
        "layers": L,
        "heads": H,
        "input_size": list(prep.input_size),
        "precision": precision_name(amp_dtype),
    }
    if method == "gradient":
        progress.total, progress.stage = 1.0, "forward and backward pass"
        grad, loss = yield partial(_on_device, imp.gradient_importance, lm, pixels, device, amp_dtype)
        progress.advance(1.0, "done")
        res.update(
            metric=f"abs_grad_{kind}",
            metric_text=f"|d loss / d m_h| at m = 1; loss: {imp.LOSSES[kind]}",
            loss=imp.LOSSES[kind],
            loss_value=loss,
            importance=grad.tolist(),
        )
    else:
        # Units of work: blocks run per image; the baseline is one forward (L blocks, 1 image),
        # block l's piece runs L - l blocks for H images.
        progress.total = L + H * L * (L + 1) / 2
        progress.stage = "unablated forward"
        base = yield partial(_on_device, imp.baseline, lm, pixels, device, amp_dtype)
        progress.advance(L, "block 0")
        changes, kls = [], []
        for layer in range(L):
            r = yield partial(_locked, imp.sweep_block, lm, base, layer, amp_dtype)
            changes.append(r["change"].tolist())
            if "kl" in r:
                kls.append(r["kl"].tolist())
            progress.advance(H * (L - layer), f"block {layer + 1}" if layer + 1 < L else "done")
        del base
        res.update(metric=METRICS[kind], metric_text=METRIC_TEXT[METRICS[kind]], importance=changes)
        if kls:
            res["kl"] = kls
    res["timing_ms"] = {"compute": (time.perf_counter() - t0) * 1000}
    return res


def pruning_work(
    image_id: str,
    lm: LoadedModel,
    prep: preprocess.PreparedPixels,
    ranking: dict,
    points: int,
    progress: TaskProgress,
    amp_dtype: torch.dtype | None,
    device,
) -> TaskWork:
    """The pruning curve (``GET …/pruning``) from an importance ``ranking``, in pieces of a few
    masked forwards."""
    t0 = time.perf_counter()
    order = imp.pruning_order(torch.tensor(ranking["importance"]))
    steps = imp.pruning_steps(len(order), points)
    kind = lm.output_kind
    chunk = max(1, lm.num_heads)
    progress.total, progress.stage = float(len(steps)), "masked forwards"
    outs: list[torch.Tensor] = []
    for i in range(0, len(steps), chunk):
        sets = [tuple(sorted(order[:k])) for k in steps[i : i + chunk]]
        got = yield partial(outputs, lm, prep.raw, sets, amp_dtype, device)
        outs.extend(got)
        progress.advance(len(sets))
    base = outs[0][None]  # steps[0] == 0: the unablated model
    stacked = torch.stack(outs)
    res: dict[str, Any] = {
        "model": lm.id,
        "image_id": image_id,
        "kind": kind,
        "method": ranking["method"],
        "metric": METRICS[kind],
        "metric_text": METRIC_TEXT[METRICS[kind]],
        "order": [list(pair) for pair in order],
        "removed": steps,
        "change": change(kind, base, stacked).tolist(),
        "heads_total": len(order),
        "precision": precision_name(amp_dtype),
    }
    if kind == "classes":
        res["kl"] = kl_divergence(base, stacked).tolist()
        res["top1"] = stacked.argmax(-1).tolist()
        res["top1_kept"] = [t == res["top1"][0] for t in res["top1"]]
    res["timing_ms"] = {"compute": (time.perf_counter() - t0) * 1000}
    return res


def pruning_key(image_id: str, lm: LoadedModel, method: str, points: int) -> PruningKey:
    """The cache and task key of a pruning curve: ``points`` as the curve has them (at most
    heads + 1: ``points=1000`` and ``points=1001`` are one curve, computed once)."""
    total = lm.num_layers * lm.num_heads
    return PruningKey(image_id, lm.id, method, len(imp.pruning_steps(total, points)))


# -- the service --------------------------------------------------------------------------------
class AblationService(ImageTasks):
    """Model output, ablation and importance of uploaded images (:class:`~.tasks.ImageTasks`)."""

    # -- the model's output ----------------------------------------------------------------
    async def outputs(
        self,
        image_id: str,
        lm: LoadedModel,
        ablations: list[Ablation],
    ) -> tuple[list[Output], bool]:
        """The outputs of an image under each ablation set (cached), and whether all came from
        the cache (ImageNotFound once the image is gone)."""
        found: dict[Ablation, Output] = {}
        for a in dict.fromkeys(ablations):
            hit = self.cache.get(OutputKey(image_id, lm.id, a))
            if hit is not None:
                found[a] = hit
        missing = [a for a in dict.fromkeys(ablations) if a not in found]
        if missing:
            prep = await self.prepared(self.uploads.require(image_id), lm)
            piece = partial(outputs, lm, prep.raw, missing, self.worker.amp_dtype, self.device)
            tensors = await wait_for_result(
                asyncio.ensure_future(self.piece(piece)), self.deadline(), current_client_left()
            )
            for a, t in zip(missing, tensors):
                out = Output(t, prep.input_size, prep.image_size)
                found[a] = out
                self.cache.put(OutputKey(image_id, lm.id, a), out, t.nbytes + OUTPUT_OVERHEAD_BYTES)
        return [found[a] for a in ablations], not missing

    async def output(
        self,
        image_id: str,
        model_id: str | None,
        ablate: str = "",
        fmt: str = "json",
    ) -> OutputAnswer:
        """``GET …/output``: the model's output with the ``ablate`` heads removed."""
        t0 = time.perf_counter()
        lm = await self.model(model_id)
        pairs = lm.ablation(ablate)
        (base, out), cached = await self.outputs(image_id, lm, [(), pairs])
        return await self.worker.run_answer(
            output_answer, image_id, lm, pairs, base, out, fmt, t0, cached, self.worker.precision
        )

    # -- importance and the pruning curve ------------------------------------------------------
    async def importance(
        self,
        image_id: str,
        model_id: str | None,
        method: str = "ablation",
        wait: float | None = None,
    ) -> dict:
        """``GET …/importance``: every head's importance.

        Args:
            wait: answer ``{"pending": progress}`` after this many seconds instead of a timeout
                (the computation goes on; the route answers 202).
        """
        lm = await self.model(model_id)
        refuse_windowed_ablation(lm.windowed, "importance")
        return await self._importance(image_id, lm, method, wait)

    async def _importance(
        self,
        image_id: str,
        lm: LoadedModel,
        method: str,
        wait: float | None,
        upload: Upload | None = None,
        deadline: float | None = None,
        bounded: bool = True,
    ) -> dict:
        async def compute(progress: TaskProgress, upload: Upload) -> dict:
            prep = await self.prepared(upload, lm)
            work = importance_work(image_id, lm, prep, method, progress, self.worker.amp_dtype, self.device)
            return await run_on(work, self.piece)

        key = ImportanceKey(image_id, lm.id, method)
        return await self.result(key, "importance", image_id, compute, wait, upload, deadline, bounded)

    async def pruning(
        self,
        image_id: str,
        model_id: str | None,
        method: str = "ablation",
        points: int = DEFAULT_POINTS,
        wait: float | None = None,
    ) -> dict:
        """``GET …/pruning``: the output change as heads are removed, least important first
        (``wait`` as for :meth:`importance`); the importance first if needed."""
        lm = await self.model(model_id)
        refuse_windowed_ablation(lm.windowed, "pruning")
        key = pruning_key(image_id, lm, method, points)
        hit = self.cache.get(key)
        if hit is not None:
            return {**hit, "cached": True}
        upload = self.uploads.require(image_id)

        async def compute(progress: TaskProgress, upload: Upload) -> dict:
            # The ranking first, inside this task: a request that left with a 202 (wait=) leaves
            # the whole curve running, and its progress reports the ranking's meanwhile.
            # Unbounded: this task holds the slot already; cancelling it cancels the ranking too,
            # unless another request waits for that.
            progress.waiting_for = lambda: self.tasks.progress(ImportanceKey(image_id, lm.id, method))
            try:
                ranking = await self._importance(
                    image_id, lm, method, None, upload, deadline=time.monotonic() + TASK_DEADLINE_S, bounded=False
                )
            finally:
                progress.waiting_for = None
            progress.started = time.monotonic()  # its own elapsed time and time left, from here
            prep = await self.prepared(upload, lm)
            work = pruning_work(image_id, lm, prep, ranking, key.points, progress, self.worker.amp_dtype, self.device)
            return await run_on(work, self.piece)

        return await self.result(key, "pruning", image_id, compute, wait, upload)

    # -- progress ------------------------------------------------------------------------
    def _key(self, what: str, image_id: str, lm: LoadedModel, method: str, points: int = DEFAULT_POINTS):
        if what == "importance":
            return ImportanceKey(image_id, lm.id, method)
        return pruning_key(image_id, lm, method, points)

    def progress(
        self, what: str, image_id: str, model_id: str | None, method: str, points: int = DEFAULT_POINTS
    ) -> dict:
        """What ``GET …/{importance,pruning}/progress`` reports (ImageNotFound for an unknown image).

        ``state``: ``done`` (cached: the GET answers at once), ``running`` (with ``done``,
        ``total``, ``fraction``, ``eta_s``) or ``idle`` (nobody asked yet, or a GET is about
        to start it).
        """
        mid = self.registry.resolve(model_id)
        refuse_windowed_ablation(self.registry.windowed(mid), what)  # loaded or not: one answer
        lm = self.registry.loaded(mid)
        idle = {"state": "idle", "task": what, "done": 0, "total": None, "fraction": 0.0}
        if lm is not None:
            key = self._key(what, image_id, lm, method, points)
            state = self.state(key, what)  # a pruning curve's reports its ranking's while that runs
            if state is not None:
                return state
        if self.uploads.get(image_id) is None:
            raise ImageNotFound(image_id)
        return idle
