"""The Ray engine: a Ray Data pipeline, on a local Ray or across a cluster.

paths -> ``map_batches`` with :class:`SurveyActor` (a callable class: each actor loads the model
once, then reads, decodes and surveys batch after batch) -> back to the driver, which writes the
parts (:class:`app.survey.output.SurveyOutput`) as results stream in. Ray Data's streaming
executor bounds what is in flight (backpressure), so memory stays flat however many pictures
there are. Writing on the driver keeps one output folder, one ``--resume`` and one failure
table whatever the engine, and the workers need no shared storage for the output; they do need
to read SOURCE at the same path (a shared or copied folder).

Actors: one per GPU with ``num_gpus=1`` where the cluster has GPUs; otherwise one per node,
each with all of its node's CPUs (torch runs its own threads inside). ``--actors`` overrides.

Without ``--address`` (or ``RAY_ADDRESS``) a local Ray is started for the run, small (this
machine's CPUs, a 256 MiB object store, no dashboard, errors only) and shut down at the end;
its workers import the driver's code through ``PYTHONPATH``. Joining a cluster, the driver
ships its ``app`` package to the workers (``runtime_env`` ``py_modules``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from . import schema
from .compute import Result
from .sources import Item

if TYPE_CHECKING:
    from .faithfulness import FaithfulnessPlan

log = logging.getLogger(__name__)

LOCAL_OBJECT_STORE_BYTES = 256 * 2**20
# The package's parent: put on local workers' path, so they import the code the driver runs.
CODE_ROOT = Path(__file__).resolve().parents[2]


class RayMissing(RuntimeError):
    """``--engine ray`` without Ray installed."""


class ActorRefused(ValueError):
    """An actor could not survey with these options (``--target`` of the wrong kind for the model)."""


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def _from_ipc(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()


class SurveyActor:
    """Holds the model on one Ray worker; turns a batch of paths into survey rows.

    Ray Data calls it with a batch of ``{"image", "path"}`` rows and gets back one row per
    batch: the rows, failures and (``--faithfulness``) the perturbation test's rows as Arrow IPC
    streams (tables of their own schemas in one output block), the number of pictures, and an
    ``error`` that stops the run: a ``--target`` the model does not take (found once the actor
    has the model; the driver has no model to check it against).
    """

    def __init__(
        self,
        model: str | None,
        device: str | None,
        batch_size: int,
        similarity: bool,
        ranks: bool,
        settings: dict,
        faithfulness: dict | None = None,
    ):
        import ray
        import torch

        from ..config import Settings
        from ..engine.selection import SelectionError
        from ..serving import preprocess
        from ..serving.malloc import tune_malloc
        from .compute import Surveyor
        from .faithfulness import FaithfulnessPlan

        tune_malloc()
        config = Settings(**settings)
        preprocess.adopt_pixel_limit(config.max_image_pixels)
        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU")
        if cpus:
            torch.set_num_threads(max(1, int(cpus)))
        plan = FaithfulnessPlan.from_meta(faithfulness) if faithfulness is not None else None
        self.error = ""
        try:
            self.surveyor = Surveyor(model, device, batch_size, similarity, config, ranks, faithfulness=plan)
        except SelectionError as e:  # the target's kind, a windowed model
            self.error = str(e)

    def __call__(self, batch: pa.Table) -> pa.Table:
        items = [Item(i, p) for i, p in zip(batch.column("image").to_pylist(), batch.column("path").to_pylist())]
        if self.error:
            res = Result(schema.empty_rows(), schema.empty_failures())
        else:
            res = self.surveyor.process(items)
        return pa.table(
            {
                "rows": pa.array([_ipc(res.rows)], pa.large_binary()),
                "failures": pa.array([_ipc(res.failures)], pa.large_binary()),
                "faithfulness": pa.array([_ipc(res.faithfulness)], pa.large_binary()),
                "images": pa.array([len(items)], pa.int64()),
                "error": pa.array([self.error], pa.string()),
            }
        )


def _init(address: str | None) -> bool:
    """Join the cluster at ``address`` / ``RAY_ADDRESS``, or start a small local one; True if started."""
    import ray

    if ray.is_initialized():
        return False
    if address or os.environ.get("RAY_ADDRESS"):
        # The driver ships its own package (``headscope`` from a wheel, ``app/`` in a checkout) to
        # the workers, so every node runs the code that wrote the output's metadata; the workers
        # need the dependencies installed.
        ray.init(
            address=address,
            runtime_env={"py_modules": [str(Path(__file__).resolve().parents[1])]},
            logging_level=logging.ERROR,
            log_to_driver=False,
        )
        return False
    path = os.pathsep.join(p for p in (str(CODE_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    ray.init(
        num_cpus=os.cpu_count() or 1,
        object_store_memory=LOCAL_OBJECT_STORE_BYTES,
        include_dashboard=False,
        runtime_env={"env_vars": {"PYTHONPATH": path}},
        logging_level=logging.ERROR,
        log_to_driver=False,
    )
    return True


def plan_blocks(pictures: int, batch_size: int, actors: int) -> int:
    """How many blocks Ray Data cuts the pictures into: about four batches each, but at least one
    per actor while there are pictures for it (13 pictures in one block kept a second actor idle
    after it had loaded the model), at most 1000."""
    return min(max(pictures // max(1, batch_size * 4), min(actors, pictures), 1), 1000)


def plan_actors(resources: dict[str, float], nodes: list[dict[str, Any]], actors: int | None) -> tuple[int, dict]:
    """How many actors, and the resources of each: ``(count, {"num_cpus": .., "num_gpus": ..})``."""
    gpus = int(resources.get("GPU", 0))
    if gpus:
        return (actors or gpus), {"num_gpus": 1, "num_cpus": 1}
    cpus = [n.get("Resources", {}).get("CPU", 1) for n in nodes if n.get("Alive", True)] or [1]
    per = max(1, int(min(cpus)))
    return (actors or len(cpus)), {"num_cpus": per}


class RayEngine:
    """A Ray Data survey: :meth:`start` joins or starts Ray and plans the actors, :meth:`run`
    streams the results to the driver, :meth:`stop` shuts a Ray it started down.

    Args:
        address: a cluster to join (``host:port`` or ``ray://host:10001``); None: ``RAY_ADDRESS``,
            else a local Ray for this run.
        actors: how many actors (default: one per GPU, else one per node).
        device: the actors' device (default: ``cuda`` on GPU actors, else ``cpu``).
    """

    def __init__(self, address: str | None = None, actors: int | None = None, device: str | None = None):
        try:
            import ray  # noqa: F401
            import ray.data  # noqa: F401
        except ImportError:
            raise RayMissing("--engine ray needs Ray: pip install 'headscope[ray]'") from None
        self.address = address
        self.actors = actors
        self.device = device
        self.started = False
        self.count = 0
        self.per_actor: dict[str, Any] = {}

    def start(self) -> str:
        """Join or start Ray; returns the device type the actors will use."""
        import ray
        import ray.data

        self.started = _init(self.address)
        logging.getLogger("ray.data").setLevel(logging.ERROR)
        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = False  # the survey's own bar counts pictures
        ctx.print_on_execution_start = False
        self.count, self.per_actor = plan_actors(ray.cluster_resources(), ray.nodes(), self.actors)
        if self.device is None:
            self.device = "cuda" if self.per_actor.get("num_gpus") else "cpu"
        log.info("ray: %d actor(s) with %s, device %s", self.count, self.per_actor, self.device)
        return self.device.split(":")[0]

    def run(
        self,
        items: list[Item],
        emit: Callable[[Result], None],
        *,
        model: str | None,
        batch_size: int,
        similarity: bool,
        ranks: bool,
        settings: dict,
        faithfulness: FaithfulnessPlan | None = None,
    ) -> None:
        """Survey ``items``, handing each batch's :class:`Result` to ``emit`` on the driver.

        Args:
            settings: the driver's decoding, resize and precision settings (workers use these,
                not their own environment, so every node computes the same rows).
            faithfulness: also the perturbation test of these maps (a second table).

        Raises:
            ActorRefused: the actors cannot run these options on this model (``--target``).
        """
        import ray.data

        if not self.started:
            settings = {k: v for k, v in settings.items() if k != "models_dir"}  # each node has its own
        blocks = plan_blocks(len(items), batch_size, self.count)
        paths = ray.data.from_items([{"image": it.image, "path": it.path} for it in items], override_num_blocks=blocks)
        ds = paths.map_batches(
            SurveyActor,
            fn_constructor_kwargs=dict(
                model=model,
                device=self.device,
                batch_size=batch_size,
                similarity=similarity,
                ranks=ranks,
                settings=settings,
                faithfulness=faithfulness.meta() if faithfulness is not None else None,
            ),
            batch_size=batch_size,
            batch_format="pyarrow",
            compute=ray.data.ActorPoolStrategy(size=self.count),
            **self.per_actor,
        )
        for batch in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
            out = batch if isinstance(batch, pa.Table) else pa.table(batch)
            for error in out.column("error").to_pylist():
                if error:
                    raise ActorRefused(error)
            columns = (out.column(c).to_pylist() for c in ("rows", "failures", "faithfulness"))
            for rows, fails, tests in zip(*columns):
                emit(Result(_from_ipc(rows), _from_ipc(fails), _from_ipc(tests)))

    def stop(self) -> None:
        import ray

        if self.started:
            ray.shutdown()
            self.started = False
