"""`headscope survey --engine ray` says in one line (exit code 2) what stops it, as the local engine
does, and leaves no output folder behind: a model or device the actors cannot load, an address with
no cluster (`auto`, a port nothing listens on), a `ray://` address without Ray Client. Found by a
reviewer: pages of Ray tracebacks and an empty OUT/_failures, a raw ConnectionError, minutes of
Ray's retries, Ray's own wording of the pip command.

In this process (the command's own `main`). All but the last start no Ray, in a second or two:
where the old code called `ray.init` (and hung, or died later) it is made to fail the test. The
last starts a local Ray (`make test-long`)."""

from __future__ import annotations

import importlib.util
import sys

import pyarrow as pa
import pytest
import torch

from headscope import cli
from helpers.server import SAMPLES, free_port

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("ray") is None,
    reason="Ray is not installed (the optional extra: pip install -e '.[ray]'; make test installs it)",
)

BAD_MODEL = "timm:vit_smal_patch16_224"  # a letter short of timm's vit_small_patch16_224


@pytest.fixture
def no_ray(monkeypatch):
    """No cluster from the environment, and a test failure instead of a Ray started or joined."""
    import ray

    def refuse(*args, **kwargs):
        raise AssertionError(f"ray.init(address={kwargs.get('address')!r}) was called: a Ray started or joined")

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ray, "init", refuse)


def survey(tmp_path, capsys, *more: str) -> tuple[int, str]:
    """``headscope survey`` of the cat with ``--engine ray`` and ``more``: (exit code, stderr)."""
    argv = ["survey", str(SAMPLES / "cat.png"), "--out", str(tmp_path / "s.parquet"), "--quiet", "--engine", "ray"]
    code = cli.main([*argv, *more])
    return code, capsys.readouterr().err


def one_line(err: str) -> str:
    """The one line the command printed on stderr (log lines at INFO aside)."""
    lines = [line for line in err.splitlines() if " INFO " not in line]
    assert len(lines) == 1 and lines[0].startswith("headscope survey: "), err
    return lines[0]


@pytest.mark.parametrize(
    "more, words",
    [
        (["--model", BAD_MODEL], "vit_small_patch16_224"),  # with the nearest name
        pytest.param(
            ["--device", "cuda", "--model", "random:test_vit"],
            "CUDA is not available",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here"),
        ),
    ],
)
def test_a_model_or_device_the_local_ray_cannot_load_is_refused_before_ray_starts(
    no_ray, tmp_path, capsys, more, words
):
    code, err = survey(tmp_path, capsys, *more)
    assert code == 2 and words in one_line(err)
    assert not (tmp_path / "s.parquet").exists()


def test_an_actor_that_cannot_load_the_model_says_why_instead_of_dying(monkeypatch):
    """On a cluster the weights and devices are each node's: the actor says back what it lacks
    (one row with the ``error`` the driver raises as ActorRefused), where Ray would restart it."""
    import ray

    from headscope.survey.ray_engine import SurveyActor

    class Context:  # an actor's runtime context, without a Ray
        def get_assigned_resources(self):
            return {}

    monkeypatch.setattr(ray, "get_runtime_context", Context)
    bad = [dict(model=BAD_MODEL, device="cpu")]
    if not torch.cuda.is_available():
        bad.append(dict(model="random:test_vit", device="cuda"))
    for where in bad:
        actor = SurveyActor(**where, batch_size=2, similarity=False, ranks=False, settings={})
        assert actor.error, where
        out = actor(pa.table({"image": ["cat.png"], "path": [str(SAMPLES / "cat.png")]}))
        assert out.column("error").to_pylist() == [actor.error] and out.column("images").to_pylist() == [1]


def test_a_refusal_after_the_output_folder_was_made_leaves_no_folder(no_ray, monkeypatch, tmp_path, capsys):
    """An actor on a cluster refuses once the driver has made OUT and OUT/_failures (here without
    a Ray: the engine's start and run stand in); nothing was written, so nothing is left."""
    from headscope.survey.ray_engine import ActorRefused, RayEngine

    def refused(self, *args, **kwargs):
        raise ActorRefused("timm has no model named 'vit_smal_patch16_224' (on the node)")

    monkeypatch.setattr(RayEngine, "start", lambda self: "cpu")
    monkeypatch.setattr(RayEngine, "run", refused)
    out = tmp_path / "new" / "s.parquet"
    argv = ["survey", str(SAMPLES / "cat.png"), "--out", str(out), "--quiet", "--engine", "ray"]
    code = cli.main([*argv, "--model", "random:test_vit"])
    assert code == 2 and "on the node" in one_line(capsys.readouterr().err)
    assert not (tmp_path / "new").exists()


def test_address_auto_without_a_cluster_is_one_line(tmp_path, capsys, monkeypatch):
    """``--limit 0``: should Ray find a cluster after all (one started meanwhile), nothing runs on it."""
    import ray
    from ray._private import services

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    if services.find_gcs_addresses() or services.find_bootstrap_address(None):
        pytest.skip("a Ray cluster runs on this machine: `auto` finds it")
    try:
        code, err = survey(tmp_path, capsys, "--address", "auto", "--limit", "0", "--model", "random:test_vit")
    finally:
        if ray.is_initialized():
            ray.shutdown()
    line = one_line(err)
    assert code == 2 and "no Ray cluster found at 'auto'" in line and "ray start --head" in line, line
    assert "leave out --address" in line
    assert not (tmp_path / "s.parquet").exists()


@pytest.mark.parametrize("how", ["--address", "RAY_ADDRESS"])
def test_an_address_nothing_listens_on_is_refused_in_seconds(no_ray, tmp_path, capsys, monkeypatch, how):
    """Ray retried such an address for minutes, printing warnings; a TCP connection is refused at once."""
    address = f"127.0.0.1:{free_port()}"  # bound and closed again: nothing listens there
    more = ["--address", address] if how == "--address" else []
    if how == "RAY_ADDRESS":
        monkeypatch.setenv("RAY_ADDRESS", address)
    code, err = survey(tmp_path, capsys, *more, "--model", "random:test_vit")
    line = one_line(err)
    assert code == 2 and f"cannot reach a Ray cluster at {address} ({how}" in line, line
    assert not (tmp_path / "s.parquet").exists()


def test_a_ray_client_address_without_ray_client_names_the_pip_command(tmp_path, capsys, monkeypatch):
    """Ray's own message was one line too, with the command unquoted (`pip install ray[client]`, a
    glob to zsh); Ray refuses such an address before it connects, so ``ray.init`` is left alone."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setitem(sys.modules, "grpc", None)  # not installed (the `ray` extra does not bring it)
    code, err = survey(tmp_path, capsys, "--address", f"ray://127.0.0.1:{free_port()}", "--model", "random:test_vit")
    assert code == 2 and "pip install 'ray[client]'" in one_line(err)


def test_addresses_with_a_port_are_probed_and_the_others_left_to_ray():
    from headscope.survey.ray_engine import host_port

    assert host_port("10.0.0.1:6379") == ("10.0.0.1", 6379)
    assert host_port("ray://head:10001") == ("head", 10001)
    assert host_port("[::1]:6379") == ("::1", 6379)
    for other in ("auto", "local", "ray://head", "nonsense::", "head:99999", "head:6379x"):
        assert host_port(other) is None, other


@pytest.mark.ray  # a local Ray cluster: `make test-long`
def test_a_model_the_actors_cannot_load_is_one_line_from_a_real_ray(monkeypatch, tmp_path, capfd):
    """The driver's check left out (as on a cluster, whose nodes hold the weights): the actors say
    it, the driver prints one line, and the folder it made is gone."""
    from headscope.survey.ray_engine import RayEngine

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(RayEngine, "check", lambda self, model, models_dir: None, raising=False)
    out = tmp_path / "s.parquet"
    argv = ["survey", str(SAMPLES / "cat.png"), "--out", str(out), "--quiet", "--engine", "ray"]
    assert cli.main([*argv, "--model", BAD_MODEL]) == 2
    err = capfd.readouterr().err
    assert "headscope survey: timm has no model named 'vit_smal_patch16_224'" in err, err
    assert "Traceback" not in err, err
    assert not out.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here")
def test_a_ray_the_caller_joined_already_is_a_cluster_whose_nodes_have_their_own_devices(monkeypatch, tmp_path):
    """A caller's own ``ray.init(address=...)`` before the survey: no --address, no RAY_ADDRESS,
    yet the actors run on the cluster's nodes, so the driver's lack of CUDA is not theirs."""
    from headscope.survey import ray_engine

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    engine = ray_engine.RayEngine(None, None, "cuda")
    with pytest.raises(ValueError, match="CUDA is not available"):
        engine.check("random:test_vit", tmp_path)  # a local Ray: this machine's devices
    monkeypatch.setattr(ray_engine, "_ray_initialized", lambda: True)
    engine.check("random:test_vit", tmp_path)  # the nodes': not refused here
