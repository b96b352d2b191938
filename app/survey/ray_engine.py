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

What is sure to fail is refused on the driver before Ray starts, in one line as the local engine
does: a model name timm does not know, a family Headscope cannot capture, and with a local Ray
(whose actors run on this machine) weights that cannot be had here or a device that is not here;
an address that nothing answers at (a TCP connection, a few seconds) or no cluster at ``auto``.
What only a node can find out (its weights, its devices) the actors say back
(:class:`ActorRefused`) instead of dying, which Ray would answer with pages of tracebacks and
restarts.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ..zoo.errors import first_line
from . import schema
from .compute import Result
from .sources import Item

if TYPE_CHECKING:
    from .faithfulness import FaithfulnessPlan

log = logging.getLogger(__name__)

LOCAL_OBJECT_STORE_BYTES = 256 * 2**20
# How long the driver waits for a TCP connection to ``--address`` before refusing it: Ray itself
# retries a silent address for minutes, printing warnings.
CONNECT_TIMEOUT_S = 5.0
# The package's parent: put on local workers' path, so they import the code the driver runs.
CODE_ROOT = Path(__file__).resolve().parents[2]


class RayUnavailable(RuntimeError):
    """Ray cannot run this survey (the command line says why in one line)."""


class RayMissing(RayUnavailable):
    """``--engine ray`` without Ray installed (or a ``ray://`` address without Ray Client)."""


class RayUnreachable(RayUnavailable):
    """``--address`` / ``RAY_ADDRESS`` names no Ray cluster that answers."""


class ActorRefused(ValueError):
    """An actor could not survey with these options (``--target`` of the wrong kind for the model, a
    model or device its node cannot load)."""


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
        from ..zoo.errors import ModelLoadError
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
        # The target's kind, a windowed model (SelectionError); a model this node cannot build or
        # get weights for (UnknownModelError, ModelLoadError); a device it lacks (ValueError). Said
        # back to the driver in one line: an exception here kills the actor, and Ray restarts it
        # and prints each death's traceback.
        except (SelectionError, ValueError, ModelLoadError) as e:
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


def host_port(address: str) -> tuple[str, int] | None:
    """``HOST:PORT`` or ``ray://HOST:PORT`` (``[::1]:6379`` too) as ``(host, port)``; None for the
    forms Ray resolves itself (``auto``, ``local``) and for what is not an address at all (Ray's
    own error says so)."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not (sep and host and port.isascii() and port.isdigit() and 0 < int(port) < 65536):
        return None
    return host.removeprefix("[").removesuffix("]"), int(port)


def check_address(address: str, flag: str) -> None:
    """Refuse an address that cannot work before ``ray.init`` tries it.

    Args:
        address: the cluster's address, as given.
        flag: where it was given (``--address`` or ``RAY_ADDRESS``), for the message.

    Raises:
        RayMissing: a ``ray://`` address without Ray Client installed.
        RayUnreachable: nothing accepts a TCP connection at ``HOST:PORT`` within
            :data:`CONNECT_TIMEOUT_S` (Ray itself would retry for minutes).
    """
    if address.startswith("ray://") and importlib.util.find_spec("grpc") is None:
        # what Ray Client needs; the ``ray`` extra (``ray[data]``) does not bring it
        raise RayMissing(f"a ray:// address ({flag}) joins through Ray Client, which needs: pip install 'ray[client]'")
    target = host_port(address)
    if target is None:
        return
    try:
        socket.create_connection(target, timeout=CONNECT_TIMEOUT_S).close()
    except OSError as e:
        why = e.strerror or str(e) or type(e).__name__
        raise RayUnreachable(
            f"cannot reach a Ray cluster at {address} ({flag}: {why}); is `ray start --head` running there? "
            f"Leave out {flag} to run a local Ray for this survey"
        ) from None


def _ray_initialized() -> bool:
    import ray

    return ray.is_initialized()


def _init(address: str | None) -> bool:
    """Join the cluster at ``address`` / ``RAY_ADDRESS``, or start a small local one; True if started.

    Raises:
        RayMissing, RayUnreachable: see :func:`check_address`; RayUnreachable also when Ray finds
            no cluster (``auto`` with none running on this machine).
    """
    import ray

    if ray.is_initialized():
        return False
    given = address or os.environ.get("RAY_ADDRESS")
    if given:
        flag = "--address" if address else "RAY_ADDRESS"
        check_address(given, flag)
        try:
            # The driver ships its own package (``headscope`` from a wheel, ``app/`` in a checkout)
            # to the workers, so every node runs the code that wrote the output's metadata; the
            # workers need the dependencies installed.
            ray.init(
                address=address,
                runtime_env={"py_modules": [str(Path(__file__).resolve().parents[1])]},
                logging_level=logging.ERROR,
                log_to_driver=False,
            )
        except ConnectionError as e:  # ``auto`` with no cluster running here, a cluster that went away
            # Ray's own words for ``auto`` send the user to the flag they just gave
            where = "no Ray cluster found at 'auto'" if given == "auto" else f"cannot join the Ray cluster at {given}"
            why = "" if given == "auto" else f": {first_line(e)}"
            raise RayUnreachable(
                f"{where} ({flag}{why}); start one with `ray start --head`, "
                f"or leave out {flag} to run a local Ray for this survey"
            ) from None
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
    """A Ray Data survey: :meth:`check` refuses what cannot work before Ray starts, :meth:`start`
    joins or starts Ray and plans the actors, :meth:`run` streams the results to the driver,
    :meth:`stop` shuts a Ray it started down.

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
        # a local Ray for the run: its actors run on this machine, so what is true here is true there
        self.local = not (address or os.environ.get("RAY_ADDRESS"))
        self.started = False
        self.count = 0
        self.per_actor: dict[str, Any] = {}

    def check(self, model: str, models_dir: Path) -> None:
        """Refuse, before Ray starts and without loading weights, a model or device the actors
        cannot load: the name and family everywhere (the architecture on the meta device); with
        a local Ray also the weights (a local file, the hub's cache or the hub) and the device.

        On a cluster the weights and devices are each node's: an actor that lacks them says so
        (:class:`ActorRefused`).

        Raises:
            UnknownModelError, UnsupportedModelError: the model cannot be built or captured.
            ModelLoadError: (local Ray) its weights cannot be had on this machine.
            ValueError: (local Ray) ``device`` is not on this machine.
        """
        from ..engine.device import resolve_device
        from ..zoo.errors import ModelLoadError
        from ..zoo.ids import ModelSpec
        from ..zoo.loaders import skeleton
        from ..zoo.preflight import preflight

        # a caller's own ray.init(address=...) joined a cluster already: its nodes' weights and devices
        if self.local and not _ray_initialized():
            found = preflight(model, models_dir)
            if found is not None:
                raise ModelLoadError(found[0])
            if self.device is not None:
                resolve_device(self.device)
            return
        spec = ModelSpec.parse(model)
        if spec.source == "embedded":
            return  # converted on each node (headscope fetch): its own errors say what to do
        try:
            skeleton(spec, models_dir)  # UnknownModelError, UnsupportedModelError: the same on every node
        except ImportError:  # a package only the nodes need (open_clip, say): theirs to say
            log.debug("ray: the driver cannot build %s's architecture; the actors will try", model, exc_info=True)

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
