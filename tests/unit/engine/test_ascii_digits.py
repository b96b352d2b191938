"""Every parser of a number a user writes takes ASCII digits only (issue 33, item 9).

``int()`` and ``\\d`` read Arabic-Indic (``٣``), fullwidth (``３``) and mathematical (``𝟑``)
digits too; the grammar the docs give is ASCII. One test per parser: the layers/heads indices,
the query (tokens and cells), ``ablate``, the relevance target (box and class), the
faithfulness fractions, and the command line's integer options.
"""

from __future__ import annotations

import argparse

import pytest

from headscope import cli
from headscope.engine.ablation import AblationError, parse_ablate
from headscope.engine.faithfulness import FractionsError, parse_fractions
from headscope.engine.layout import TokenLayout
from headscope.engine.relevance import TargetError, parse_target
from headscope.engine.selection import SelectionError, parse_indices, parse_query
from headscope.zoo import loaders
from helpers.relevance_reference import load_vit
from helpers.server import ROOT

# Each: a spelling of 3 (or 1, 2) in other digits, and one that mixes scripts.
FOREIGN = ["٣", "３", "𝟑", "۳", "३", "1٣"]


@pytest.fixture(scope="module")
def layout() -> TokenLayout:
    return TokenLayout(["cls"], (16, 16), (14, 14))


@pytest.mark.parametrize("digit", FOREIGN)
def test_layers_and_heads(digit):
    for spec in (digit, f"0,{digit}", f"0-{digit}", f"-{digit}"):
        with pytest.raises(SelectionError, match="cannot read"):
            parse_indices(spec, 12, "layers")
    assert parse_indices("3", 12, "layers") == [3]


@pytest.mark.parametrize("digit", FOREIGN)
def test_query_tokens_and_cells(digit, layout):
    for spec in (digit, f"0,{digit}", f"patch:{digit},0", f"patch:0,{digit}", f"patch:-{digit},0"):
        with pytest.raises(SelectionError, match="cannot read"):
            parse_query(spec, layout)
    assert parse_query("3", layout) == [3] and parse_query("patch:0,3", layout) == [4]


@pytest.mark.parametrize("spec", ["١:٢", "１:２", "𝟏:𝟐", "0:١", "٣:0", "-１:0", "0:1\n,2:3"])
def test_ablate(spec):
    with pytest.raises(AblationError, match="cannot read"):
        parse_ablate(spec, 12, 6)
    assert parse_ablate("1:2", 12, 6) == ((1, 2),)


@pytest.fixture(scope="module")
def saliency():
    return loaders.load_embedded(ROOT / "models")


@pytest.fixture(scope="module")
def classifier():
    return load_vit()[0]


@pytest.mark.parametrize("digit", FOREIGN)
def test_relevance_targets(digit, saliency, classifier):
    with pytest.raises(TargetError, match="write box"):
        parse_target(f"box:0,0,{digit},4", saliency, (224, 224))
    with pytest.raises(TargetError, match="write class"):
        parse_target(f"class:{digit}", classifier)
    assert parse_target("class:3", classifier).index == 3


@pytest.mark.parametrize("digit", FOREIGN)
def test_faithfulness_fractions(digit):
    for spec in (f"0.{digit}", f"0,0.{digit}", f"{digit}e-1"):
        with pytest.raises(FractionsError, match="cannot read"):
            parse_fractions(spec)
    assert parse_fractions("0,0.3") == (0.0, 0.3)


@pytest.mark.parametrize("digit", FOREIGN)
def test_command_line_integers(digit):
    parser = cli.build_parser()
    for argv in (
        ["survey", "x", "--out", "y", "--batch-size", digit],
        ["survey", "x", "--out", "y", "--limit", digit],
        ["serve", "--port", f"80{digit}0"],
        ["serve", "--max-loaded-models", digit],
    ):
        with pytest.raises(SystemExit):
            parser.parse_args(argv)
    assert parser.parse_args(["survey", "x", "--out", "y", "--batch-size", "3"]).batch_size == 3
    with pytest.raises(argparse.ArgumentTypeError, match="ASCII digits only"):
        cli.ascii_int(digit)


@pytest.mark.parametrize("text", ["1.0", "1_0", "1e0", "0x1", "٣", "+-1"])
def test_integer_parameters_take_digits_alone(text):
    """Pydantic's lax int read "1.0" as 1 and "1_0" as 10: every integer parameter (``Int``)
    takes an optional sign and ASCII digits, from a query or a form; a number from Python as it is."""
    from pydantic import ValidationError

    from headscope.serving.params import AttentionParams, ExplainParams, FaithfulnessParams, validation_message

    for cls, field in [
        (ExplainParams, "head"),
        (ExplainParams, "layer"),
        (AttentionParams, "rollout_start"),
        (FaithfulnessParams, "seed"),
    ]:
        with pytest.raises(ValidationError) as e:
            cls(**{field: text})
        assert (
            validation_message(e.value)
            == f"{field}: Input should be a valid integer, unable to parse string as an integer"
        )
    assert (
        ExplainParams(head=" -2 ").head == -2 and ExplainParams(head="+3").head == 3 and ExplainParams(head=4).head == 4
    )


@pytest.mark.parametrize("text", ["1_0", "0_5", "٣", "１.５", "0x1", "1.2.3", "1e", "--1", "½"])
def test_decimal_parameters_take_ascii_digits_alone(text):
    """Pydantic's lax float, like ``float()``, read "1_0" as 10 and "١" as 1: ``temperature=1_0``
    was answered at T = 10. Every decimal parameter (``Float``) takes ASCII digits with an
    optional sign, point and exponent; nan and inf are refused as not finite."""
    from pydantic import ValidationError

    from headscope.serving.params import AttentionParams, FaithfulnessParams, StatsParams, validation_message

    cases = [
        (AttentionParams, "temperature"),
        (AttentionParams, "discard_ratio"),
        (StatsParams, "mass"),
        (FaithfulnessParams, "wait"),
    ]
    for cls, field in cases:
        with pytest.raises(ValidationError) as e:
            cls(**{field: text})
        assert (
            validation_message(e.value)
            == f"{field}: Input should be a valid number, unable to parse string as a number"
        )
        for spelling in ("nan", "-inf", "1e400"):
            with pytest.raises(ValidationError) as e:
                cls(**{field: spelling})
            assert validation_message(e.value) == f"{field}: Input should be a finite number", spelling
    assert AttentionParams(temperature=" .5 ").temperature == 0.5
    assert AttentionParams(temperature="+2e-1").temperature == 0.2
    assert AttentionParams(aggregate="rollout", discard_ratio="0.25").discard_ratio == 0.25
    assert StatsParams(mass="1").mass == 1.0


def test_a_blank_parameter_is_its_default():
    """An HTML form's blank field (``drop=``, ``temperature=``, ``head= ``) is the parameter's
    default, for every parameter that has one: ``drop=`` alone was a 422 where ``layers=`` was not."""
    from pydantic import ValidationError

    from headscope.serving.params import AttentionParams, ExplainParams
    from headscope.serving.zero_shot import ZeroShotParams

    blank = {f: " " if i % 2 else "" for i, f in enumerate(AttentionParams.model_fields)}
    assert AttentionParams(**blank) == AttentionParams()
    assert ExplainParams(head="", layer=" ", query="") == ExplainParams()
    # A required parameter is not given a default: blank labels reach their own check (422 bad_text).
    zs = ZeroShotParams(labels=" ", maps="", method="")
    assert zs.labels == " " and zs == ZeroShotParams(labels=" ")
    with pytest.raises(ValidationError, match="labels"):
        ZeroShotParams(maps="")
