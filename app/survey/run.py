"""``headscope survey``: list the pictures, skip what is done, run an engine, write, report progress."""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import Settings
from ..engine.device import autocast_dtype, precision_name
from ..engine.stats import DEFAULT_MASS
from ..zoo.ids import ModelSpec
from .compute import Result
from .faithfulness import FaithfulnessPlan
from .output import FAILURES_DIR, SurveyOutput, check_target, faithfulness_path
from .sources import SourceError, list_images

# Settings the workers take from the driver (file size, decoding, resize, precision, where models live).
SHARED_SETTINGS = ("model", "models_dir", "max_upload_bytes", "max_image_pixels", "max_aspect", "resize", "precision")


@dataclass
class Summary:
    """What one run did."""

    listed: int  # pictures in SOURCE
    skipped: int  # already in the output (--resume)
    surveyed: int  # pictures with rows written by this run
    failed: int  # pictures recorded as failures by this run
    rows: int
    seconds: float
    interrupted: bool = False
    tests: int = 0  # --faithfulness: rows (picture x method) of the perturbation test written
    tests_out: Path | None = None  # where they are

    @property
    def images_per_s(self) -> float:
        return (self.surveyed + self.failed) / self.seconds if self.seconds > 0 else 0.0


def run_meta(
    model_id: str,
    device_type: str,
    settings: Settings,
    similarity: bool,
    ranks: bool,
    faithfulness: FaithfulnessPlan | None = None,
) -> dict[str, Any]:
    """What decides a run's values: written into every part, compared on ``--resume``."""
    amp = autocast_dtype(device_type, settings.precision)
    meta = {
        "model": model_id,
        "resize": settings.resize,
        "max_aspect": settings.max_aspect,
        "precision": precision_name(amp),
        "mass": DEFAULT_MASS,
        "similarity": similarity,
        "ranks": ranks,
    }
    if faithfulness is not None:  # absent otherwise: surveys written before the option resume as they were
        meta["faithfulness"] = faithfulness.meta()
    return meta


def _missing(out: Path | str, faithfulness: bool) -> list[Path]:
    """The folders :class:`SurveyOutput` will make for ``out`` that are not there yet, deepest first."""
    out = Path(out)
    tops = [out / FAILURES_DIR, out] + ([faithfulness_path(out)] if faithfulness else [])
    made: list[Path] = []
    for top in tops:
        for p in [top, *top.parents]:
            if p.exists():
                break
            if p not in made:
                made.append(p)
    return sorted(made, key=lambda p: len(p.parts), reverse=True)


def _remove_empty(folders: list[Path]) -> None:
    """Remove those of ``folders`` that are empty (never anything in them: rmdir, not rmtree)."""
    for p in folders:
        try:
            p.rmdir()
        except OSError:  # something was written there, or someone else's meanwhile
            pass


@contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM behaves as Ctrl-C for the run (so the buffer is written before leaving)."""

    def handler(signum, frame):
        raise KeyboardInterrupt

    try:
        old = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


MAX_BATCH_SIZE = 4096  # pictures per forward; at most 4 batches buffered, so memory stays bounded


def survey(
    source: Path | str,
    out: Path | str,
    *,
    engine: str = "local",
    address: str | None = None,
    model: str | None = None,
    device: str | None = None,
    batch_size: int = 8,
    limit: int | None = None,
    resume: bool = False,
    similarity: bool = False,
    ranks: bool = False,
    actors: int | None = None,
    progress: bool = True,
    part_images: int = 256,
    settings: Settings | None = None,
    faithfulness: str | None = None,
    target: str | None = None,
    fractions: str | None = None,
    protocol: str | None = None,
) -> Summary:
    """Survey every picture of ``source`` into the Parquet dataset folder ``out``.

    Args:
        source: a folder (recursive), a text file of image paths, or one image.
        out: the output folder (see :mod:`app.survey.output`).
        engine: ``local`` (this process) or ``ray`` (Ray Data; see :mod:`app.survey.ray_engine`).
        address: the Ray cluster to join (else ``RAY_ADDRESS``, else a local Ray).
        model: model id (default ``HEADSCOPE_MODEL``).
        device: ``auto``/``cpu``/``cuda``... (local: ``HEADSCOPE_DEVICE``; ray: each actor's GPU or CPU).
        batch_size: pictures per forward pass.
        limit: survey at most this many pictures in this run (after skipping those done).
        resume: continue an output folder, skipping pictures already in it.
        similarity: also compute the head-pair similarity column.
        ranks: also compute the per-layer rank columns.
        actors: Ray actors (default one per GPU, else one per node).
        progress: show a progress bar (pictures/s) on stderr.
        part_images: pictures per written part.
        settings: decoding and model settings (default: from the environment).
        faithfulness: relevance methods (``chefer,grad_attention,attention,rollout,random``) whose
            perturbation test goes into a second table, ``OUT.faithfulness.parquet``
            (:func:`~app.survey.output.faithfulness_path`); None: no test.
        target: the target the maps explain (default: the model's; see
            :func:`app.engine.relevance.parse_target`).
        fractions: the fractions of patches removed (default 0, 0.1, ..., 0.9).
        protocol: ``live`` (default) or ``paper`` (Chefer et al. 2021's; class targets only).
    """
    if engine not in ("local", "ray"):
        raise ValueError(f"engine {engine!r}: use local or ray")
    if not 1 <= batch_size <= MAX_BATCH_SIZE:  # 4 batches are buffered: the bound is the memory's promise
        raise ValueError(f"--batch-size must be 1 to {MAX_BATCH_SIZE:,} (pictures per forward pass)")
    if limit is not None and limit < 0:
        raise ValueError("--limit must be 0 or more")
    if actors is not None and actors < 1:  # before Ray starts (0 meant the default, silently)
        raise ValueError("--actors must be at least 1 (leave it out for one per GPU, else one per node)")
    if engine == "local" and (actors is not None or address is not None):  # taken and ignored, before
        raise ValueError("--actors and --address belong to --engine ray")
    if faithfulness is None and (target is not None or fractions is not None or protocol is not None):
        raise ValueError("--target, --fractions and --protocol belong to --faithfulness [METHODS]")
    # methods, fractions, protocol and the target's spelling are checked before anything loads
    plan = FaithfulnessPlan.parse(faithfulness, target, fractions, protocol) if faithfulness is not None else None
    weak = plan.weak() if plan is not None else None
    if weak:
        print(f"headscope survey: warning: --target {plan.target}: {weak}", file=sys.stderr)  # type: ignore[union-attr]
    settings = settings or Settings()
    model_id = ModelSpec.parse(model or settings.model).id
    t0 = time.monotonic()
    items = list_images(source)
    if not items:  # said before a model loads or a folder is made: there is nothing to survey
        raise SourceError(f"no images found in {source} (hidden files and folders are skipped)")
    check_target(out, resume, faithfulness=plan is not None)

    surveyor = ray_engine = None
    if engine == "local":
        from .compute import Surveyor

        surveyor = Surveyor(model, device, batch_size, similarity, settings, ranks, faithfulness=plan)
        device_type = surveyor.device.type
    else:
        from .ray_engine import RayEngine

        ray_engine = RayEngine(address, actors, device)
        # what the actors could not load is refused here, as the local engine's Surveyor does
        ray_engine.check(model or settings.model, settings.models_dir)
        device_type = ray_engine.start()
    made = _missing(out, plan is not None)
    try:
        meta = run_meta(model_id, device_type, settings, similarity, ranks, plan)
        output = SurveyOutput(out, meta, resume=resume, part_images=part_images, faithfulness=plan is not None)
    except BaseException:
        if ray_engine is not None:
            ray_engine.stop()
        _remove_empty(made)  # SurveyOutput refused after making some of them
        raise
    done = output.done() if resume else set()
    todo = [it for it in items if it.image not in done]
    skipped = len(items) - len(todo)
    if limit is not None:
        todo = todo[:limit]

    from tqdm import tqdm

    bar = tqdm(
        total=len(todo),
        unit="img",
        desc=f"survey ({engine})",
        disable=not progress,
        file=sys.stderr,
        dynamic_ncols=True,
        smoothing=0.05,
        # parts of a picture between its perturbed forwards: one decimal, not float's 3.9999999999999964
        bar_format=None
        if plan is None
        else "{desc}: {percentage:3.0f}%|{bar}| {n:.1f}/{total} [{elapsed}<{remaining}, {rate_fmt}{postfix}]",
    )
    counts: dict[str, float] = {"failed": 0, "done": 0}

    def ahead(share: float) -> None:  # a batch of perturbed forwards: part of a picture done
        bar.update(share)

    if surveyor is not None and plan is not None:
        surveyor.on_progress = ahead

    def emit(res: Result) -> None:
        output.add(res.rows, res.failures, res.images, res.faithfulness)
        counts["failed"] += res.failures.num_rows
        counts["done"] += res.images
        # the pictures done, exactly: the shares said ahead only moved the bar between them
        bar.update(counts["done"] - bar.n)
        if counts["failed"]:
            bar.set_postfix(failed=counts["failed"], refresh=False)

    interrupted = failed = False
    try:
        with _sigterm_interrupts():
            if not todo:
                pass
            elif engine == "local":
                from .local import run_local

                assert surveyor is not None
                run_local(todo, surveyor, emit)
            else:
                assert ray_engine is not None
                shared = settings.model_dump(include=set(SHARED_SETTINGS))
                shared["models_dir"] = str(shared["models_dir"])
                ray_engine.run(
                    todo,
                    emit,
                    model=model,
                    batch_size=batch_size,
                    similarity=similarity,
                    ranks=ranks,
                    settings=shared,
                    faithfulness=plan,
                )
    except KeyboardInterrupt:
        interrupted = True
    except BaseException:
        failed = True
        raise
    finally:
        output.close()  # whatever was computed is written, also on Ctrl-C / SIGTERM
        bar.close()
        if ray_engine is not None:
            ray_engine.stop()
        if failed:
            # A run refused once it had made the folders (a Ray actor that cannot load the model)
            # leaves none behind, as a refusal before the model loads does.
            _remove_empty(made)
    return Summary(
        listed=len(items),
        skipped=skipped,
        surveyed=output.images_written,
        failed=output.failures_written,
        rows=output.rows_written,
        seconds=time.monotonic() - t0,
        interrupted=interrupted,
        tests=output.tests_written,
        tests_out=output.faith_out,
    )
