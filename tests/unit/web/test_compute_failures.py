"""A computation that fails on the worker is a 500 ``compute_failed`` whose log record has the
traceback and the job's context (a bug in the capture code left one line saying only its type).
In-process, the random test model, its capture replaced by one that raises."""

from __future__ import annotations

import io
import logging

from fastapi.testclient import TestClient
from PIL import Image

from headscope.config import Settings
from headscope.engine.batching import BatchRunner
from headscope.engine.capture_base import CaptureError
from headscope.web.main import create_app
from helpers.waiting import wait_until

MODEL = "random:test_vit"


def test_a_failed_capture_is_logged_with_its_traceback_and_context(monkeypatch, tmp_path, caplog):
    def broken(self, *args, **kwargs):
        raise CaptureError("a bug in the capture code")

    monkeypatch.setattr(BatchRunner, "capture", broken)
    buf = io.BytesIO()
    Image.new("RGB", (64, 64), (120, 30, 200)).save(buf, format="PNG")
    app = create_app(Settings(model=MODEL, models_dir=tmp_path))
    with TestClient(app, base_url="http://127.0.0.1") as client:
        wait_until(lambda: client.get("/readyz").status_code == 200, 120, "the model to load")
        with caplog.at_level(logging.ERROR, logger="headscope.serving.worker"):
            r = client.post("/api/v1/attention", files={"image": ("a.png", buf.getvalue(), "image/png")})
    assert r.status_code == 500 and r.json()["error"]["code"] == "compute_failed"
    (rec,) = [rec for rec in caplog.records if rec.name == "headscope.serving.worker"]
    assert rec.exc_info is not None and str(rec.exc_info[1]) == "a bug in the capture code"
    assert rec.getMessage() == f"compute failed: CaptureError (capture on {MODEL}, one picture of a batch of 1)"
