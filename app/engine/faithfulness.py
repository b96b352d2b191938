"""How faithful a relevance map is: the perturbation test.

Remove the patches a map calls most relevant and the target should fall fast (**positive**
perturbation: lower is better); remove the least relevant and it should hold (**negative**
perturbation: higher is better). The test of Chefer et al. 2021 (after Samek et al. 2017's
region perturbation), on one picture, for one target (:mod:`app.engine.relevance`):

* at fraction ``f`` the ``floor(f x P)`` most relevant patches (positive: the map sorted
  descending) or least relevant (negative: sorted ascending) are set to 0 in the model's
  **normalised** input, i.e. to the data set's mean colour; ties, either way, take the lower
  patch index first;
* the curve is ``s(perturbed) / s(unperturbed)`` with ``s`` the target's score
  (:meth:`~app.engine.relevance.Target.score`): for a class the softmax probability of that
  class, for the other targets their value; ``s`` is positive, so the curve keeps its meaning
  whatever the sign of a logit. At ``f = 0`` nothing is removed and it is 1 (NaN at every other
  fraction if ``s(unperturbed)`` is exactly 0);
* AUC is the trapezoid over the fractions, the point ``f = 0`` (curve 1) included whether or not
  the fractions list it. Default fractions 0, 0.1, ..., 0.9 (the perturbation test's own).

That is ``protocol="live"``, the default. ``protocol="paper"`` is the protocol of Chefer et al.'s
evaluation script (``pertubation_eval_from_hdf5.py``): the map upsampled bilinearly by the patch
size to pixels (:func:`pixel_map`), ``int(f x pixels)`` pixels removed (most or least relevant,
ties the lower pixel index first), set to 0 *before* normalisation (black, :func:`black`), and each
point scored 1 where the top-1 class is still the target's class, else 0 (x = 0: the unperturbed
picture's hit); AUC ``trapz(y, x) x 100`` over the fractions, in percent. The mean of those AUCs
over a data set is the paper's AUC of the accuracy curve (the trapezoid is linear).

``floor`` is taken of ``f x P`` plus 1e-9, so that a fraction whose product with P is an integer
up to rounding (0.29 x 100 = 28.999999999999996 in binary) removes that integer.

The perturbed pictures of every method and both directions go through the model in batches
(:data:`DEFAULT_BATCH`); identical perturbations (the same set of patches) run once. The
unperturbed picture is one more item of the first batch, so every ratio has numerator and
denominator from the same (fused, inference-mode) forward. :class:`PerturbationTest` runs one
batch per :meth:`~PerturbationTest.step` (for a caller that interleaves other work between
batches and reports progress); :func:`faithfulness` runs them all with an optional progress
callback and a cancellation check between batches. :func:`run_tests` runs the tests of many
pictures at once, their forwards stacked across pictures (a data set's table at the forward's
speed); :meth:`PerturbationTest.inputs` and :meth:`PerturbationTest.take` are the halves of a
step for a caller that batches forwards itself (the server's worker).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch

from .ablation import Ablation, head_masks, heads_masked
from .device import autocast, where_float64
from .model import LoadedModel
from .output import head_output, timm_model
from .relevance import Target, check_target, parse_target, refuse_windowed_relevance
from .selection import MAX_SPEC, SelectionError
from .verdicts import Verdict, improbable, verdicts

DEFAULT_FRACTIONS: tuple[float, ...] = tuple(i / 10 for i in range(10))
PROTOCOLS = ("live", "paper")
DEFAULT_PROTOCOL = "live"
MAX_FRACTIONS = 50
DEFAULT_BATCH = 8
DIRECTIONS = ("positive", "negative")

_NUMBER = re.compile(r"[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?")


class FractionsError(SelectionError):
    """Fractions outside [0, 1), not ascending, too many or unreadable (answered as 422)."""

    code = "bad_fractions"


class ProtocolError(SelectionError):
    """An unknown protocol, or ``paper`` for a model without classes (answered as 422)."""

    code = "bad_protocol"


def parse_protocol(spec: str | None) -> str:
    """``live`` (the default: patches, mean-grey fill, the target's score ratio) or ``paper``
    (Chefer et al. 2021's: pixels, black fill, top-1 accuracy).

    The names are exact (lowercase, no spaces), as the survey's ``--protocol`` takes them; None or
    ``""`` is the default. The Python API and the REST API both parse with this function, so a
    value is accepted or refused (422 ``bad_protocol``) the same way by either.

    Raises:
        ProtocolError: anything else (another spelling, another type).
    """
    if spec is None or (isinstance(spec, str) and spec == ""):
        return DEFAULT_PROTOCOL
    if not isinstance(spec, str):
        raise ProtocolError(
            f"protocol is a string, live (the default) or paper; got {type(spec).__name__} {str(spec)[:40]}"
        )
    if spec not in PROTOCOLS:
        raise ProtocolError(f"protocol {spec[:40]!r}: unknown; use live (the default) or paper, spelt exactly so")
    return spec


def check_protocol(protocol: str, lm: LoadedModel, target: Target) -> None:
    """Raise :class:`ProtocolError` where ``paper`` cannot score: it counts top-1 hits of a class."""
    if protocol == "paper" and target.kind not in ("top", "class"):
        raise ProtocolError(
            f"protocol=paper scores whether the top-1 class survives (Chefer et al. 2021's top-1 accuracy): it needs "
            f"a class target (top or class:N) of a classifier; this model's output is {lm.output_kind}, the "
            f"target {target}; use protocol=live"
        )


class Cancelled(Exception):
    """The cancellation check asked the test to stop between two batches."""


def parse_fractions(spec: str | Sequence[float] | None) -> tuple[float, ...]:
    """Fractions from ``"0,0.1,0.5"`` (or a sequence): in [0, 1), strictly ascending, 1 to 50.

    Raises:
        FractionsError: anything else.
    """
    if spec is None or (isinstance(spec, str) and not spec.strip()):
        return DEFAULT_FRACTIONS
    if isinstance(spec, str):
        if len(spec) > MAX_SPEC:
            raise FractionsError("fractions: specification too long")
        values: list[float] = []
        for raw in spec.replace(" ", "").split(","):
            if not _NUMBER.fullmatch(raw.removeprefix("-")):  # a negative one is read, then refused as outside
                raise FractionsError(f"fractions: cannot read {raw[:40]!r}; write numbers in [0, 1) like 0,0.1,0.2")
            values.append(float(raw))
    else:
        try:
            values = [_number(v) for v in spec]
        except TypeError:  # not iterable: fractions=0.5
            raise FractionsError(
                f"fractions: give numbers in [0, 1) as a sequence or a string like 0,0.1,0.2; got "
                f"{type(spec).__name__} {str(spec)[:40]}"
            ) from None
    if not values:
        raise FractionsError("fractions: none given")
    if len(values) > MAX_FRACTIONS:
        raise FractionsError(f"fractions: {len(values)} given, at most {MAX_FRACTIONS}")
    for v in values:
        if not (math.isfinite(v) and 0.0 <= v < 1.0):
            raise FractionsError(f"fractions: {v} is outside [0, 1)")
    for a, b in zip(values, values[1:]):
        if not a < b:
            raise FractionsError(f"fractions: not strictly ascending ({a} then {b})")
    return tuple(values)


def _number(v: object) -> float:
    """One fraction of a sequence as a float: a number (numpy's and torch's scalars too) or a
    string read as the string form reads it; :class:`FractionsError` for anything else (a bool,
    None, ``"a"``), not the ``ValueError`` or ``TypeError`` of ``float()``."""
    if isinstance(v, str) and _NUMBER.fullmatch(v.strip().removeprefix("-")):
        return float(v)
    if not isinstance(v, (str, bool)) and hasattr(v, "__float__"):
        try:
            return float(v)
        except (TypeError, ValueError, RuntimeError):  # a tensor of several values
            pass
    raise FractionsError(
        f"fractions: cannot read {str(v)[:40]!r} ({type(v).__name__}); write numbers in [0, 1) like [0, 0.1, 0.2]"
    )


def removed_count(fraction: float, num_patches: int) -> int:
    """``floor(fraction x P)`` patches (with 1e-9 against binary rounding; see the module docstring)."""
    return int(math.floor(fraction * num_patches + 1e-9))


def removal_order(relevance: torch.Tensor, direction: str) -> torch.Tensor:
    """Patch indices in the order a direction removes them: ``[P]`` on the host.

    Args:
        relevance: ``[P]`` or ``[rows, cols]`` (row-major patches).
        direction: ``positive`` (most relevant first) or ``negative`` (least relevant first);
            ties, either way, the lower patch index first.
    """
    if direction not in DIRECTIONS:
        raise ValueError(f"direction {direction!r}: use positive or negative")
    m = relevance.detach().flatten().cpu().double()
    return torch.sort(m, descending=direction == "positive", stable=True).indices


def auc(fractions: Sequence[float], curve: Sequence[float], start: float = 1.0) -> float:
    """Trapezoid area under ``curve`` over ``fractions``, with the point (0, ``start``) included."""
    xs, ys = list(fractions), list(curve)
    if not xs or xs[0] != 0.0:
        xs, ys = [0.0, *xs], [start, *ys]
    return float(sum((x1 - x0) * (y0 + y1) / 2 for x0, x1, y0, y1 in zip(xs, xs[1:], ys, ys[1:])))


def pixel_map(relevance: torch.Tensor, grid: tuple[int, int], patch: tuple[int, int]) -> torch.Tensor:
    """A patch map upsampled to pixels as the paper's code does: bilinear, ``align_corners=False``,
    by the patch size (``F.interpolate(Res, scale_factor=16, mode="bilinear")`` for 16 px
    patches): ``[rows * ph, cols * pw]`` float64 on the host."""
    m = relevance.detach().cpu().double().reshape(1, 1, *grid)
    size = (grid[0] * patch[0], grid[1] * patch[1])
    return torch.nn.functional.interpolate(m, size=size, mode="bilinear", align_corners=False)[0, 0]


def pixel_order(relevance: torch.Tensor, direction: str) -> torch.Tensor:
    """Pixel indices (row-major) in the order a direction removes them: the paper's ``topk`` of the
    map (positive) or of its negation (negative), ties the lower pixel index first."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction {direction!r}: use positive or negative")
    return torch.sort(relevance.flatten(), descending=direction == "positive", stable=True).indices


def black(lm: LoadedModel, device: torch.device | str, dtype: torch.dtype) -> torch.Tensor:
    """Pixel value 0 (black) after the model's normalisation: ``(0 - mean) / std``, ``[3, 1, 1]``."""
    mean = torch.tensor(lm.mean, dtype=torch.float64)
    std = torch.tensor(lm.std, dtype=torch.float64)
    return (-mean / std).to(device=device, dtype=dtype)[:, None, None]


def blacked(pixels: torch.Tensor, removed: torch.Tensor, fill: torch.Tensor) -> torch.Tensor:
    """Copies of one picture with pixels set to ``fill``: ``[K, 3, H, W]``.

    Args:
        pixels: ``[3, H, W]`` normalised picture.
        removed: ``[K, h, w]`` bool, True where a pixel is removed (``h <= H``, ``w <= W``: the
            pixels the patch grid covers; those beyond are never removed).
        fill: ``[3, 1, 1]`` the normalised value of a removed pixel.
    """
    C, H, W = pixels.shape  # channels, height, width
    mask = removed.to(pixels.device)
    if mask.shape[-2:] != (H, W):
        mask = torch.nn.functional.pad(mask, (0, W - mask.shape[-1], 0, H - mask.shape[-2]))
    return torch.where(mask[:, None], fill, pixels)


def perturbed(
    pixels: torch.Tensor, removed: torch.Tensor, grid: tuple[int, int], patch: tuple[int, int]
) -> torch.Tensor:
    """Copies of one picture with patches set to 0: ``[K, 3, H, W]``.

    Args:
        pixels: ``[3, H, W]`` normalised picture.
        removed: ``[K, P]`` bool, True where a patch is removed (row-major over ``grid``).
        grid: ``(rows, cols)`` of patches.
        patch: ``(height, width)`` of a patch in pixels.
    """
    K = removed.shape[0]
    gh, gw = grid
    ph, pw = patch
    C, H, W = pixels.shape  # channels, height, width
    cells = removed.to(pixels.device).reshape(K, gh, gw)
    mask = cells.repeat_interleave(ph, dim=1).repeat_interleave(pw, dim=2)  # K, gh * ph, gw * pw
    if (gh * ph, gw * pw) != (H, W):  # pixels beyond the last whole patch are never removed
        mask = torch.nn.functional.pad(mask, (0, W - gw * pw, 0, H - gh * ph))
    return torch.where(mask[:, None], torch.zeros((), dtype=pixels.dtype, device=pixels.device), pixels)


@dataclass
class Curves:
    """One method's two curves at the fractions, their AUCs and how many patches each point removed."""

    positive: list[float]
    negative: list[float]
    auc_positive: float
    auc_negative: float
    removed: list[int]

    def as_dict(self) -> dict:
        return {
            "positive": self.positive,
            "negative": self.negative,
            "auc_positive": self.auc_positive,
            "auc_negative": self.auc_negative,
            "removed": self.removed,
        }


@dataclass
class Faithfulness:
    """The perturbation test of one picture for one target.

    ``y``: the target's unperturbed value; ``score``: what the curves divide (``probability``:
    the class's softmax probability, for ``top``/``class`` targets; ``target``: ``y`` itself) and
    ``score0`` its unperturbed value, every curve's denominator; ``forwards``: the model forwards
    it took (the unperturbed picture included); ``class_index``: the class of a ``top``/``class``
    target.
    """

    fractions: list[float]
    target: str
    y: float
    methods: dict[str, Curves]
    num_patches: int
    forwards: int
    batch_size: int
    class_index: int | None = None
    score: str = "target"
    score0: float = math.nan
    protocol: str = DEFAULT_PROTOCOL
    classes: int | None = None  # the model's classes, for a class target's probability

    def verdicts(self) -> dict[str, Verdict]:
        """Each method's verdict against the random map (:mod:`app.engine.verdicts`), its margins
        judged in this protocol's units (paper AUCs are percent); none for a class the model
        gives less than a uniform guess would (:func:`~app.engine.verdicts.improbable`)."""
        unrated = improbable(self.score, self.score0, self.classes)
        return verdicts(
            {name: c.as_dict() for name, c in self.methods.items()}, protocol=self.protocol, unrated=unrated
        )

    def as_dict(self) -> dict:
        return {
            "protocol": self.protocol,
            "fractions": self.fractions,
            "target": self.target,
            "y": self.y,
            "score": self.score,
            "score0": self.score0,
            "class_index": self.class_index,
            "num_patches": self.num_patches,
            "forwards": self.forwards,
            "batch_size": self.batch_size,
            "methods": {name: c.as_dict() for name, c in self.methods.items()},
            "verdicts": {name: v.as_dict() for name, v in self.verdicts().items()},
        }


class PerturbationTest:
    """The perturbation test of one picture, run one batch of forwards at a time.

    Usage::

        test = PerturbationTest(lm, pixels, {"chefer": rel.maps["chefer"]}, target)
        while test.step():
            report(test.done, test.total)
        res = test.result()

    Args:
        lm: the model.
        pixels: ``[3, H, W]`` or ``[1, 3, H, W]`` normalised picture on the model's device.
        maps: method -> relevance map (``[P]`` or ``[rows, cols]``, any scale: only the order counts).
        target: a :class:`~app.engine.relevance.Target` or its spelling (None: the default).
        fractions: see :func:`parse_fractions` (a string or a sequence).
        batch_size: pictures per forward.
        amp_dtype: autocast dtype, or None for plain fp32.
        ablate: ``(layer, head)`` pairs removed in every forward (the maps should be of the
            same ablated model).
        reference: the unperturbed output (``[1, ...]`` or ``[...]``, logits for classifiers), if
            the caller has it from the same kind of forward; None runs it in the first batch.
        protocol: ``live`` (patches removed, filled with 0 after normalisation, the score's
            ratio) or ``paper`` (Chefer et al. 2021: the map upsampled bilinearly to pixels,
            pixels removed and filled with black, 0 before normalisation; each point 1 where the
            top-1 class is still the target's class, else 0; AUC ``trapz(y, x) * 100``).
    """

    def __init__(
        self,
        lm: LoadedModel,
        pixels: torch.Tensor,
        maps: Mapping[str, torch.Tensor],
        target: Target | str | None = None,
        fractions: str | Sequence[float] | None = None,
        *,
        batch_size: int = DEFAULT_BATCH,
        amp_dtype: torch.dtype | None = None,
        ablate: Ablation = (),
        reference: torch.Tensor | None = None,
        protocol: str = DEFAULT_PROTOCOL,
    ):
        refuse_windowed_relevance(lm)
        self.protocol = parse_protocol(protocol)
        if batch_size < 1:
            raise ValueError(f"batch_size {batch_size}: at least 1")
        if not maps:
            raise ValueError("no relevance map to test")
        self.lm, self.batch_size, self.amp_dtype, self.ablate = lm, batch_size, amp_dtype, ablate
        self.pixels = pixels[0] if pixels.dim() == 4 else pixels  # 3, H, W
        if self.pixels.dim() != 3 or (pixels.dim() == 4 and pixels.shape[0] != 1):
            raise ValueError(f"pixels of shape {tuple(pixels.shape)}: one picture, [3, H, W] or [1, 3, H, W]")
        self.input_hw = (int(self.pixels.shape[-2]), int(self.pixels.shape[-1]))
        self.target = target if isinstance(target, Target) else parse_target(target, lm, self.input_hw)
        check_target(self.target, self.input_hw)
        check_protocol(self.protocol, lm, self.target)
        self.fractions = parse_fractions(fractions)
        layout = lm.layout(self.input_hw)
        self.grid: tuple[int, int] = layout.grid  # type: ignore[union-attr]  # global: a TokenLayout
        P = self.grid[0] * self.grid[1]
        self.num_patches = P
        paper = self.protocol == "paper"
        ph, pw = lm.patch_size
        # the units removed: patches (live) or the pixels the patch grid covers (paper)
        units = P * ph * pw if paper else P
        # the paper's int(base_size * step); live's floor with 1e-9 against binary rounding
        self.counts = [int(units * f) if paper else removed_count(f, P) for f in self.fractions]
        if paper:
            self._fill = black(lm, self.pixels.device, self.pixels.dtype)
        # Every (method, direction, k > 0) names one set of removed units; equal sets run once.
        self._item: dict[tuple[str, str, int], int] = {}
        sets: dict[bytes, int] = {}
        rows: list[torch.Tensor] = []
        for name, m in maps.items():
            if m.numel() != P:
                raise ValueError(f"map {name!r} has {m.numel()} values, the picture has {P} patches")
            px = pixel_map(m, self.grid, lm.patch_size) if paper else None
            for direction in DIRECTIONS:
                order = pixel_order(px, direction) if px is not None else removal_order(m, direction)
                for k in sorted(set(self.counts) - {0}):
                    row = torch.zeros(units, dtype=torch.bool)
                    row[order[:k]] = True
                    key = row.numpy().tobytes()
                    if key not in sets:
                        sets[key] = len(rows)
                        rows.append(row)
                    self._item[(name, direction, k)] = sets[key]
        self.methods = list(maps)
        self._removed = torch.stack(rows) if rows else torch.zeros(0, units, dtype=torch.bool)  # K, units
        self._reference = None if reference is None else reference.reshape(1, *reference.shape[-self._out_dims() :])
        # Work list: None stands for the unperturbed picture, then the perturbed ones by index.
        self._queue: list[int | None] = ([] if reference is not None else [None]) + list(range(len(rows)))
        self._values: list[float] = [math.nan] * len(rows)  # y of each perturbed picture
        self._waiting: list[tuple[int, torch.Tensor]] = []  # outputs that came before the reference
        self.total = len(self._queue)
        self.done = 0

    def _out_dims(self) -> int:
        return 2 if self.lm.output_kind == "saliency" else 1

    @property
    def finished(self) -> bool:
        return self.done >= self.total

    @property
    def queue(self) -> list[int | None]:
        """The work list: ``None`` stands for the unperturbed picture, then the perturbed ones by
        index (what :meth:`inputs` and :meth:`take` are given, in any grouping)."""
        return list(self._queue)

    @property
    def forward_key(self) -> tuple:
        """Tests with equal keys can share a forward (:func:`run_tests`): model, precision,
        ablation and input size."""
        return (id(self.lm), self.amp_dtype, tuple(self.ablate), self.input_hw)

    def inputs(self, entries: Sequence[int | None]) -> torch.Tensor:
        """The pictures of ``entries`` (see :attr:`queue`): ``[len(entries), 3, H, W]``."""
        idx = [i for i in entries if i is not None]
        if not idx:
            return self.pixels[None].expand(len(entries), -1, -1, -1)
        removed = self._removed[idx]
        if self.protocol == "paper":
            (gh, gw), (ph, pw) = self.grid, self.lm.patch_size
            pics = blacked(self.pixels, removed.reshape(-1, gh * ph, gw * pw), self._fill)
        else:
            pics = perturbed(self.pixels, removed, self.grid, self.lm.patch_size)
        if len(idx) == len(entries):
            return pics
        # the unperturbed picture where the entries name it
        order, k = [], 0
        for e in entries:
            order.append(self.pixels[None] if e is None else pics[k : k + 1])
            k += e is not None
        return torch.cat(order)

    def take(self, entries: Sequence[int | None], out: torch.Tensor) -> None:
        """Record the outputs ``out`` (``[len(entries), ...]``, in the entries' order) of a forward
        of :meth:`inputs` ``(entries)``. Outputs that arrive before the unperturbed one wait for it
        (the scores of ``top`` and ``embedding`` need it)."""
        pairs = list(zip(entries, out))
        for e, o in pairs:
            if e is None:
                self._reference = o[None]
        self._waiting.extend((e, o) for e, o in pairs if e is not None)
        if self._reference is not None and self._waiting:
            idx = [e for e, _ in self._waiting]
            for i, v in zip(idx, self._scores(torch.stack([o for _, o in self._waiting])).tolist()):
                self._values[i] = v
            self._waiting = []
        self.done += len(entries)

    def step(self) -> bool:
        """Run the next batch of forwards; True while more remain."""
        if self.finished:
            return False
        batch = self._queue[self.done : self.done + self.batch_size]
        self.take(batch, forward_outputs(self.lm, self.inputs(batch), self.amp_dtype, self.ablate))
        return not self.finished

    def _scores(self, out: torch.Tensor) -> torch.Tensor:
        """live: the target's score; paper: 1.0 where the top-1 class is the target's class."""
        assert self._reference is not None
        if self.protocol == "live":
            return self.target.score(out, self._reference)
        want = self.target.class_index(self._reference)
        assert want is not None  # check_protocol: a class target
        return where_float64(out.argmax(-1) == want[0]).double()

    def result(self) -> Faithfulness:
        """The curves and AUCs (after the last :meth:`step`)."""
        if not self.finished:
            raise RuntimeError(f"the test has run {self.done} of {self.total} forwards")
        ref = self._reference
        assert ref is not None
        y0 = float(self.target.value(ref, ref)[0])
        if self.protocol == "paper":
            # the clean picture's hit is the curve at x = 0; the area in percent, as np.trapz(y, x) * 100
            s0 = float(self._scores(ref)[0])
            ys, scale = list(self._values), 100.0
        else:
            s0 = float(self.target.score(ref, ref)[0])
            ys, scale = [v / s0 if s0 != 0 else math.nan for v in self._values], 1.0
        start = s0 if self.protocol == "paper" else 1.0
        curves = {}
        for name in self.methods:
            c = {d: [start if k == 0 else ys[self._item[(name, d, k)]] for k in self.counts] for d in DIRECTIONS}
            curves[name] = Curves(
                positive=c["positive"],
                negative=c["negative"],
                auc_positive=auc(self.fractions, c["positive"], start) * scale,
                auc_negative=auc(self.fractions, c["negative"], start) * scale,
                removed=list(self.counts),
            )
        classes = self.target.class_index(ref)
        return Faithfulness(
            fractions=list(self.fractions),
            target=str(self.target),
            y=y0,
            methods=curves,
            num_patches=self.num_patches,
            forwards=self.total,
            batch_size=self.batch_size,
            class_index=classes[0] if classes else None,
            score="top1" if self.protocol == "paper" else self.target.score_name,
            score0=s0,
            protocol=self.protocol,
            classes=int(ref.shape[-1]) if classes else None,
        )


def forward_outputs(lm: LoadedModel, x: torch.Tensor, amp_dtype: torch.dtype | None, ablate: Ablation) -> torch.Tensor:
    """The output (logits for classifiers) of a batch of perturbed pictures: ``[K, ...]``, one
    inference-mode forward with the fused attention."""
    masks = head_masks(ablate, lm.num_heads, x.device)
    hw = (int(x.shape[-2]), int(x.shape[-1]))
    with torch.inference_mode(), autocast(x.device.type, amp_dtype), heads_masked(lm.model, masks):
        feats = timm_model(lm).forward_features(x)
        return head_output(lm, feats, hw, logits=True)  # K, ...


def faithfulness(
    lm: LoadedModel,
    pixels: torch.Tensor,
    maps: Mapping[str, torch.Tensor],
    target: Target | str | None = None,
    fractions: str | Sequence[float] | None = None,
    *,
    batch_size: int = DEFAULT_BATCH,
    amp_dtype: torch.dtype | None = None,
    ablate: Ablation = (),
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
    protocol: str = DEFAULT_PROTOCOL,
) -> Faithfulness:
    """The perturbation test of one picture for each map (see :class:`PerturbationTest`).

    Args:
        progress: called with ``(forwards done, forwards in all)`` after each batch.
        cancelled: checked before each batch; True stops the test with :class:`Cancelled`.
        protocol: ``live`` or ``paper`` (see :class:`PerturbationTest`).

    Raises:
        TargetError, FractionsError, ProtocolError, RelevanceUnsupportedError: bad arguments (422
            in the API).
        Cancelled: ``cancelled()`` returned True.
    """
    test = PerturbationTest(
        lm,
        pixels,
        maps,
        target,
        fractions,
        batch_size=batch_size,
        amp_dtype=amp_dtype,
        ablate=ablate,
        protocol=protocol,
    )
    while not test.finished:
        if cancelled is not None and cancelled():
            raise Cancelled(f"stopped after {test.done} of {test.total} forwards")
        test.step()
        if progress is not None:
            progress(test.done, test.total)
    return test.result()


def run_tests(
    tests: Sequence[PerturbationTest],
    batch_size: int = DEFAULT_BATCH,
    *,
    run: Callable[[Callable[[list], list], list], list] | None = None,
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> list[Faithfulness | BaseException]:
    """Several pictures' perturbation tests, their forwards stacked across pictures: one result each.

    Every test's work list (:attr:`PerturbationTest.queue`: the unperturbed picture, then the
    perturbed ones) joins one list; its items are grouped by :attr:`~PerturbationTest.forward_key`
    (the input size, for tests of one model) and run ``batch_size`` at a time, so a data set's
    tests run in full batches whatever each picture's count. Each output row is the one its
    picture's own test would get (the forward has no batch-mixing layer in eval mode); only the
    batch's composition, i.e. float rounding, differs.

    Args:
        tests: set-up tests (none stepped yet).
        batch_size: pictures per forward.
        run: ``run(fn, items) -> one result per item``, the caller's runner with the
            out-of-memory split (:meth:`app.engine.batching.BatchRunner.run`,
            :func:`app.engine.batching.split_on_oom`); None: ``fn(items)``, an error raised.
        progress: called with ``(forwards done, forwards in all)`` after each batch.
        cancelled: checked before each batch; True stops with :class:`Cancelled`.

    Returns:
        Each test's :class:`Faithfulness`, or the error of a forward of its pictures (that test
        alone fails).
    """
    if run is None:

        def run(fn, items):
            return fn(items)

    work = [(t, e) for t, test in enumerate(tests) for e in test.queue]
    total, done = len(work), 0
    failed: dict[int, BaseException] = {}

    def compute(items: list[tuple[int, int | None]]) -> list[torch.Tensor]:
        by_test: dict[int, list[int | None]] = {}
        for t, e in items:
            by_test.setdefault(t, []).append(e)
        parts = [tests[t].inputs(entries) for t, entries in by_test.items()]
        first = tests[items[0][0]]
        out = forward_outputs(first.lm, torch.cat(parts) if len(parts) > 1 else parts[0], first.amp_dtype, first.ablate)
        rows = iter(out)
        placed = {(t, e): next(rows) for t, entries in by_test.items() for e in entries}
        return [placed[it] for it in items]

    by_key: dict[tuple, list[int]] = {}
    for i, (t, _) in enumerate(work):
        by_key.setdefault(tests[t].forward_key, []).append(i)
    chunks = [idx[j : j + batch_size] for idx in by_key.values() for j in range(0, len(idx), batch_size)]
    for chunk in chunks:
        if cancelled is not None and cancelled():
            raise Cancelled(f"stopped after {done} of {total} forwards")
        items = [work[i] for i in chunk if work[i][0] not in failed]
        results = run(compute, items) if items else []
        got: dict[int, tuple[list[int | None], list[torch.Tensor]]] = {}
        for (t, e), r in zip(items, results):
            if isinstance(r, BaseException):
                failed.setdefault(t, r)
            elif t not in failed:
                entries, rows = got.setdefault(t, ([], []))
                entries.append(e)
                rows.append(r)
        for t, (entries, rows) in got.items():
            if t not in failed:
                tests[t].take(entries, torch.stack(rows))
        done += len(chunk)
        if progress is not None:
            progress(done, total)
    return [failed[t] if t in failed else test.result() for t, test in enumerate(tests)]


def mean_aucs(results: Iterable[Faithfulness]) -> dict[str, dict[str, float]]:
    """Mean AUC per method over several pictures: ``{method: {auc_positive, auc_negative, n}}``."""
    sums: dict[str, list[float]] = {}
    for r in results:
        for name, c in r.methods.items():
            s = sums.setdefault(name, [0.0, 0.0, 0.0])
            s[0] += c.auc_positive
            s[1] += c.auc_negative
            s[2] += 1
    return {name: {"auc_positive": a / n, "auc_negative": b / n, "n": int(n)} for name, (a, b, n) in sums.items()}
