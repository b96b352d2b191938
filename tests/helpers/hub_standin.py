"""A local stand-in for the Hugging Face hub: a prepared cache folder, and a small file server.

* :func:`prepare_cache` writes a tiny timm model's weights where huggingface_hub keeps them
  (``HF_HUB_CACHE/models--timm--NAME/refs/main`` and ``snapshots/COMMIT/model.safetensors``):
  what ``timm.create_model(NAME, pretrained=True)`` reads with ``HF_HUB_OFFLINE=1``.
* :func:`offline_any_model_server` starts a ``--any-model`` server whose hub is offline
  (``HF_HUB_OFFLINE=1``), its Hugging Face cache under a given folder.
* :class:`StandInHub` answers huggingface_hub's two requests for a file (``HEAD`` for its commit,
  ETag and size, then ``GET``) on 127.0.0.1, slowly, so that a download's progress can be seen.
  The server under test reaches it through ``HF_ENDPOINT``. No request leaves the machine.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from helpers.server import Server

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@contextmanager
def offline_any_model_server(root: Path) -> Iterator[Server]:
    """A ``--any-model`` server of ``random:test_vit`` with the hub offline and its Hugging Face
    cache in ``root / "hub"`` (prepare it first with :func:`prepare_cache`, or leave it empty).
    On leaving, the server must stop cleanly, with no traceback in its log."""
    srv = Server(
        {
            "HF_HOME": str(root / "home"),
            "HF_HUB_CACHE": str(root / "hub"),
            "HF_HUB_OFFLINE": "1",
            "HEADSCOPE_MODEL": "random:test_vit",
        },
        args=["--any-model"],
    )
    try:
        yield srv
    finally:
        srv.stop_cleanly()


def weights(name: str, seed: int = 0) -> bytes:
    """Random weights of timm's ``name`` (its pretrained configuration's classes), as safetensors bytes."""
    import timm
    import torch
    from safetensors.torch import save

    torch.manual_seed(seed)
    model = timm.create_model(name, pretrained=False)
    return save({k: v.contiguous() for k, v in model.state_dict().items()})


def prepare_cache(cache: Path, name: str, data: bytes) -> Path:
    """Put ``data`` as ``name``'s ``model.safetensors`` into the hub cache folder ``cache``; returns the file."""
    repo = cache / f"models--timm--{name}"
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(COMMIT)
    path = repo / "snapshots" / COMMIT / "model.safetensors"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


class StandInHub:
    """Serves ``files`` (``{"timm/NAME/model.safetensors": bytes}``) the way the hub's resolve URLs do.

    Args:
        files: repository path -> content.
        seconds: how long sending one file takes (in 32 pieces), so that progress is visible.
    """

    def __init__(self, files: dict[str, bytes], seconds: float = 3.0):
        self.files = files
        self.seconds = seconds
        self.requests: list[str] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _file(self) -> bytes | None:
                hub.requests.append(f"{self.command} {self.path}")
                # /{org}/{repo}/resolve/{revision}/{filename}
                parts = self.path.split("?")[0].strip("/").split("/")
                if len(parts) != 5 or parts[2] != "resolve":
                    return None
                return hub.files.get(f"{parts[0]}/{parts[1]}/{parts[4]}")

            def _headers(self, data: bytes | None) -> None:
                if data is None:
                    self.send_response(404)
                    self.send_header("X-Error-Code", "EntryNotFound")
                    self.send_header("X-Error-Message", "Entry not found")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Content-Type", "application/octet-stream")
                self.end_headers()

            def do_HEAD(self):
                self._headers(self._file())

            def do_GET(self):
                data = self._file()
                self._headers(data)
                if data is None:
                    return
                step = max(1, len(data) // 32)
                for i in range(0, len(data), step):
                    self.wfile.write(data[i : i + step])
                    self.wfile.flush()
                    time.sleep(hub.seconds / 32)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop answering: from now on the hub is unreachable (connections are refused)."""
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(10)
