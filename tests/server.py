"""A real `headscope serve` process on a free loopback port (tests, load and soak scripts)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"
SAMPLES = ROOT / "static" / "samples"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A real `headscope serve` process on 127.0.0.1."""

    def __init__(
        self,
        env: dict[str, str] | None = None,
        wait_ready: bool = True,
        timeout: float = 120,
        command: list[str] | None = None,
        cwd: Path = ROOT,
        models_dir: Path | None = ROOT / "models",
    ):
        """Start the server and wait until it answers.

        Args:
            env: extra environment variables for the server.
            wait_ready: wait for /readyz (the model loaded), else only for /healthz.
            timeout: seconds to wait for it.
            command: the program that serves (default: this checkout's ``python -m app.cli``);
                ``serve --port N --log-level warning`` is appended.
            cwd: where it runs.
            models_dir: ``HEADSCOPE_MODELS_DIR``; None leaves it unset (the app picks its default).
        """
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        ARTIFACTS.mkdir(exist_ok=True)
        self.log_path = ARTIFACTS / f"server-{self.port}.log"
        full_env = {k: v for k, v in os.environ.items() if k != "HEADSCOPE_MODELS_DIR"}
        if models_dir is not None:
            full_env["HEADSCOPE_MODELS_DIR"] = str(models_dir)
        full_env.update({"PYTHONUNBUFFERED": "1", **(env or {})})
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [
                *(command or [sys.executable, "-m", "app.cli"]),
                "serve",
                "--port",
                str(self.port),
                "--log-level",
                "warning",
            ],
            cwd=cwd,
            env=full_env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout
        path = "/readyz" if wait_ready else "/healthz"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.log()[-2000:]}")
            try:
                if httpx.get(self.url + path, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"server not ready in {timeout}s: {self.log()[-2000:]}")

    def log(self) -> str:
        return self.log_path.read_text()

    def stop(self, sig=signal.SIGTERM, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode
