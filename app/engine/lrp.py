"""Layer-wise relevance propagation through a model's own forward, scoped to one call.

Two relevance methods of :mod:`app.engine.relevance` need rules that differ from the gradient at
some operations; both run the model's own modules with a ``TorchFunctionMode`` active for that
forward only (no class is patched, nothing changes for another thread or model), which answers
the operations that need a rule with a custom autograd function and leaves the others alone:

* ``chefer2021`` (Chefer, Gur & Wolf, "Transformer Interpretability Beyond Attention
  Visualization", CVPR 2021): an *explicit* relevance backward, each function's ``backward``
  maps the relevance of its output to that of its inputs, with the rules of the authors' LRP
  layers (``modules/layers_ours.py``; alpha = 1, beta = 0):

  - ``linear``, ``conv2d``, ``conv_transpose2d``: the alpha-beta rule with alpha 1 (positive
    inputs through positive weights and negative through negative, bias left out);
  - a product of two tensors that both carry relevance (``q @ k^T``, ``A @ V``, a SwiGLU gate):
    ``x * grad`` of each factor for ``R / Z``, halved (the authors' ``cam /= 2``);
  - an addition of two such tensors (the residuals): each side's ``x * R / Z``, rescaled per
    picture so the sides share ``sum R`` in proportion to ``|sum|`` (the authors' ``Add``);
  - LayerNorm, GELU/SiLU, softmax, dropout, sigmoid, ReLU, batch norm, and scaling by a constant:
    the identity (relevance passes unchanged, as their ``RelProp`` base class does);
  - a mean or an interpolation (pooling heads, the saliency decoder's resize): LRP-0,
    ``x * J^T (R / Z)``;
  - a branch point: autograd's sum (their ``Clone`` up to its 1e-9 stabiliser).

  ``safe_divide`` is theirs: ``a / (b + 1e-9)``, 0 where ``b == 0``.

  The rule also needs ``dy/dA_l``, the plain gradient at each attention map. The same graph gives
  it: every function above answers its plain derivative when :attr:`RelevanceMode.gradient` is
  set, so one forward under the rules serves a gradient backward and then the relevance backward
  (``retain_graph``), instead of a second forward that keeps the maps.
* ``attnlrp`` (Achtibat et al., "AttnLRP: Attention-Aware Layer-Wise Relevance Propagation for
  Transformers", ICML 2024): relevance as gradient x input of a forward whose gradient is
  modified as LXT's efficient rules modify it: the identity rule for element-wise non-linearities
  (GELU, SiLU, sigmoid: the gradient times ``out / in``), the identity rule for LayerNorm (the
  standard deviation held constant), the uniform rule for the attention products (the gradient
  of q and k divided by 4, of v by 2: ``q @ k^T`` and ``A @ V`` each split their relevance in
  half) and for a SwiGLU gate (halved), the softmax's rule (which is its plain gradient x input)
  and the epsilon rule for linear layers (their plain gradient, epsilon -> 0). The patch
  embedding's convolution is linear too, so its output can be the graph's leaf (``patch_weight``):
  gradient x input summed over a patch's pixels is the same number there.

Attention runs through ``scaled_dot_product_attention`` for every supported family (the mode
switches ``fused_attn`` on for the call, as the capture does for EVA and BEiT), and the mode
answers each call with the unfused math, ``softmax(q * scale @ k^T + mask) @ v``, keeping the
softmax maps ``[B, H, N, N]`` in the graph (:attr:`RelevanceMode.maps`, in call order).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch.autograd import Function
from torch.nn.grad import conv2d_input
from torch.overrides import TorchFunctionMode

from .block_capture import attention_layers

RULES = ("chefer2021", "attnlrp")


def safe_divide(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The authors' stabilised division: ``a / (b + 1e-9)``, 0 where ``b`` is exactly 0."""
    # b.clamp(min=1e-9) + b.clamp(max=1e-9) is b + 1e-9 to the bit (the max and the min of b and
    # 1e-9 are those two numbers); the same numbers in five passes over the tensor instead of eleven
    den = b + 1e-9
    den.masked_fill_(den == 0, 1e-9)
    return (a / den).masked_fill_(b == 0, 0)  # the authors multiply by b.ne(0): 0 there, as here


def _saveable(*ts: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
    """Tensors made in inference mode (a position table cached by an earlier served forward)
    cannot be saved for a backward: a normal copy of those."""
    return tuple(t.clone() if t is not None and t.is_inference() else t for t in ts)


# -- chefer2021: explicit relevance functions ------------------------------------------------
# Each function's backward answers one of two passes over the same graph, chosen by the
# ``gradient`` flag of its mode's :class:`Passes`: the relevance pass (the rule) or the gradient
# pass (the plain derivative, so the CVPR 2021 rule's ``dy/dA_l`` comes from the rules' own
# forward: one forward for both).
class Passes:
    """Which backward runs over a chefer2021 graph (``gradient``), and whether the graph was built
    for a gradient pass at all (``gradient_pass``). The graph's nodes keep this, not the mode: the
    mode keeps the maps, whose graph keeps the nodes, and that cycle would never be freed."""

    def __init__(self, gradient_pass: bool = False):
        self.gradient = False
        self.gradient_pass = gradient_pass


def _applied(func: Callable, left: tuple = (), right: tuple = (), kwargs: dict | None = None) -> Callable:
    """``t -> func(*left, t, *right, **kwargs)``: a closure over the other arguments only, not over
    the tensor the rule is for (a graph node that keeps the closure must not keep its input)."""
    kw = kwargs or {}
    return lambda t: func(*left, t, *right, **kw)


def _recomputed_grad(fn: Callable, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """``J_fn(x)^T g``: the plain derivative of a one-input function, by its own autograd."""
    with torch.enable_grad():
        xg = x.detach().requires_grad_(True)
        (c,) = torch.autograd.grad(fn(xg), xg, g)
    return c


class _Identity(Function):
    """``fn(x)`` forward; relevance passes unchanged.

    How the gradient pass answers (an identity rule's only other work) is ``derivative``:
    ``None`` computes ``fn`` again under autograd; ``"self"`` is ``fn`` itself, for a scaling by a
    constant (``J^T g = fn(g)`` where the output has the input's shape); otherwise
    ``(g, *kept) -> J^T g`` with ``kept = keep(x, out)`` from the forward: the kernel autograd's
    own backward runs, the same numbers, one operator and no graph built.
    """

    @staticmethod
    def forward(
        ctx, mode: Passes, fn: Callable, x: torch.Tensor, derivative: Any = None, keep: Callable | None = None
    ) -> torch.Tensor:  # fmt: skip
        ctx.mode = mode
        out = fn(x)
        if mode.gradient_pass:  # what the derivative needs; the relevance needs nothing
            if derivative == "self" and out.shape != x.shape:
                derivative = None  # a broadcast scaling: autograd sums it back
            ctx.fn, ctx.derivative = fn, derivative
            if derivative is None:
                ctx.save_for_backward(*_saveable(x))
            elif derivative != "self" and keep is not None:
                ctx.save_for_backward(*_saveable(*keep(x, out)))
        return out

    @staticmethod
    def backward(ctx, r: torch.Tensor):
        none = (None, None)
        if not ctx.mode.gradient:
            return None, None, r, *none
        if ctx.derivative == "self":
            return None, None, ctx.fn(r), *none
        if ctx.derivative is None:
            (x,) = ctx.saved_tensors
            return None, None, _recomputed_grad(ctx.fn, x, r), *none
        return None, None, ctx.derivative(r, *ctx.saved_tensors), *none


def _identity(mode: Passes, func: Callable, args: tuple, kwargs: dict) -> torch.Tensor:
    """``func(*args, **kwargs)`` as an identity rule of its first argument, with its derivative
    written out where autograd's is one kernel (softmax, GELU, LayerNorm)."""
    x, rest = args[0], args[1:]
    kw = {k: v for k, v in kwargs.items() if k != "_stacklevel"}  # F.softmax passes its own
    dim = rest[0] if len(rest) == 1 else kw.get("dim")
    if (
        func in _SOFTMAXES
        and dim is not None
        and len(rest) <= 1
        and set(kw) <= {"dim", "dtype"}
        and kw.get("dtype") is None
    ):
        return _Identity.apply(
            mode, lambda t: t.softmax(dim), x,
            lambda g, out: torch._softmax_backward_data(g, out, dim, out.dtype), lambda _x, out: (out,),
        )  # fmt: skip
    if func is F.gelu and not rest and set(kw) <= {"approximate"}:
        approximate = kw.get("approximate", "none")
        return _Identity.apply(
            mode, lambda t: F.gelu(t, approximate=approximate), x,
            lambda g, x_: torch.ops.aten.gelu_backward(g, x_, approximate=approximate), lambda x_, _out: (x_,),
        )  # fmt: skip
    named = dict(zip(_LAYER_NORM_ARGS, rest), **kw) if func is F.layer_norm else {}  # nn.LayerNorm: keywords
    if "normalized_shape" in named and set(named) <= set(_LAYER_NORM_ARGS):
        shape, w, b = list(named["normalized_shape"]), named.get("weight"), named.get("bias")
        eps = named.get("eps", 1e-5)
        kept: list[torch.Tensor] = []  # mean and 1 / std, from the kernel that makes the value

        def norm(t: torch.Tensor) -> torch.Tensor:
            out, mean, rstd = torch.native_layer_norm(t, shape, w, b, eps)
            kept[:] = mean, rstd
            return out

        def derivative(g: torch.Tensor, x_: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor) -> torch.Tensor:
            return torch.ops.aten.native_layer_norm_backward(g, x_, shape, mean, rstd, w, b, [True, False, False])[0]

        return _Identity.apply(mode, norm, x, derivative, lambda x_, _out: (x_, *kept))
    return _Identity.apply(mode, _applied(func, right=rest, kwargs=kwargs), x)


_SOFTMAXES = (torch.Tensor.softmax, F.softmax, torch.softmax)
_LAYER_NORM_ARGS = ("normalized_shape", "weight", "bias", "eps")


def _no_dropout(args: tuple, kwargs: dict) -> bool:
    """``F.dropout``'s arguments drop nothing (evaluation, or ``p`` 0): it returns its input."""
    p = args[1] if len(args) > 1 else kwargs.get("p", 0.5)
    training = args[2] if len(args) > 2 else kwargs.get("training", True)
    return not training or p == 0


class _Lrp0(Function):
    """A parameter-free linear map ``fn`` (mean, interpolation): ``x * J^T (R / fn(x))``."""

    @staticmethod
    def forward(ctx, mode: Passes, fn: Callable, x: torch.Tensor) -> torch.Tensor:
        ctx.mode, ctx.fn = mode, fn
        ctx.save_for_backward(*_saveable(x))
        return fn(x)

    @staticmethod
    def backward(ctx, r: torch.Tensor):
        (x,) = ctx.saved_tensors
        if ctx.mode.gradient:
            return None, None, _recomputed_grad(ctx.fn, x, r)
        with torch.enable_grad():
            xg = x.detach().requires_grad_(True)
            z = ctx.fn(xg)
            (c,) = torch.autograd.grad(z, xg, safe_divide(r, z.detach()))
        return None, None, x * c


def _positive_share(r: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """:func:`safe_divide` for ``z >= 0`` (the alpha-beta rule's denominator, a sum of products of
    equal signs): ``r / (z + 1e-9)``, 0 where ``z == 0``; two passes fewer."""
    return (r / (z + 1e-9)).masked_fill_(z == 0, 0)


class _AlphaBeta(Function):
    """``op(x, w) + b`` forward (linear, convolutions); relevance by alpha-beta with alpha 1.

    ``adjoint``: ``(g, w, x_shape) -> J^T g`` of ``op(., w)`` written out (:func:`_adjoint`), so
    neither backward builds and runs a graph; None: autograd's, through ``op`` computed again.
    """

    @staticmethod
    def forward(
        ctx, mode: Passes, op: Callable, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None,
        adjoint: Callable | None = None,
    ) -> torch.Tensor:  # fmt: skip
        ctx.mode, ctx.op, ctx.adjoint = mode, op, adjoint
        ctx.save_for_backward(*_saveable(x, w))
        return op(x, w, b)

    @staticmethod
    def backward(ctx, r: torch.Tensor):
        # a backward runs without grad mode: only the branches that build a graph need detached copies
        x, w = ctx.saved_tensors
        none = (None,) * 3
        if ctx.mode.gradient:
            if ctx.adjoint is not None:
                return None, None, ctx.adjoint(r, w, x.shape), *none
            return None, None, _recomputed_grad(lambda t: ctx.op(t, w.detach(), None), x, r), *none
        parts = _signed_parts(x, w)
        if not parts:  # x all zeros: no relevance passes
            return None, None, torch.zeros_like(x), *none
        if ctx.adjoint is not None:
            with torch.no_grad():
                s = _positive_share(r, _total([ctx.op(xp, wp, None) for xp, wp in parts]))
                c = _total([xp * ctx.adjoint(s, wp, x.shape) for xp, wp in parts])
            return None, None, c, *none
        with torch.enable_grad():
            xs = [xp.detach().requires_grad_(True) for xp, _ in parts]
            zs = [ctx.op(xp, wp.detach(), None) for xp, (_, wp) in zip(xs, parts)]
            s = _positive_share(r, _total([z.detach() for z in zs]))
            cs = torch.autograd.grad(zs, xs, [s] * len(zs))
        c = _total([xp * cp for (xp, _), cp in zip(parts, cs)])
        return None, None, c, *none


def _total(ts: list[torch.Tensor]) -> torch.Tensor:
    """The sum of one or two tensors."""
    out = ts[0]
    for t in ts[1:]:
        out = out + t
    return out


def _adjoint(func: Callable, extra: tuple) -> Callable | None:
    """``(g, w, x_shape) -> J^T g`` of ``func(., w)`` given its positional arguments after the
    bias: the input gradient of a linear layer (``g @ w``) or a convolution (one convolution);
    None for anything else."""
    if func is F.linear and not extra:
        return lambda g, w, shape: g @ w
    if func is torch.conv_transpose2d:
        stride, padding, _, groups, dilation = _defaults(extra, (1, 0, 0, 1, 1))  # output_padding: not in J^T
        return lambda g, w, shape: F.conv2d(g, w, None, stride, padding, dilation, groups)
    if func is torch.conv2d and not any(isinstance(a, str) for a in extra):  # padding="same" left to autograd
        stride, padding, dilation, groups = _defaults(extra, (1, 0, 1, 1))
        return lambda g, w, shape: conv2d_input(shape, w, g, stride, padding, dilation, groups)
    return None


def _defaults(given: tuple, defaults: tuple) -> tuple:
    """Positional arguments completed with the defaults of those not given."""
    return tuple(given) + tuple(defaults[len(given) :])


def _signed_parts(x: torch.Tensor, w: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Alpha-beta's two products with alpha 1: ``(x+, w+)`` and ``(x-, w-)``, leaving out one whose
    ``x`` part is all zeros (a ReLU's output has no negative part): its terms are exact zeros.
    Checked on the CPU only, where it saves the work; on an accelerator the check would wait
    for the device."""
    pos, neg = (x.clamp(min=0), w.clamp(min=0)), (x.clamp(max=0), w.clamp(max=0))
    if x.device.type != "cpu":
        return [pos, neg]
    lo, hi = torch.aminmax(x)
    return ([pos] if hi > 0 else []) + ([neg] if lo < 0 else [])


class _Product(Function):
    """``op(a, b)`` of two relevance-carrying tensors (matmul, element-wise product): each
    factor's ``x * grad`` for ``R / Z``, halved."""

    @staticmethod
    def forward(ctx, mode: Passes, op: Callable, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ctx.mode, ctx.op = mode, op
        # z is computed again in the relevance backward rather than kept: for q k^T it is a
        # [B, H, N, N] score table per layer, memory a batch would rather have
        ctx.save_for_backward(*_saveable(a, b))
        return op(a, b)

    @staticmethod
    def backward(ctx, r: torch.Tensor):
        a, b = ctx.saved_tensors
        op, grad = ctx.op, ctx.mode.gradient
        s = r if grad else safe_divide(r, op(a, b))
        if op in _MATMULS and a.dim() == b.dim() >= 2 and a.shape[:-2] == b.shape[:-2]:
            # the two transposed products autograd's grad of a matmul computes, written out
            ca, cb = s @ b.transpose(-2, -1), a.transpose(-2, -1) @ s
        elif op in _MULS:
            ca, cb = s * b, s * a
        else:
            a, b = a.detach(), b.detach()
            with torch.enable_grad():
                ag, bg = a.requires_grad_(True), b.requires_grad_(True)
                ca, cb = torch.autograd.grad(op(ag, bg), [ag, bg], s)
            a, b = a.detach(), b.detach()
        if grad:
            return None, None, _unbroadcast(ca, a.shape), _unbroadcast(cb, b.shape)
        return None, None, _unbroadcast(a * ca / 2, a.shape), _unbroadcast(b * cb / 2, b.shape)


class _Add(Function):
    """``a + b`` of two relevance-carrying tensors: the authors' ``Add`` rule, per picture."""

    @staticmethod
    def forward(ctx, mode: Passes, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ctx.mode = mode
        ctx.save_for_backward(*_saveable(a, b))
        return a + b

    @staticmethod
    def backward(ctx, r: torch.Tensor):
        a, b = ctx.saved_tensors
        if ctx.mode.gradient:
            return None, _unbroadcast(r, a.shape), _unbroadcast(r, b.shape)
        s = safe_divide(r, a + b)
        ra, rb = a * s, b * s
        dims = tuple(range(1, r.dim()))  # per picture: the authors sum the whole tensor of one picture
        # both sides' factors |S_side| / (|S_a| + |S_b|) * S_r / S_side at once, [2, B, 1, ...]:
        # the authors' numbers, with a third of the operators of one side after the other
        sums = torch.stack([ra.sum(dims, keepdim=True), rb.sum(dims, keepdim=True)] if dims else [ra, rb])
        r_sum = r.sum(dims, keepdim=True) if dims else r
        mag = sums.abs()
        fa, fb = safe_divide(safe_divide(mag, mag.sum(0)) * r_sum, sums).unbind(0)
        return None, _unbroadcast(ra * fa, a.shape), _unbroadcast(rb * fb, b.shape)


_MATMULS = (torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__)
_MULS = (torch.mul, torch.Tensor.mul)


def _unbroadcast(t: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Sum a broadcast result back to ``shape`` (a factor shared across a dimension)."""
    if t.shape == shape:
        return t
    while t.dim() > len(shape):
        t = t.sum(0)
    for i, n in enumerate(shape):
        if n == 1 and t.shape[i] != 1:
            t = t.sum(i, keepdim=True)
    return t


# -- attnlrp: gradient modifiers (LXT's efficient rules) -------------------------------------
class _ScaleGrad(Function):
    """Identity forward; the gradient divided by ``factor`` (the uniform rule)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, factor: float) -> torch.Tensor:
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        return g / ctx.factor, None


class _IdentityRule(Function):
    """``out`` forward, gradient ``out / (x + 1e-10)`` (LXT's ``identity_rule_implicit``): one node
    that keeps the ratio, instead of the three its ``out + (x - x.detach()) * ratio`` records."""

    @staticmethod
    def forward(ctx, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(out / (x + 1e-10))
        return out

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        (ratio,) = ctx.saved_tensors
        return None, g * ratio


def _identity_rule(out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``out`` forward, gradient ``out / (x + 1e-10)`` (LXT's ``identity_rule_implicit``)."""
    return _IdentityRule.apply(out.detach(), x)


class _LayerNormRule(Function):
    """LXT's LayerNorm rule: the model's own LayerNorm value forward; the gradient of
    ``(x - mean(x)) / std * w`` with ``std`` held constant backward:
    ``(g w - mean(g w)) / std``."""

    @staticmethod
    def forward(ctx, out: torch.Tensor, x: torch.Tensor, w: torch.Tensor | None, dims: tuple, rstd: torch.Tensor):
        ctx.dims = dims
        ctx.save_for_backward(rstd, *_saveable(w.detach() if w is not None else None))
        return out

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        rstd, w = ctx.saved_tensors
        gw = g * w if w is not None else g
        return None, (gw - gw.mean(ctx.dims, keepdim=True)) * rstd, None, None, None


def _grad(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.requires_grad


class RelevanceMode(TorchFunctionMode):
    """Answers the operations that need a rule (see the module docstring) while active.

    Args:
        rules: ``chefer2021`` or ``attnlrp``.
        patch_weight: the patch embedding's convolution weight: that convolution's output becomes
            the graph's leaf (:attr:`patches`), so the backward stops there instead of at the
            pixels (what AttnLRP sums per patch is the same number; see
            :func:`app.engine.relevance.patch_conv`).
        gradient_pass: chefer2021: a backward with :attr:`gradient` set will run over the graph
            (the rules that pass relevance unchanged then keep their inputs, for the derivative).
    """

    def __init__(self, rules: str, patch_weight: torch.Tensor | None = None, gradient_pass: bool = False):
        super().__init__()
        if rules not in RULES:
            raise ValueError(f"rules {rules!r}: use one of {', '.join(RULES)}")
        self.rules = rules
        self.maps: list[torch.Tensor] = []  # softmax maps of each attention call, in the graph
        self.passes = Passes(gradient_pass)  # what the graph's nodes read
        self.patch_weight = patch_weight
        self.patches: torch.Tensor | None = None  # [B, D, rows, cols], a leaf: see patch_weight
        self.patch_bias: torch.Tensor | None = None  # the bias that convolution added

    @property
    def gradient(self) -> bool:
        """chefer2021's backward passes: the relevance (False) or the plain gradient (True)."""
        return self.passes.gradient

    @gradient.setter
    def gradient(self, value: bool) -> None:
        self.passes.gradient = value

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            return self._attention(*args, **kwargs)
        if func is torch.conv2d and self.patch_weight is not None and len(args) > 1 and args[1] is self.patch_weight:
            self.patches = func(*args, **kwargs).detach().requires_grad_(True)
            self.patch_bias = args[2] if len(args) > 2 else kwargs.get("bias")
            return self.patches
        if func is F.dropout and _no_dropout(args, kwargs):
            return args[0]  # what F.dropout returns then: no operator, and no node in the graph
        if not any(_grad(a) for a in args) and not any(_grad(a) for a in kwargs.values()):
            return func(*args, **kwargs)
        if self.rules == "attnlrp":
            return self._attnlrp(func, args, kwargs)
        return self._chefer(func, args, kwargs)

    # AttnLRP: gradient x input with modified gradients
    def _attnlrp(self, func: Callable, args: tuple, kwargs: dict) -> Any:
        if func in (F.gelu, F.silu, torch.sigmoid, torch.Tensor.sigmoid, F.sigmoid):
            x = args[0]
            with torch.no_grad():  # the value alone: the rule is the gradient
                out = func(*args, **kwargs)
            return _identity_rule(out, x)
        if func is F.layer_norm:
            # LXT's layer_norm_forward: the standard deviation held constant; the value is the
            # model's own LayerNorm (the rule only changes the gradient)
            x, shape = args[0], list(args[1])
            w = args[2] if len(args) > 2 else kwargs.get("weight")
            b = args[3] if len(args) > 3 else kwargs.get("bias")
            eps = args[4] if len(args) > 4 else kwargs.get("eps", 1e-5)
            dims = tuple(range(-len(shape), 0))
            with torch.no_grad():  # the kernel F.layer_norm runs (its value), and 1 / std beside it
                out, _, rstd = torch.native_layer_norm(x, shape, w, b, eps)
            return _LayerNormRule.apply(out, x, w, dims, rstd)
        if func in (torch.Tensor.mul, torch.mul) and len(args) == 2 and _grad(args[0]) and _grad(args[1]):
            return _ScaleGrad.apply(func(*args, **kwargs), 2.0)
        return func(*args, **kwargs)

    # chefer2021: explicit relevance
    def _chefer(self, func: Callable, args: tuple, kwargs: dict) -> Any:
        if func in (F.linear, torch.conv2d, F.conv2d, F.conv_transpose2d, torch.conv_transpose2d):
            rest = dict(kwargs)
            x = args[0] if args else rest.pop("input")
            w = args[1] if len(args) > 1 else rest.pop("weight")
            b = args[2] if len(args) > 2 else rest.pop("bias", None)
            extra = args[3:]

            def op(x_, w_, b_, func=func, extra=extra, rest=rest):
                return func(x_, w_, b_, *extra, **rest)

            return _AlphaBeta.apply(self.passes, op, x, w, b, None if rest else _adjoint(func, extra))
        if func in (torch.Tensor.matmul, torch.matmul, torch.Tensor.__matmul__, torch.Tensor.mul, torch.mul):
            a, b = args[0], args[1]
            if _grad(a) and _grad(b):
                return _Product.apply(self.passes, func, a, b)
            # a product with a constant: relevance passes; the derivative is the product's (an
            # element-wise one's is the product itself: LayerScale)
            linear = "self" if func in _MULS and not kwargs else None
            if _grad(a):
                return _Identity.apply(self.passes, _applied(func, right=(b, *args[2:]), kwargs=kwargs), a, linear)
            return _Identity.apply(self.passes, _applied(func, left=(a,), right=args[2:], kwargs=kwargs), b, linear)
        if func in (torch.Tensor.mul_, torch.Tensor.div, torch.div, torch.Tensor.__truediv__):
            a = args[0]
            if _grad(a) and not (len(args) > 1 and _grad(args[1])):
                scale: Callable[..., Any] = torch.Tensor.mul if func is torch.Tensor.mul_ else func
                linear = None if kwargs else "self"  # a rounding mode is no scaling
                return _Identity.apply(self.passes, _applied(scale, right=args[1:], kwargs=kwargs), a, linear)
            return func(*args, **kwargs)
        if func in (torch.Tensor.add, torch.add, torch.Tensor.__add__) and len(args) == 2 and not kwargs:
            a, b = args
            if _grad(a) and _grad(b):
                return _Add.apply(self.passes, a, b)
            if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
                # a constant added (a bias table, a position embedding): the Add rule, its share dropped
                const = b if _grad(a) else a
                return _Add.apply(self.passes, a if _grad(a) else a.detach(), b if _grad(b) else const.detach())
            return func(*args, **kwargs)
        if func in (F.layer_norm, F.gelu, F.silu, F.dropout, F.relu, torch.relu, torch.sigmoid, F.sigmoid,
                    torch.Tensor.sigmoid, torch.Tensor.softmax, F.softmax, torch.softmax, F.batch_norm):  # fmt: skip
            return _identity(self.passes, func, args, kwargs)
        if func in (torch.Tensor.mean, torch.mean, F.interpolate):
            x = args[0]
            return _Lrp0.apply(self.passes, _applied(func, right=args[1:], kwargs=kwargs), x)
        return func(*args, **kwargs)

    def _attention(self, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **_):
        if is_causal or dropout_p:
            raise ValueError("relevance rules: causal or dropout attention is not supported")
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        if attn_mask is not None and attn_mask.dtype == torch.bool:
            attn_mask = torch.zeros(attn_mask.shape, device=q.device).masked_fill(~attn_mask, float("-inf"))
        if self.rules == "attnlrp":
            # the rules sit around the fused kernel (its gradient is the softmax's): no N x N map
            q, k, v = _ScaleGrad.apply(q, 4.0), _ScaleGrad.apply(k, 4.0), _ScaleGrad.apply(v, 2.0)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=scale)
        qs = _Identity.apply(self.passes, lambda t: t * scale, q, "self")
        s = _Product.apply(self.passes, torch.matmul, qs, k.transpose(-2, -1))  # B, H, N, N
        if attn_mask is not None:
            s = _Add.apply(self.passes, s, attn_mask.detach().expand_as(s))
        a = _identity(self.passes, torch.Tensor.softmax, (s, -1), {})
        self.maps.append(a)
        return _Product.apply(self.passes, torch.matmul, a, v)


@contextmanager
def relevance_rules(
    model: torch.nn.Module, rules: str, patch_weight: torch.Tensor | None = None, gradient_pass: bool = False
) -> Iterator[RelevanceMode]:
    """Run ``model``'s forward (and its head) under :class:`RelevanceMode` inside the block.

    Every block's attention is switched to its fused branch for the block (the mode answers
    ``scaled_dot_product_attention`` with the rules), and switched back after.
    """
    mode = RelevanceMode(rules, patch_weight, gradient_pass)
    with ExitStack() as stack:
        for attn, _ in attention_layers(model):
            stack.callback(setattr, attn, "fused_attn", attn.fused_attn)
            attn.fused_attn = True
        with mode:
            yield mode
