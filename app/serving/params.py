"""What a request for attention asks for: the same fields as POST form fields or GET query.

:data:`Ablate` is the one declaration of the ``ablate`` parameter, the same in every request
that takes it (attention, statistics, explain, output); :data:`Mass` that of the statistics'
``mass`` (the stats endpoint and the Python API's ``Attention.stats``).
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import Query
from pydantic import BaseModel, ConfigDict, Field

from ..engine.selection import MAX_SPEC, needs_every_row

Ablate = Annotated[
    str,
    Query(
        max_length=MAX_SPEC,
        description="remove heads first: layer:head pairs '0:1,11:5' (each head's output is zeroed before W_O "
        "in its block; everything after it, later layers' maps included, is recomputed)",
        examples=["", "0:1", "3:0,3:1,11:5"],
    ),
]


Mass = Annotated[
    float,
    Query(
        gt=0,
        le=1,
        description="DINO mass threshold: mass_patches counts the fewest patches that hold this share of the CLS row",
    ),
]


class AttentionParams(BaseModel):
    """What to return for an image; the same fields as form fields (POST) or query (GET)."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    model: str | None = Field(
        None,
        description="model id, one of GET /api/v1/models (default: the server's default model)",
        examples=["dinov2-s14-focus"],
    )
    layers: str = Field(
        "all",
        max_length=MAX_SPEC,
        description="'all', indices '0,5,-1' or ranges '0-3'",
        examples=["all", "0,5,11", "-1", "0-3"],
    )
    heads: str = Field(
        "all", max_length=MAX_SPEC, description="'all' or indices/ranges like layers", examples=["all", "0,2"]
    )
    query: str = Field(
        "cls",
        max_length=MAX_SPEC,
        description="'cls' (row of the first prefix token), 'all' (every row), "
        "token indices '0,17,200' or a grid cell 'patch:R,C'",
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
    rollout_start: int = Field(0, ge=-1000, le=1000, description="rollout: first layer of the product")
    head_fusion: Literal["mean", "max", "min"] = Field("mean", description="rollout: how heads are fused")
    discard_ratio: float = Field(
        0.0, ge=0.0, lt=1.0, description="rollout: share of each row's smallest weights set to 0"
    )
    drop: Literal["none", "prefix", "artifacts", "prefix,artifacts"] = Field(
        "none", description="zero these key tokens and renormalise rows (attention sinks)"
    )
    stats: bool = Field(False, description="also return per-head statistics (JSON only)")
    temperature: float = Field(
        1.0,
        gt=0,
        allow_inf_nan=False,
        description="softmax temperature: every map is softmax(scores / T); 1 is the model itself",
        examples=[1.0, 0.5, 2.0],
    )
    ablate: Ablate = ""

    @property
    def needs_every_row(self) -> bool:
        """Whether the answer needs every row of every selected map (``query=all``, rollout)."""
        return needs_every_row(self.query, self.aggregate)
