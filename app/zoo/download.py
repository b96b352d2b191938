"""Weights of a catalogue model into the Hugging Face cache, with progress a page can poll.

timm loads a pretrained model from the hub's cache (``HF_HOME`` / ``HF_HUB_CACHE``): once the
weights file is there, ``timm.create_model(name, pretrained=True)`` reads it without a network.
This module puts it there first, off the worker thread, counting the bytes as they arrive, so that
building the model later costs only the build. The repository and file come from the catalogue
entry (timm's own configuration), never from a request.
"""

from __future__ import annotations

import shutil
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from .catalog import CatalogEntry
from .errors import HubUnreachableError, ModelLoadError, ModelTooLargeError
from .hub import hub_endpoint, hub_offline_by_choice, hub_reachable

# What timm tries when the configuration names no file (timm/models/_hub.py): safetensors first.
DEFAULT_FILES = ("model.safetensors", "pytorch_model.bin")
# open_clip's (open_clip/constants.py, pretrained.download_pretrained_from_hf): safetensors first.
OPEN_CLIP_FILES = ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")

# huggingface_hub reads the response in pieces of this many bytes (10 MB by default) and reports
# progress once per piece; 1 MiB moves the page's bar every second on a slow link too.
PROGRESS_CHUNK_BYTES = 1024 * 1024


@dataclass
class DownloadProgress:
    """Bytes of the weights file received so far, and its size once the hub has said it."""

    done: int = 0
    total: int | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, n: int) -> None:
        with self._lock:
            self.done += n

    def start(self, total: int | None, initial: int = 0) -> None:
        with self._lock:
            self.total, self.done = total, initial

    @property
    def fraction(self) -> float | None:
        return min(1.0, self.done / self.total) if self.total else None


def candidates(entry: CatalogEntry) -> tuple[str, ...]:
    """The weights files the model's library reads, in the order it tries them."""
    if entry.source == "open_clip":
        f = entry.filename
        if not f or f == OPEN_CLIP_FILES[1]:
            return OPEN_CLIP_FILES
        return (f[:-4] + ".safetensors", f) if f.endswith((".bin", ".pth")) else (f,)
    f = entry.filename
    if not f or f == DEFAULT_FILES[1]:
        return DEFAULT_FILES
    # timm reads a .bin's safetensors twin first (timm/models/_hub.py _get_safe_alternatives)
    twin = OPEN_CLIP_FILES[0] if f == OPEN_CLIP_FILES[1] else f[:-4] + ".safetensors"
    return (twin, f) if f.endswith(".bin") else (f,)


def cached_weights(entry: CatalogEntry) -> Path | None:
    """The weights file in the local Hugging Face cache, if it is there (no network)."""
    from huggingface_hub import try_to_load_from_cache

    for filename in candidates(entry):
        hit = try_to_load_from_cache(entry.repo, filename)
        if isinstance(hit, str):
            return Path(hit)
    return None


def takes_tqdm_class(fn) -> bool:
    """Whether this huggingface_hub's ``hf_hub_download`` reports to a tqdm class (1.0 and later)."""
    import inspect

    return "tqdm_class" in inspect.signature(fn).parameters


@contextmanager
def _watch_partial(repo: str, filename: str, progress: DownloadProgress, every_s: float = 0.2):
    """DownloadProgress for a huggingface_hub before 1.0 (no ``tqdm_class``; the test extra's ``lxt`` pins
    one): the file's size from the hub's metadata, then the bytes of the cache's partial file
    (``blobs/*.incomplete``) read while the download runs."""
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url

    try:
        progress.start(get_hf_file_metadata(hf_hub_url(repo, filename)).size)
    except Exception:  # the download itself says what is wrong
        progress.start(None)
    blobs = Path(constants.HF_HUB_CACHE) / f"models--{repo.replace('/', '--')}" / "blobs"
    stop = threading.Event()

    def poll() -> None:
        while not stop.wait(every_s):
            done = sum(p.stat().st_size for p in blobs.glob("*.incomplete") if p.is_file())
            if done > progress.done:
                progress.add(done - progress.done)

    watcher = threading.Thread(target=poll, name="headscope-download-progress", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join()
        if progress.total:
            progress.add(max(0, progress.total - progress.done))


def _bar(progress: DownloadProgress):
    """A tqdm class for huggingface_hub's download that reports to ``progress`` and draws nothing."""
    from huggingface_hub.utils import tqdm as hub_tqdm

    class Bar(hub_tqdm):
        def __init__(self, *args, **kwargs):
            kwargs["disable"] = True  # no bar in the server's log
            super().__init__(*args, **kwargs)
            progress.start(kwargs.get("total"), kwargs.get("initial") or 0)

        def update(self, n=1):
            progress.add(int(n or 0))
            return super().update(n)

    return Bar


def unreachable_message(entry: CatalogEntry, on_server: bool = True) -> str:
    """Why the weights of ``entry`` cannot be had, and what to do instead.

    Args:
        entry: the model.
        on_server: said by the server (whose user may pick another model), or on this machine to
            someone who asked for this one (``headscope fetch``, ``extract``, the Python API).
    """
    here = "the server" if on_server else "this machine"
    why = (
        f"{here} runs with HF_HUB_OFFLINE=1"
        if hub_offline_by_choice()
        else f"the Hugging Face hub ({hub_endpoint()}) cannot be reached from {here}"
    )
    if entry.source == "open_clip":
        other = f"use open_clip:{entry.name.split('/')[0]} (the same model with random weights)"
    else:
        other = f"serve a local file as local:{entry.name.split('.')[0]}@/path/to/weights.safetensors"
    first = "Load a model that is cached, put" if on_server else "Put"
    return (
        f"{why}, and the weights of {entry.name} are not in its Hugging Face cache. {first} the weights "
        f"there with `headscope fetch {entry.model_id}` on a machine with internet (then copy "
        f"~/.cache/huggingface), or {other}"
    )


def download_weights(entry: CatalogEntry, progress: DownloadProgress) -> Path:
    """Make sure the weights are in the Hugging Face cache; returns the file (blocking: run it in a thread).

    Raises:
        HubUnreachableError: not cached, and the hub cannot be reached (or the download broke off).
        ModelLoadError: the repository has none of the weights files timm reads.
    """
    hit = cached_weights(entry)
    if hit is not None:
        size = hit.stat().st_size
        progress.start(size, size)
        return hit
    if not hub_reachable():
        raise HubUnreachableError(unreachable_message(entry))
    from huggingface_hub import constants, hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError

    if getattr(constants, "DOWNLOAD_CHUNK_SIZE", 0) > PROGRESS_CHUNK_BYTES:
        constants.DOWNLOAD_CHUNK_SIZE = PROGRESS_CHUNK_BYTES

    for filename in candidates(entry):
        try:
            if takes_tqdm_class(hf_hub_download):
                return Path(hf_hub_download(entry.repo, filename, tqdm_class=_bar(progress)))  # type: ignore[call-arg,unused-ignore]
            with _watch_partial(entry.repo, filename, progress):
                return Path(hf_hub_download(entry.repo, filename))
        except LocalEntryNotFoundError:  # (a subclass of the next) the connection failed on the way
            raise HubUnreachableError(unreachable_message(entry)) from None
        except EntryNotFoundError:  # the repository has no such file: try the next
            continue
        except Exception as e:  # a download cut short, an HTTP error, a gated repository, a full disk
            raise ModelLoadError(
                f"downloading {entry.name} from the hub failed ({type(e).__name__}: {str(e)[:200]})"
            ) from None
    raise ModelLoadError(f"{entry.repo} has none of the weights files timm reads ({', '.join(candidates(entry))})")


DISK_MARGIN_BYTES = 1024**3  # left free beside a download (the cache's other files, logs, temp files)


def weights_size(entry: CatalogEntry) -> int | None:
    """The size of the weights file on the hub, from its metadata (a HEAD request; no download);
    None when the hub does not say."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.errors import EntryNotFoundError

    for filename in candidates(entry):
        try:
            return get_hf_file_metadata(hf_hub_url(entry.repo, filename)).size
        except EntryNotFoundError:
            continue
        except Exception:  # the hub said nothing usable: the download's own errors will tell
            return None
    return None


def check_download(entry: CatalogEntry, max_bytes: int) -> None:
    """Refuse a download over ``max_bytes``, or one the disk has no room for (plus a margin),
    before a byte is fetched (blocking: run it in a thread).

    Raises:
        ModelTooLargeError: too large (``model_too_large``), or too little disk
            (``insufficient_storage``).
    """
    from huggingface_hub import constants

    size = weights_size(entry)
    if size is None:
        return
    if size > max_bytes:
        raise ModelTooLargeError(
            f"the weights of {entry.name} are {size / 2**20:,.0f} MiB, over this server's "
            f"{max_bytes / 2**20:,.0f} MiB cap (HEADSCOPE_CATALOG_MAX_BYTES)"
        )
    cache = Path(constants.HF_HUB_CACHE)
    probe = cache if cache.exists() else next((p for p in cache.parents if p.exists()), Path("/"))
    free = shutil.disk_usage(probe).free
    if free < size + DISK_MARGIN_BYTES:
        raise ModelTooLargeError(
            f"downloading {entry.name} needs {size / 2**20:,.0f} MiB and {DISK_MARGIN_BYTES / 2**30:.0f} GiB to "
            f"spare; the disk of the Hugging Face cache has {free / 2**20:,.0f} MiB free",
            "insufficient_storage",
        )
