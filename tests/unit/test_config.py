"""Settings and where the app keeps things: every setting documented, models never in site-packages."""

from __future__ import annotations

import re

import platformdirs
import pytest

from headscope import paths
from headscope.config import Settings
from helpers.server import ROOT

# Read by the command line, not a Settings field (it configures logging before Settings exist).
CLI_ONLY = {"LOG_LEVEL"}


def test_every_setting_is_documented():
    page = (ROOT / "docs" / "settings.md").read_text()
    section = page.split("\n## All settings\n", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"`HEADSCOPE_([A-Z0-9_]+)`", section))
    fields = {name.upper() for name in Settings.model_fields}
    assert not fields - documented, f"settings missing from docs/settings.md's table: {fields - documented}"
    extra = documented - fields - CLI_ONLY
    assert not extra, f"docs/settings.md documents settings that do not exist: {extra}"


def test_models_dir_order(monkeypatch, tmp_path):
    monkeypatch.delenv("HEADSCOPE_MODELS_DIR", raising=False)
    assert Settings().models_dir == ROOT / "models"  # running from this checkout
    monkeypatch.setenv("HEADSCOPE_MODELS_DIR", str(tmp_path / "mine"))
    assert Settings().models_dir == tmp_path / "mine"
    monkeypatch.delenv("HEADSCOPE_MODELS_DIR")
    monkeypatch.setattr(paths, "is_checkout", lambda: False)  # as from an installed wheel
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # platformdirs' Linux cache root
    assert Settings().models_dir == platformdirs.user_cache_path("headscope", appauthor=False) / "models"


def test_assets_come_from_the_package_then_the_checkout_never_the_cwd(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "static").mkdir()
    assert paths.asset_dir("static") == ROOT / "static"  # this checkout (no app/static here)
    pkg = tmp_path / "pkg"
    (pkg / "static").mkdir(parents=True)
    monkeypatch.setattr(paths, "PACKAGE_DIR", pkg)
    assert paths.asset_dir("static") == pkg / "static"  # an installed wheel's copy wins
    monkeypatch.setattr(paths, "CHECKOUT_DIR", tmp_path / "none")
    assert paths.asset_dir("templates") == pkg / "templates"  # missing: Settings still build (fetch)
    with pytest.raises(FileNotFoundError, match="reinstall headscope"):
        paths.check_asset_dirs(static=paths.asset_dir("static"), templates=paths.asset_dir("templates"))


def test_serve_refuses_to_start_without_its_web_assets(tmp_path):
    from headscope.web.main import create_app

    with pytest.raises(FileNotFoundError, match="HEADSCOPE_TEMPLATES_DIR"):
        create_app(Settings(templates_dir=tmp_path / "templates", models_dir=tmp_path))
    # A folder of another name is named by its setting (the hint was HEADSCOPE_ASSETS_DIR).
    with pytest.raises(FileNotFoundError, match=r"^HEADSCOPE_STATIC_DIR: .*assets is not a folder"):
        create_app(Settings(static_dir=tmp_path / "www" / "assets", models_dir=tmp_path))


def test_several_models_in_headscope_model(monkeypatch):
    monkeypatch.setenv("HEADSCOPE_MODEL", "random:test_vit, timm:vit_small_patch16_224.augreg_in21k")
    monkeypatch.setenv("HEADSCOPE_EXTRA_MODELS", '["random:test_vit2"]')
    s = Settings()
    assert s.model == "random:test_vit"
    assert s.model_ids == ["random:test_vit", "timm:vit_small_patch16_224.augreg_in21k", "random:test_vit2"]
    monkeypatch.delenv("HEADSCOPE_MODEL")
    monkeypatch.delenv("HEADSCOPE_EXTRA_MODELS")
    s = Settings()
    assert s.model_ids == ["dinov2-s14-focus"] and s.any_model is False and s.max_loaded_models == 3


@pytest.mark.parametrize("value", ["0", "1000"])
def test_a_cache_that_holds_no_capture_is_refused(monkeypatch, value):
    # Accepted, it answered every follow-up 404 "POST it again", which could never help.
    from pydantic import ValidationError

    monkeypatch.setenv("HEADSCOPE_CACHE_BYTES", value)
    with pytest.raises(ValidationError, match="cache_bytes"):
        Settings()
    monkeypatch.setenv("HEADSCOPE_CACHE_BYTES", str(2**20))
    assert Settings().cache_bytes == 2**20


def test_one_id_each_and_an_empty_model_list_names_its_variable(monkeypatch):
    monkeypatch.setenv("HEADSCOPE_MODEL", "local:test_vit@/a/model.safetensors")
    monkeypatch.setenv("HEADSCOPE_EXTRA_MODELS", "local:test_vit@/b/model.safetensors")
    with pytest.raises(ValueError, match="two models have the id local:test_vit@model.safetensors"):
        Settings()
    named = "b=local:test_vit@/b/model.safetensors,local:test_vit@/a/model.safetensors"
    monkeypatch.setenv("HEADSCOPE_EXTRA_MODELS", named)
    assert Settings().model_ids[1] == "b=local:test_vit@/b/model.safetensors"  # named: two ids; one twice: one
    monkeypatch.setenv("HEADSCOPE_MODEL", ",")
    monkeypatch.delenv("HEADSCOPE_EXTRA_MODELS")
    with pytest.raises(ValueError, match="--model / HEADSCOPE_MODEL: no model id in ','"):
        Settings()


# Every float field, an optional one too.
NUMBER_SETTINGS = sorted(
    name for name, f in Settings.model_fields.items() if float in (f.annotation, *getattr(f.annotation, "__args__", ()))
)


@pytest.mark.parametrize("name", NUMBER_SETTINGS)
@pytest.mark.parametrize("value", ["inf", "nan", "-inf"])
def test_every_number_setting_is_finite(monkeypatch, name, value):
    # HEADSCOPE_SHUTDOWN_GRACE_S=inf passed its lower bound, then `serve` died of an
    # OverflowError traceback turning it into uvicorn's grace period.
    from pydantic import ValidationError

    monkeypatch.setenv(f"HEADSCOPE_{name.upper()}", value)
    with pytest.raises(ValidationError, match=name):
        Settings()


def test_a_refused_setting_is_one_line_before_the_server_starts(monkeypatch, capsys):
    from headscope.cli import main

    cases = {
        "HEADSCOPE_SHUTDOWN_GRACE_S": ("inf", "HEADSCOPE_SHUTDOWN_GRACE_S: input should be a finite number"),
        # 100000 made OpenMP abort the process (SIGABRT) after uvicorn said it had started.
        "HEADSCOPE_THREADS": ("100000", "HEADSCOPE_THREADS: input should be less than or equal to 1024"),
        # '*' was dropped unsaid, leaving CORS off.
        "HEADSCOPE_CORS_ORIGINS": (
            "https://a.example,*",
            "HEADSCOPE_CORS_ORIGINS: '*' (any origin) is not allowed: list the origins",
        ),
    }
    for var, (value, said) in cases.items():
        monkeypatch.setenv(var, value)
        assert main(["serve", "--port", "0", "--no-fetch"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"headscope serve: {said}") and err.count("\n") == 1, err
        monkeypatch.delenv(var)


def test_threads_and_cors_origins_within_their_bounds(monkeypatch):
    monkeypatch.setenv("HEADSCOPE_THREADS", "1024")
    monkeypatch.setenv("HEADSCOPE_CORS_ORIGINS", "https://a.example, https://b.example")
    s = Settings()
    assert s.threads == 1024 and s.cors_origins == ["https://a.example", "https://b.example"]


def test_no_writable_temporary_folder_is_one_line_not_torchs_traceback():
    """`docker run --read-only` without `--tmpfs /tmp`: importing torch's compiler raised inside the
    server's lifespan (a traceback, then "Application startup failed"). In a fresh process, since
    torch asks for the folder when it is first imported."""
    import subprocess
    import sys

    code = (
        "import sys, tempfile\n"
        "tempfile._candidate_tempdir_list = lambda: ['/nonexistent-headscope-tmp']\n"
        "tempfile.tempdir = None\n"
        "from headscope.cli import main\n"
        "rc = main(sys.argv[1:])\n"
        "assert 'torch' not in sys.modules\n"
        "sys.exit(rc)\n"
    )
    for argv in (["serve", "--port", "0", "--no-fetch"], ["extract", "nothing", "--out", "x.safetensors"]):
        done = subprocess.run(
            [sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120, cwd=ROOT
        )
        assert done.returncode == 2, done.stderr
        err = done.stderr.strip()
        assert err.startswith(f"headscope {argv[0]}: no writable temporary folder"), err
        assert "--tmpfs /tmp" in err and "TMPDIR" in err and "Traceback" not in err and err.count("\n") == 0, err
