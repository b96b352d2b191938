"""A request that arrives while the first model loads: both import timm's lazily imported parts
(torchvision's circular imports among them) at once. The server imports them before either
starts; before, the load could fail ("deadlock detected by _ModuleLock") and GET /api/v1/models
answer 500 (ImportError: partially initialized module 'torchvision.ops'). In a fresh
interpreter: this one has imported them long ago."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import timm
from safetensors.torch import save_file

pytestmark = pytest.mark.thorough  # a fresh interpreter's imports: the everyday command leaves it to make test-long

SCRIPT = textwrap.dedent(
    """
    import sys

    from fastapi.testclient import TestClient

    assert "timm" not in sys.modules and "torchvision" not in sys.modules, "imported too early"
    from headscope.config import Settings
    from headscope.web.main import create_app

    ids = f"local:test_vit@{sys.argv[1]},random:swin_tiny_patch4_window7_224"
    settings = Settings(model=ids, models_dir=sys.argv[2])
    with TestClient(create_app(settings), base_url="http://127.0.0.1", raise_server_exceptions=False) as c:
        first = c.get("/api/v1/models")  # at once, while the default model loads
        print("models", first.status_code, first.json().get("error"))
        print("default", c.get("/api/v1/models").json()["default"])
    """
)


def test_a_request_while_the_first_model_loads_imports_nothing_twice(tmp_path):
    weights = tmp_path / "w.safetensors"
    src = timm.create_model("test_vit", pretrained=False, num_classes=0)
    save_file({k: v.contiguous() for k, v in src.state_dict().items()}, str(weights))
    for _ in range(2):  # the race was lost every time; twice, as a fresh process each
        run = subprocess.run(
            [sys.executable, "-c", SCRIPT, str(weights), str(tmp_path / "models")],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert run.returncode == 0, run.stderr[-3000:]
        assert "models 200 None" in run.stdout, run.stdout + run.stderr[-3000:]
        assert f"default local:test_vit@{weights.name}" in run.stdout, run.stdout + run.stderr[-3000:]
        assert "failed to load" not in run.stderr, run.stderr[-3000:]
