"""The request path of the model's output, head ablation and head importance.

* :meth:`AblationService.output`: the model's own output (saliency, classes or embedding) for
  an image with heads removed, and its change against the unablated output. Both come from one
  batched forward on the worker thread and are cached per image, model and ablation set.
* :meth:`AblationService.importance`: every head's importance (exact sweep or gradient),
  :meth:`AblationService.pruning`: the pruning curve. Both run as :class:`~.tasks.Tasks` in
  pieces on the worker thread so uploads interleave, report :class:`~.tasks.Progress`
  (``GET …/importance/progress``) and are cached.

The attention endpoints' ``ablate`` goes through :class:`~.service.AttentionService` (the
capture is cached per image and ablation set there).
"""

from __future__ import annotations

import asyncio
import io
import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson
import torch

from ..engine import importance as imp
from ..engine.ablation import Ablation, ablate_text, parse_ablate, refuse_windowed
from ..engine.device import is_oom
from ..engine.output import METRIC_TEXT, METRICS, change, describe, describe_change, kl_divergence
from .cache import ImportanceKey, OutputKey, PruningKey
from .service import ClientGone, Disconnected
from .tasks import ClientLeft, Progress, Tasks
from .worker import OutOfMemory

if TYPE_CHECKING:
    from ..zoo.loaded import LoadedModel
    from . import images
    from .service import AttentionService

OUTPUT_OVERHEAD_BYTES = 1024
RESULT_BYTES = 64 * 1024  # what a cached importance or pruning answer is charged (small JSON)
DEFAULT_POINTS = 25  # points of the pruning curve


class ImageEvicted(LookupError):
    """The upload left the cache before a task could read it (answered 404)."""


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


class AblationService:
    """Model output, ablation and importance on top of :class:`AttentionService`.

    Args:
        service: the attention service (its cache, uploads, worker, models and settings).
        max_tasks: importance sweeps and pruning curves computed at once; more get 429.
    """

    def __init__(self, service: AttentionService, max_tasks: int = 4):
        self.svc = service
        self.tasks = Tasks(max_tasks)

    @property
    def worker(self):
        return self.svc.worker

    # -- pieces ---------------------------------------------------------------------------
    async def _prepared(self, image_id: str, lm: LoadedModel) -> images.Prepared | None:
        upload = self.svc.upload_of(image_id)
        if upload is None:
            return None
        # Within the decode budget, like every decode (service.prepare).
        return await self.svc.prepare(upload.data, lm)

    def _on_device(self, lm: LoadedModel, pixels: torch.Tensor) -> torch.Tensor:
        return pixels[None].to(self.svc.registry.device)

    async def _piece(self, fn, *args) -> Any:
        """One piece of work on the worker thread; running out of device memory is a 503."""
        try:
            return await self.worker.run_in_worker(fn, *args)
        except RuntimeError as e:
            if is_oom(e):
                raise OutOfMemory("the image does not fit in device memory; try a smaller image") from None
            raise

    async def _in_worker(self, deadline: float, is_disconnected: Disconnected | None, fn, *args) -> Any:
        """Run ``fn`` on the worker thread; give up at the deadline or when the client goes."""
        fut = asyncio.ensure_future(self._piece(fn, *args))
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise asyncio.TimeoutError()
            done, _ = await asyncio.wait({fut}, timeout=min(0.1, remaining))
            if done:
                return fut.result()
            if is_disconnected is not None and await is_disconnected():
                raise ClientGone("the client closed the connection before the answer")

    def _deadline(self) -> float:
        return time.monotonic() + self.svc.settings.request_timeout_s

    # -- the model's output ----------------------------------------------------------------
    def _outputs(self, lm: LoadedModel, pixels: torch.Tensor, ablations: list[Ablation]) -> list[torch.Tensor]:
        """Worker thread: the outputs of one image under several ablation sets, one batch."""
        with lm.lock:
            out = imp.masked_outputs(lm, self._on_device(lm, pixels), ablations, self.worker.amp_dtype)
        return list(out.cpu())

    async def outputs(
        self,
        image_id: str,
        lm: LoadedModel,
        ablations: list[Ablation],
        is_disconnected: Disconnected | None = None,
    ) -> tuple[list[Output], bool] | None:
        """The outputs of an image under each ablation set (cached), and whether all came from
        the cache; None once the image is gone."""
        found: dict[Ablation, Output] = {}
        for a in dict.fromkeys(ablations):
            hit = self.svc.cache.get(OutputKey(image_id, lm.id, a))
            if hit is not None:
                found[a] = hit
        missing = [a for a in dict.fromkeys(ablations) if a not in found]
        if missing:
            prep = await self._prepared(image_id, lm)
            if prep is None:
                return None
            tensors = await self._in_worker(self._deadline(), is_disconnected, self._outputs, lm, prep.pixels, missing)
            for a, t in zip(missing, tensors):
                out = Output(t, prep.input_size, prep.image_size)
                found[a] = out
                self.svc.cache.put(OutputKey(image_id, lm.id, a), out, t.nbytes + OUTPUT_OVERHEAD_BYTES)
        return [found[a] for a in ablations], not missing

    async def output(
        self,
        image_id: str,
        model_id: str | None,
        ablate: str = "",
        fmt: str = "json",
        is_disconnected: Disconnected | None = None,
    ) -> OutputAnswer | None:
        """``GET …/output``: the model's output with the ``ablate`` heads removed."""
        t0 = time.perf_counter()
        lm = await self.svc.model(model_id)
        pairs = parse_ablate(ablate, lm.num_layers, lm.num_heads, windowed=lm.stages is not None)
        res = await self.outputs(image_id, lm, [(), pairs], is_disconnected)
        if res is None:
            return None
        (base, out), cached = res
        return await self.worker.run_in_worker(self._output_answer, image_id, lm, pairs, base, out, fmt, t0, cached)

    def _output_answer(
        self,
        image_id: str,
        lm: LoadedModel,
        pairs: Ablation,
        base: Output,
        out: Output,
        fmt: str,
        t0: float,
        cached: bool,
    ) -> OutputAnswer:
        kind = lm.output_kind
        meta: dict[str, Any] = {
            "model": lm.id,
            "image_id": image_id,
            "kind": kind,
            "ablated": [list(p) for p in pairs],
            "ablate": ablate_text(pairs),
            "metric": METRICS[kind],
            "metric_text": METRIC_TEXT[METRICS[kind]],
            "input_size": list(out.input_size),
            "image_size": list(out.image_size),
            "note": lm.output_note or None,
            "change": describe_change(lm, base.tensor, out.tensor) if pairs else None,
            "cached": cached,
        }
        if fmt == "json":
            meta["output"] = describe(lm, out.tensor)
            meta["timing_ms"] = {"total": (time.perf_counter() - t0) * 1000}
            return OutputAnswer([_json(meta)], {}, "application/json")
        arrays = {"output": self._plain(kind, out.tensor)}
        if pairs:
            arrays["baseline"] = self._plain(kind, base.tensor)
        if kind == "classes":
            meta["top5"] = describe(lm, out.tensor)["top5"]
        meta_json = json.dumps(meta, ensure_ascii=True, separators=(",", ":"))
        name = f"output-{image_id}" + (f"-ablated{len(pairs)}" if pairs else "")
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

    @staticmethod
    def _plain(kind: str, t: torch.Tensor) -> np.ndarray:
        """Binary answers carry probabilities (not log-probabilities) for classifiers."""
        return np.ascontiguousarray((t.exp() if kind == "classes" else t).float().numpy())

    # -- importance ----------------------------------------------------------------------
    def _key(self, what: str, image_id: str, lm: LoadedModel, method: str, points: int = DEFAULT_POINTS):
        if what == "importance":
            return ImportanceKey(image_id, lm.id, method)
        return PruningKey(image_id, lm.id, method, points)

    async def importance(
        self,
        image_id: str,
        model_id: str | None,
        method: str = "ablation",
        is_disconnected: Disconnected | None = None,
        wait: float | None = None,
    ) -> dict | None:
        """``GET …/importance``: every head's importance; None once the image is gone.

        Args:
            wait: answer ``{"pending": progress}`` after this many seconds instead of a timeout
                (the computation goes on; the route answers 202).
        """
        lm = await self.svc.model(model_id)
        refuse_windowed(lm.stages is not None, "importance")
        return await self._importance(image_id, lm, method, is_disconnected, wait)

    async def _importance(
        self,
        image_id: str,
        lm: LoadedModel,
        method: str,
        is_disconnected: Disconnected | None,
        wait: float | None = None,
    ) -> dict | None:
        key = ImportanceKey(image_id, lm.id, method)
        hit = self.svc.cache.get(key)
        if hit is not None:
            return {**hit, "cached": True}
        if self.svc.upload_of(image_id) is None:
            return None

        async def work(progress: Progress) -> dict:
            res = await self._importance_task(image_id, lm, method, progress)
            self.svc.cache.put(key, res, RESULT_BYTES)
            return res

        return await self._wait(key, "importance", work, is_disconnected, wait)

    async def _wait(
        self, key, name: str, work, is_disconnected: Disconnected | None, wait: float | None = None
    ) -> dict | None:
        deadline = self._deadline() if wait is None else min(self._deadline(), time.monotonic() + wait)
        try:
            res = await self.tasks.run(key, name, work, deadline, is_disconnected)
        except ClientLeft as e:
            raise ClientGone(str(e)) from None
        except ImageEvicted:
            return None
        except asyncio.TimeoutError:
            progress = self.tasks.progress(key)
            if wait is None or progress is None:
                raise
            return {"pending": progress.as_dict()}
        return {**res, "cached": False}

    async def _importance_task(self, image_id: str, lm: LoadedModel, method: str, progress: Progress) -> dict:
        t0 = time.perf_counter()
        prep = await self._prepared(image_id, lm)
        if prep is None:
            raise ImageEvicted(image_id)
        L, H = lm.num_layers, lm.num_heads
        kind = lm.output_kind
        res: dict[str, Any] = {
            "model": lm.id,
            "image_id": image_id,
            "method": method,
            "kind": kind,
            "layers": L,
            "heads": H,
            "input_size": list(prep.input_size),
        }
        if method == "gradient":
            progress.total, progress.stage = 1.0, "forward and backward pass"
            grad, loss = await self._piece(self._gradient, lm, prep.pixels)
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
            base = await self._piece(self._baseline, lm, prep.pixels)
            progress.advance(L, "block 0")
            rows, kls = [], []
            for layer in range(L):
                r = await self._piece(self._sweep_block, lm, base, layer)
                rows.append(r["change"].tolist())
                if "kl" in r:
                    kls.append(r["kl"].tolist())
                progress.advance(H * (L - layer), f"block {layer + 1}" if layer + 1 < L else "done")
            del base
            res.update(metric=METRICS[kind], metric_text=METRIC_TEXT[METRICS[kind]], importance=rows)
            if kls:
                res["kl"] = kls
        res["timing_ms"] = {"compute": (time.perf_counter() - t0) * 1000}
        return res

    def _baseline(self, lm: LoadedModel, pixels: torch.Tensor) -> imp.Baseline:
        with lm.lock:
            return imp.baseline(lm, self._on_device(lm, pixels), self.worker.amp_dtype)

    def _sweep_block(self, lm: LoadedModel, base: imp.Baseline, layer: int) -> dict:
        with lm.lock:
            return imp.sweep_block(lm, base, layer, self.worker.amp_dtype)

    def _gradient(self, lm: LoadedModel, pixels: torch.Tensor) -> tuple[torch.Tensor, float]:
        with lm.lock:
            return imp.gradient_importance(lm, self._on_device(lm, pixels), self.worker.amp_dtype)

    # -- pruning curve -------------------------------------------------------------------
    async def pruning(
        self,
        image_id: str,
        model_id: str | None,
        method: str = "ablation",
        points: int = DEFAULT_POINTS,
        is_disconnected: Disconnected | None = None,
        wait: float | None = None,
    ) -> dict | None:
        """``GET …/pruning``: the output change as heads are removed, least important first
        (``wait`` as for :meth:`importance`)."""
        lm = await self.svc.model(model_id)
        refuse_windowed(lm.stages is not None, "pruning")
        key = PruningKey(image_id, lm.id, method, points)
        hit = self.svc.cache.get(key)
        if hit is not None:
            return {**hit, "cached": True}
        if self.svc.upload_of(image_id) is None:
            return None
        t_wait = time.monotonic()
        ranking = await self._importance(image_id, lm, method, is_disconnected, wait)
        if ranking is None or "pending" in ranking:
            if ranking is not None:
                p = ranking["pending"]
                ranking["pending"] = {**p, "task": "pruning", "stage": f"importance: {p['stage']}", "fraction": 0.0}
            return ranking
        if wait is not None:
            wait = max(0.0, wait - (time.monotonic() - t_wait))

        async def work(progress: Progress) -> dict:
            res = await self._pruning_task(image_id, lm, ranking, points, progress)
            self.svc.cache.put(key, res, RESULT_BYTES)
            return res

        return await self._wait(key, "pruning", work, is_disconnected, wait)

    async def _pruning_task(
        self, image_id: str, lm: LoadedModel, ranking: dict, points: int, progress: Progress
    ) -> dict:
        t0 = time.perf_counter()
        prep = await self._prepared(image_id, lm)
        if prep is None:
            raise ImageEvicted(image_id)
        order = imp.pruning_order(torch.tensor(ranking["importance"]))
        steps = imp.pruning_steps(len(order), points)
        kind = lm.output_kind
        chunk = max(1, lm.num_heads)
        progress.total, progress.stage = float(len(steps)), "masked forwards"
        outs: list[torch.Tensor] = []
        for i in range(0, len(steps), chunk):
            sets = [tuple(sorted(order[:k])) for k in steps[i : i + chunk]]
            got = await self._piece(self._outputs, lm, prep.pixels, sets)
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
            "order": [list(p) for p in order],
            "removed": steps,
            "change": change(kind, base, stacked).tolist(),
            "heads_total": len(order),
        }
        if kind == "classes":
            res["kl"] = kl_divergence(base, stacked).tolist()
            res["top1"] = stacked.argmax(-1).tolist()
            res["top1_kept"] = [t == res["top1"][0] for t in res["top1"]]
        res["timing_ms"] = {"compute": (time.perf_counter() - t0) * 1000}
        return res

    # -- progress ------------------------------------------------------------------------
    def progress(
        self, what: str, image_id: str, model_id: str | None, method: str, points: int = DEFAULT_POINTS
    ) -> dict | None:
        """What ``GET …/{importance,pruning}/progress`` reports; None for an unknown image.

        ``state``: ``done`` (cached: the GET answers at once), ``running`` (with ``done``,
        ``total``, ``fraction``, ``eta_s``) or ``idle`` (nobody asked yet, or a GET is about
        to start it).
        """
        mid = self.svc.registry.resolve(model_id)
        lm = self.svc.registry.loaded(mid)
        idle = {"state": "idle", "task": what, "done": 0, "total": None, "fraction": 0.0}
        if lm is None:
            return idle if self.svc.upload_of(image_id) is not None else None
        refuse_windowed(lm.stages is not None, what)
        key = self._key(what, image_id, lm, method, points)
        if self.svc.cache.get(key) is not None:
            return {"state": "done", "task": what, "done": 1, "total": 1, "fraction": 1.0}
        p = self.tasks.progress(key)
        if p is not None:
            return p.as_dict()
        if what == "pruning":
            # A pruning curve first waits for its importance ranking: report that.
            p = self.tasks.progress(ImportanceKey(image_id, lm.id, method))
            if p is not None:
                return {**p.as_dict(), "task": "pruning", "stage": f"importance: {p.stage}", "fraction": 0.0}
        return idle if self.svc.upload_of(image_id) is not None else None
