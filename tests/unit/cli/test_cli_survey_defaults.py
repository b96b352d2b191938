"""`headscope survey --faithfulness` defaults (issue 41), as a user runs it: the option alone tests
every method; a saliency model's default target is each picture's predicted region (a box, in the
table); `--target output` gets a warning; the progress bar moves with the perturbed forwards, not
only when a picture's test is done."""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest
import torch

from headscope import cli
from headscope.engine.relevance import METHODS
from headscope.survey.faithfulness import REGION_SHARE, FaithfulnessPlan, predicted_boxes
from headscope.survey.output import read_faithfulness
from helpers.cli import CLI_TIMEOUT_S, run_cli

pytestmark = pytest.mark.timeout(4 * CLI_TIMEOUT_S)


def test_faithfulness_alone_means_every_method():
    args = cli.build_parser().parse_args(["survey", "src", "--out", "o.parquet", "--faithfulness"])
    assert args.faithfulness == "all"
    assert FaithfulnessPlan.parse(args.faithfulness).methods == METHODS
    assert FaithfulnessPlan.parse("chefer,random").methods == ("chefer", "random")
    assert cli.build_parser().parse_args(["survey", "src", "--out", "o"]).faithfulness is None
    helps = {a.dest: a.help for a in cli.build_parser()._subparsers._group_actions[0].choices["survey"]._actions}
    assert "predicted region" in helps["target"] and "predicted class (top)" in helps["target"]


def test_weak_targets_are_named():
    assert FaithfulnessPlan.parse("all", "output").weak().startswith("the whole saliency map is a poor target")
    assert FaithfulnessPlan.parse("all", None).weak() is None
    assert FaithfulnessPlan.parse("all", "box:0,0,10,10").weak() is None


@pytest.fixture(scope="module")
def one_photo(tmp_path_factory, samples):
    d = tmp_path_factory.mktemp("defaults-source")
    shutil.copy(samples["cat"], d / "cat.png")
    return d


@pytest.mark.surveys  # a whole survey or extract run (a model load, every picture): make test-long
def test_the_default_target_of_a_saliency_model_is_each_pictures_predicted_region(one_photo, tmp_path):
    out = tmp_path / "s.parquet"
    # no --quiet: the bar is on stderr (tqdm, no terminal: one line per refresh, \r between them)
    r = run_cli(
        "survey", str(one_photo), "--out", str(out), "--faithfulness", "--fractions", "0,0.5", "--batch-size", "2"
    )
    assert r.returncode == 0, r.stderr
    assert "warning" not in r.stderr
    t = read_faithfulness(out)
    assert t.column("method").to_pylist() == list(METHODS)
    assert set(t.column("target").to_pylist()) == {"region"}
    (box,) = {tuple(b) for b in t.column("box").to_pylist()}
    # the box is the one the model's own output gives (an independent look at the same rule)
    from headscope.config import Settings
    from headscope.engine.output import head_output, timm_model
    from headscope.serving.pictures import Pictures
    from headscope.zoo.loaders import load_embedded

    settings = Settings()
    lm = load_embedded(settings.models_dir)
    x = Pictures.for_model(lm, settings).prepare((one_photo / "cat.png").read_bytes()).pixels[None]
    with torch.inference_mode():
        sal = head_output(lm, timm_model(lm).forward_features(x), tuple(x.shape[-2:]))[0].numpy()
    ys, xs = np.nonzero(sal >= REGION_SHARE * sal.max())
    assert box == (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1) == tuple(predicted_boxes(lm, x)[0])
    assert box != (0, 0, sal.shape[1], sal.shape[0])  # a region, not the whole map
    # y is the mean saliency inside that box
    y = t.column("y").to_pylist()[0]
    assert y == pytest.approx(float(sal[box[1] : box[3], box[0] : box[2]].mean()), rel=1e-4)
    # The bar moved between 0 and 1 picture: once per batch of perturbed forwards.
    states = re.findall(r"(\d+(?:\.\d+)?)/1 ", r.stderr)
    partial = [float(s) for s in states if 0 < float(s) < 1]
    assert len(set(partial)) >= 2, r.stderr[-2000:]


@pytest.mark.surveys  # a whole survey or extract run (a model load, every picture): make test-long
def test_a_weak_target_gets_a_warning(one_photo, tmp_path):
    out = tmp_path / "w.parquet"
    r = run_cli(
        "survey", str(one_photo), "--out", str(out), "--faithfulness", "chefer,random", "--target", "output",
        "--fractions", "0,0.5", "--quiet",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "headscope survey: warning: --target output: the whole saliency map is a poor target" in r.stderr
    assert set(read_faithfulness(out).column("target").to_pylist()) == {"output"}
    assert read_faithfulness(out).column("box").null_count == 2
