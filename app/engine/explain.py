"""One head's whole computation for one query token, from a cached capture.

Multi-head self-attention of a block, written out for head ``h`` and query token ``t``::

    q = Q_h[t], K_h, V_h                  # the model's own tensors (after QK-norm and RoPE)
    scores_j = (q * scale) . k_j + bias_j # bias: BEiT's relative position bias, else 0
    a = softmax(scores)                   # the row the attention endpoint serves
    o_h = sum_j a_j v_j                   # this head's output for t
    x = concat_h(o_h)                     # the input of W_O (after the module's inner norm, if any)
    y = W_O x + b = sum_h W_O[:, h] x_h + b

Everything comes from the capture (q, k, v, bias and the head outputs the model fed ``proj``)
and ``proj``'s own weights; nothing runs the model again. ``scores`` are computed with the same
operations as the served rows (:meth:`ImageAttention.logits`), so ``softmax(scores)`` is that row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, cast

import torch
import torch.nn as nn
import torch.nn.functional as F

from .block_capture import ImageAttention
from .capture_base import CaptureError
from .selection import SelectionError


@dataclass
class HeadComputation:
    """The tensors of one head's computation for one query token (float32, on the host).

    Shapes: ``q``, ``head_output``: ``[d]``; ``k``, ``v``: ``[N, d]``; ``dot``, ``scores``,
    ``attention``: ``[N]``; ``bias``: ``[N]`` or None; ``proj_input``: ``[H*d]``;
    ``head_contributions``: ``[H, D]``; ``proj_bias``, ``attn_output``: ``[D]``.
    """

    layer: int
    head: int
    query: int
    scale: float
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    dot: torch.Tensor
    bias: torch.Tensor | None
    scores: torch.Tensor
    attention: torch.Tensor
    head_output: torch.Tensor
    proj_input: torch.Tensor
    head_contributions: torch.Tensor
    proj_bias: torch.Tensor
    attn_output: torch.Tensor

    OPTIONAL: ClassVar[tuple[str, ...]] = ("bias",)  # tensors a model may not have (null in JSON)

    @property
    def head_dim(self) -> int:
        return int(self.q.shape[0])

    def meta(self) -> dict[str, Any]:
        """What an answer says of the computation besides its tensors: the heads, the key tokens
        (in the order of ``k``, ``v`` and the rows: every token for global attention) and the
        shapes of the matrices involved."""
        N, d = self.k.shape  # keys, head dim
        H, D = self.head_contributions.shape  # heads, embedding width
        return {
            "num_heads": H,
            "key_tokens": list(range(N)),
            "shapes": {
                "x": [N, D],
                "w_q": [D, d],
                "w_k": [D, d],
                "w_v": [D, d],
                "q": [N, d],
                "k": [N, d],
                "v": [N, d],
                "w_o": [D, H * d],
            },
        }

    def steps(self) -> dict[str, bool]:
        """Steps of this computation that the model's modules do not show (see :func:`inner_steps`)."""
        return {}

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor by its answer name (``bias`` only where the model adds one)."""
        names: tuple[str, ...] = ("q", "k", "v", "dot", "scores", "attention", "head_output", "proj_input")
        names += ("head_contributions", "proj_bias", "attn_output")
        out = {n: getattr(self, n) for n in names}
        if self.bias is not None:
            out["bias"] = self.bias
        return out


def explain_head(att: ImageAttention, attn: nn.Module, layer: int, head: int, query: int) -> HeadComputation:
    """One head's computation for one query token.

    Args:
        att: the image's capture.
        attn: the attention module of block ``layer`` (for ``proj``'s weights).
        layer: block index, non-negative.
        head: head index, non-negative.
        query: query token index, non-negative.
    """
    if not (0 <= layer < att.num_layers and 0 <= head < att.num_heads and 0 <= query < att.num_tokens):
        raise SelectionError(f"layer {layer}, head {head}, token {query}: out of range")
    q_all, k_all, v_all = att.q[layer], att.k[layer], att.v[layer] if att.v else None
    if q_all is None or k_all is None or v_all is None:
        raise CaptureError(f"layer {layer}: the capture kept no q, k and v")
    H = att.num_heads
    q = q_all[head, query].float()  # d
    k = k_all[head].float()  # N, d
    v = v_all[head].float()  # N, d
    scores = att.logits(layer, [head], [query])[0, 0]  # N: the served row's own logits
    attention = torch.softmax(scores, dim=-1)  # N
    head_output = attention @ v  # d
    dot = k @ q  # N: q . k_j, before the scale
    bias = att.bias[layer] if att.bias else None
    bias_row = bias[head, query].float() if bias is not None else None  # N

    x = att.head_out[layer][query].float()  # H*d: what the model fed W_O for this token
    contributions, b, attn_output = project_heads(attn, x, H)

    return HeadComputation(
        layer=layer,
        head=head,
        query=query,
        scale=float(att.scale[layer]),
        q=host(q),
        k=host(k),
        v=host(v),
        dot=host(dot),
        bias=host(bias_row) if bias_row is not None else None,
        scores=host(scores),
        attention=host(attention),
        head_output=host(head_output),
        proj_input=host(x),
        head_contributions=host(contributions),
        proj_bias=host(b),
        attn_output=host(attn_output),
    )


def host(t: torch.Tensor) -> torch.Tensor:
    """A float32, contiguous copy on the host (answers are encoded there)."""
    return t.detach().to("cpu", torch.float32).contiguous()


def project_heads(attn: nn.Module, x: torch.Tensor, H: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each head's share of the output projection: ``([H, D] shares, [D] bias, [D] W_O x + b)``.

    Args:
        attn: the attention module (its ``proj``).
        x: ``[H*d]`` what the model fed ``proj`` for one token.
        H: heads.
    """
    proj = cast(nn.Linear, attn.proj)
    w = proj.weight.detach().to(x.device, torch.float32)  # D, H*d
    D = w.shape[0]
    b = proj.bias.detach().to(x.device, torch.float32) if proj.bias is not None else torch.zeros(D, device=x.device)
    # Head h's share: W_O[:, h*d:(h+1)*d] @ x_h; the shares plus the bias are W_O x + b.
    # One small GEMV per head: each stays below ATen's parallel grain, so no OpenMP team is woken
    # for it (a broadcast multiply or einsum over all heads took 1-40 ms instead of 0.1 ms on a
    # busy 2-core machine, waiting for the second thread).
    d = x.shape[0] // H
    contributions = torch.stack([w[:, h * d : (h + 1) * d] @ x[h * d : (h + 1) * d] for h in range(H)])  # H, D
    return contributions, b, F.linear(x, w, b)


def inner_steps(model: nn.Module, attn: nn.Module) -> dict[str, bool]:
    """What this model's attention does beyond plain ``softmax(q k^T / sqrt(d)) v``.

    Keys: ``rope`` (q and k rotated by position after the projections), ``relative_bias``
    (a learned bias per relative position added to the scores), ``qk_norm`` (a norm on q and
    k per head), ``inner_norm`` (a norm between the concatenated heads and W_O, so the input of
    W_O is not the plain concatenation), ``absolute_pos`` (position embeddings added to the
    tokens before the first block).
    """

    def real(m: object) -> bool:
        return isinstance(m, nn.Module) and not isinstance(m, nn.Identity)

    return {
        "rope": getattr(model, "rope", None) is not None,
        "relative_bias": getattr(attn, "relative_position_bias_table", None) is not None
        or getattr(model, "rel_pos_bias", None) is not None,
        "qk_norm": real(getattr(attn, "q_norm", None)),
        "inner_norm": real(getattr(attn, "norm", None)) or getattr(attn, "gate", None) is not None,
        "absolute_pos": getattr(model, "pos_embed", None) is not None,
    }
