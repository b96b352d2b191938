"""Every request's parameters, declared once: the models the routes take and the Python API validates with.

A route takes one of these models as its query (``Annotated[StatsParams, Query()]``) or, for the
upload, as its form fields (:class:`AttentionParams`); the Python API builds the same models
(:mod:`app.python.params`), so a value is accepted or refused with the same words on either side.
A parameter several requests take is an ``Annotated`` alias here (:data:`Model`, :data:`Ablate`,
:data:`Wait`, ...), declared once and used by every model that takes it. This module is plain
pydantic: the ``Query()`` that tells FastAPI where a model comes from is the route's.

:func:`validation_message` is the one text of a refused parameter (the 422 ``invalid_parameter``
of every route and the Python API's ``ValueError``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    AllowInfNan,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from ..engine.faithfulness import PROTOCOLS
from ..engine.relevance import DEFAULT_METHOD, METHODS
from ..engine.selection import MAX_SPEC, needs_every_row
from ..engine.stats import DEFAULT_MASS
from ..engine.text_relevance import TEXT_METHODS

MAX_ERRORS = 5  # errors named in one message
DEFAULT_POINTS = 25  # points of the pruning curve
DEFAULT_TEST_METHODS = "chefer,attention,random"


_LOCATIONS = ("body", "query", "path", "header", "cookie")


def validation_message(errors: ValidationError | Iterable[Mapping[str, Any]]) -> str:
    """The API's text for refused parameters: ``loc: msg`` per error (at most 5), ``"; "``-joined.

    Args:
        errors: pydantic's error, or its ``errors()`` (FastAPI's ``RequestValidationError.errors()``).
    """
    # FastAPI's locations start with where the value was: ("query", name); a model's do not.
    from_model = isinstance(errors, ValidationError)
    listed = errors.errors() if isinstance(errors, ValidationError) else list(errors)
    parts = []
    for err in listed[:MAX_ERRORS]:
        where = list(err.get("loc", ()))
        if not from_model and where and where[0] in _LOCATIONS:
            where = where[1:]  # the location only: a parameter may be named "query" itself
        loc = ".".join(str(p) for p in where)
        # A validator's own words, without pydantic's label for where they came from.
        msg = str(err.get("msg")).removeprefix("Value error, ").removeprefix("Assertion failed, ")
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts) or "invalid parameter"


def _ascii_int(value: Any) -> Any:
    """A query's or form's integer as its ASCII digits alone, as the selection grammar takes them:
    pydantic's lax int also reads "1.0" as 1 and "1_0" as 10."""
    if isinstance(value, str) and not re.fullmatch(r"\s*[+-]?[0-9]+\s*", value):
        raise ValueError("Input should be a valid integer, unable to parse string as an integer")
    return value


# An integer parameter: ASCII digits with an optional sign, from text (a number from Python as it is).
Int = Annotated[int, BeforeValidator(_ascii_int)]

# nan and inf pass to pydantic, whose AllowInfNan(False) says "Input should be a finite number".
_DECIMAL = re.compile(r"\s*[+-]?(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|nan|inf|infinity)\s*", re.I)


def _ascii_float(value: Any) -> Any:
    """A query's or form's decimal number in ASCII digits (``0.5``, ``.5``, ``2e-3``): pydantic's
    lax float, like Python's ``float()``, also reads ``1_0`` as 10 and other scripts' digits."""
    if isinstance(value, str) and not _DECIMAL.fullmatch(value):
        raise ValueError("Input should be a valid number, unable to parse string as a number")
    return value


# A decimal parameter: ASCII digits with an optional sign, point and exponent; finite (no
# parameter takes nan or inf), checked before the bounds so that nan is not "less than 1".
Float = Annotated[float, AllowInfNan(False), BeforeValidator(_ascii_float)]


# -- parameters several requests take -------------------------------------------------------
Model = Annotated[
    str | None,
    Field(description="model id, one of GET /api/v1/models (default: the server's default model)"),
]

# No max_length: parse_ablate refuses an over-long one as the bad_ablate it is, on every endpoint.
Ablate = Annotated[
    str,
    Field(
        description="remove heads first: layer:head pairs '0:1,11:5' (each head's output is zeroed before W_O "
        "in its block; everything after it, later layers' maps included, is recomputed)",
        examples=["", "0:1", "3:0,3:1,11:5"],
    ),
]

Mass = Annotated[
    Float,
    Field(
        gt=0,
        le=1,
        description="DINO mass threshold: mass_patches counts the fewest patches that hold this share of the CLS row",
    ),
]

Wait = Annotated[
    Float | None,
    Field(
        ge=0,
        le=3600,
        description="seconds to wait for the result; if it is not ready by then, answer 202 with the progress "
        "(the computation goes on; ask again). By default (absent) the request waits up to the server's request "
        "timeout and then answers 504 (the computation goes on too).",
    ),
]

ImportanceMethod = Annotated[
    Literal["ablation", "gradient"],
    Field(
        description="ablation: exact output change with each head removed alone; gradient: "
        "|d loss / d m_h| at m = 1 (Michel et al. 2019), one forward and backward pass"
    ),
]

Points = Annotated[Int, Field(ge=2, le=1025, description="points of the curve (at most heads + 1 are used)")]

# A string parsed by the engine's parse_method, not a Literal: an unknown name is then 422
# bad_method, as in the Python API and in …/faithfulness's methods= (not pydantic's
# invalid_parameter). The schema still lists the names as an enum, for generated clients.
RelevanceMethod = Annotated[str, Field(max_length=MAX_SPEC, json_schema_extra={"enum": list(METHODS + TEXT_METHODS)})]

# No max_length: the engine's parse_target bounds every kind in its own words (a phrase over its
# 300 characters: 422 bad_text, any other spec past 2 x MAX_SPEC characters: bad_target), as the docs say.
Target = Annotated[
    str | None,
    Field(
        description="the scalar of the output to explain: `output` (saliency: the mean of the map; the default), "
        "`box:X0,Y0,X1,Y1` (saliency: the mean over output-map rows Y0:Y1, columns X0:X1, pixels, end-exclusive), "
        "`top` (classes: the logit of the top class; the default), `class:N` (the logit of class N), `embedding` "
        "(models with neither: <e, e0>/|e0|^2; the default), `text:PHRASE` (CLIP-style models: the model's score of "
        "the image against the phrase, URL-encoded, at most 300 characters)",
        examples=["output", "box:60,40,150,120", "top", "class:281", "embedding", "text:a dog on a sofa"],
    ),
]

Seed = Annotated[
    Int,
    Field(
        ge=0,
        le=2**31 - 1,
        description="the seed of the `random` map (the same seed, the same map); where no random map is asked "
        "for it changes nothing (the answer's `seed` is then null)",
    ),
]

# No bounds here: the engine checks it against the model's layers (422 bad_start_layer, the same
# code the Python API raises), which a bound without the model could not.
StartLayer = Annotated[
    Int | None,
    Field(
        description="chefer2021 only: the first layer of its product, 0..L-1 (default: 1, the authors' evaluation's "
        "start_layer; layer 0's map is left out). Given with other methods alone, or outside 0..L-1 (negative values "
        "are not counted from the end): 422 bad_start_layer",
        examples=[1, 0],
    ),
]


class RequestParams(BaseModel):
    """A request's parameters: nothing else is taken. An empty value (``drop=``, ``temperature=``:
    an HTML form's blank field) is the parameter's default, for every parameter that has one."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    @model_validator(mode="before")
    @classmethod
    def _blank_is_default(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        fields = cls.model_fields
        return {
            k: v
            for k, v in data.items()
            if not (isinstance(v, str) and not v.strip() and k in fields and not fields[k].is_required())
        }


# -- attention (POST /attention, GET …/{image_id}), statistics, explain -----------------------
# The options only a rollout uses (any other aggregate refuses them away from their defaults).
ROLLOUT_OPTIONS = ("rollout_start", "head_fusion", "discard_ratio")


class AttentionParams(RequestParams):
    """What to return for an image; the same fields as form fields (POST) or query (GET)."""

    model: Model = Field(None, examples=["dinov2-s14-focus"])
    layers: str = Field(
        "all",
        max_length=MAX_SPEC,
        description="'all', indices '0,5,-1' or ranges '0-3'",
        examples=["all", "0,5,11", "-1", "0-3"],
    )
    heads: str = Field(
        "all", max_length=MAX_SPEC, description="'all' or indices/ranges like layers", examples=["all", "0,2"]
    )
    query: str | None = Field(
        None,
        max_length=MAX_SPEC,
        description="'cls' (row of the first prefix token), 'all' (every row), "
        "token indices '0,17,200' or a grid cell 'patch:R,C' (default: 'cls'; on a model without a CLS token, "
        "SigLIP or Swin, the first patch 'patch:0,0')",
        examples=["cls", "all", "0,17,200", "patch:3,5"],
    )
    aggregate: Literal["none", "mean", "max", "rollout"] = Field(
        "none", description="fuse heads (mean/max) or attention rollout over layers"
    )
    format: Literal["json", "safetensors", "npy"] = Field(
        "json",
        description="answer format: JSON (nested lists), safetensors (the tensor 'attention' with the metadata "
        "in its header) or npy (the array alone, metadata in X-Headscope-* headers)",
    )
    dtype: Literal["float32", "float16"] = Field(
        "float32", description="number type of the binary answers (safetensors, npy); float16 halves their size"
    )
    rollout_start: Int | None = Field(
        None,
        ge=-1000,
        le=1000,
        description="rollout: first layer of the product (default: the first layer, 0; on a windowed model, the first "
        "layer of the selected stage, as `headscope extract` does); with layers=all, the answer holds the layers from "
        "it on",
    )
    head_fusion: Literal["mean", "max", "min"] = Field("mean", description="rollout: how heads are fused")
    discard_ratio: Float = Field(
        0.0, ge=0.0, lt=1.0, description="rollout: share of each row's smallest weights set to 0"
    )
    drop: Literal["none", "prefix", "artifacts", "prefix,artifacts"] = Field(
        "none", description="zero these key tokens and renormalise rows (attention sinks)"
    )
    stats: bool = Field(
        False, description="also return per-head statistics (JSON only: with a binary format, 422 invalid_parameter)"
    )
    temperature: Float = Field(
        1.0,
        gt=0,
        description="softmax temperature: every map is softmax(scores / T); 1 is the model itself",
        examples=[1.0, 0.5, 2.0],
    )
    ablate: Ablate = ""

    @field_validator("stats")
    @classmethod
    def _stats_in_json(cls, stats: bool, info: ValidationInfo) -> bool:
        # A binary answer is the tensor alone: refused rather than answered without what was asked.
        if stats and info.data.get("format", "json") != "json":
            raise ValueError(
                f"stats=true needs format=json (a {info.data['format']} answer holds the tensor alone); "
                "GET /api/v1/attention/{image_id}/stats gives the statistics"
            )
        return stats

    @model_validator(mode="after")
    def _rollout_options_with_rollout(self) -> AttentionParams:
        # Answered without them, they were ignored without a word: discard_ratio=0.5 gave the plain maps.
        if self.aggregate != "rollout":
            fields = type(self).model_fields
            given = [name for name in ROLLOUT_OPTIONS if getattr(self, name) != fields[name].default]
            if given:
                what, them = ("an option", "it") if len(given) == 1 else ("options", "them")
                raise ValueError(
                    f"{', '.join(given)}: {what} of aggregate=rollout; add aggregate=rollout, or leave {them} out "
                    f"(aggregate={self.aggregate} does not use {them})"
                )
        return self

    @property
    def needs_every_row(self) -> bool:
        """Whether the answer needs every row of every selected map (``query=all``, rollout)."""
        return needs_every_row(self.query, self.aggregate)


class StatsParams(RequestParams):
    """``GET …/stats``: per-head statistics."""

    model: Model = None
    mass: Mass = DEFAULT_MASS
    ablate: Ablate = ""


class ExplainParams(RequestParams):
    """``GET …/explain``: which head, layer and query token to explain."""

    model: Model = None
    layer: Int = Field(-1, ge=-100_000, le=100_000, description="block index; negative counts from the end")
    head: Int = Field(0, ge=-100_000, le=100_000, description="head index; negative counts from the end")
    query: str | None = Field(
        None,
        max_length=MAX_SPEC,
        description="one query token: 'cls', a token index or 'patch:R,C' "
        "(default: the CLS token, or the first patch where the model has none; windowed models (Swin): "
        "a cell of the layer's stage grid, default cell 0)",
        examples=["cls", "0", "patch:3,5"],
    )
    format: Literal["json", "safetensors"] = Field(
        "json", description="answer format: JSON, or safetensors (every tensor of the computation, exact)"
    )
    ablate: Ablate = ""


# -- the model's output, importance, pruning -------------------------------------------------
class OutputParams(RequestParams):
    """``GET …/output``: the model's own output, with heads removed."""

    model: Model = None
    ablate: Ablate = ""
    format: Literal["json", "npy", "safetensors"] = Field(
        "json", description="answer format: JSON, or the output tensor alone as npy or safetensors"
    )


class ImportanceQuery(RequestParams):
    """What names one importance computation (``GET …/importance`` and its ``…/progress``)."""

    model: Model = None
    method: ImportanceMethod = "ablation"


class ImportanceParams(ImportanceQuery):
    """``GET …/importance``: the computation, and how long to wait for it."""

    wait: Wait = None


class PruningQuery(ImportanceQuery):
    """What names one pruning curve (``GET …/pruning`` and its ``…/progress``)."""

    points: Points = DEFAULT_POINTS


class PruningParams(PruningQuery):
    """``GET …/pruning``: the curve, and how long to wait for it."""

    wait: Wait = None


# -- relevance and the faithfulness test -----------------------------------------------------
class RelevanceParams(RequestParams):
    """``GET …/relevance``: one method's map for one target."""

    model: Model = None
    method: RelevanceMethod = Field(
        DEFAULT_METHOD,
        description="chefer (Chefer et al., ICCV 2021: the GAE rule), grad_attention (the last layer's "
        "gradient-weighted attention), rollout (attention rollout), attention (the last layer's raw attention), "
        "random (a seeded baseline), chefer2021 (Chefer et al., CVPR 2021: LRP relevance of each attention map "
        "times its gradient, rolled out), attnlrp (AttnLRP, Achtibat et al., ICML 2024: one LRP backward pass; "
        "signed), legrad (LeGrad, Bousselham et al. 2024: text targets on CLIP models)",
    )
    target: Target = None
    seed: Seed = 0
    format: Literal["json", "npy", "safetensors"] = Field(
        "json",
        description="answer format: JSON, or the map alone as npy or safetensors (tensor `relevance`), "
        "metadata in the X-Headscope-Meta header (and the safetensors header)",
    )
    ablate: Ablate = ""
    start_layer: StartLayer = None


class FaithfulnessQuery(RequestParams):
    """What names one perturbation test (``GET …/faithfulness`` and its ``…/progress``)."""

    model: Model = None
    methods: str = Field(
        DEFAULT_TEST_METHODS,
        max_length=MAX_SPEC,
        description="the maps to test, comma-separated (any of chefer, grad_attention, rollout, attention, "
        "random, chefer2021, attnlrp; legrad for a text target); the answer lists them in this order",
        examples=[DEFAULT_TEST_METHODS, "chefer,grad_attention,attention,rollout,random"],
    )
    target: Target = None
    fractions: str | None = Field(
        None,
        max_length=MAX_SPEC,
        description="the shares of patches removed, comma-separated, in [0, 1), strictly ascending, at most 50 "
        "(default 0,0.1,...,0.9)",
        examples=["0,0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9", "0,0.25,0.5"],
    )
    seed: Seed = 0
    ablate: Ablate = ""
    # A string parsed by the engine's parse_protocol, not a Literal: an unknown name is then 422
    # bad_protocol here as in the Python API, with the same words (not pydantic's invalid_parameter).
    # The schema still lists the names as an enum, so generated clients offer exactly those.
    protocol: Annotated[str, Field(max_length=MAX_SPEC, json_schema_extra={"enum": list(PROTOCOLS)})] | None = Field(
        "live",
        examples=["live", "paper"],
        description="`live` (the default: patches removed and set to the mean colour, each curve "
        "the target's score over its unperturbed value: a class's softmax probability, else the target) or `paper` "
        "(Chefer et al. 2021's protocol: the map upsampled bilinearly to pixels, pixels set to black before "
        "normalisation, each point 1 where the top-1 class is still the target's class, else 0; AUC trapz(y, x) * "
        "100, in percent; class targets only), spelt exactly so: anything else is 422 bad_protocol. "
        "docs/relevance.md says where they differ",
    )
    start_layer: StartLayer = None


class FaithfulnessParams(FaithfulnessQuery):
    """``GET …/faithfulness``: the test, and how long to wait for it."""

    wait: Wait = None
