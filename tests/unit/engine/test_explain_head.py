"""One head's computation (q, k, v, scores, softmax, head output, W_O shares) and softmax
temperature equal an independent recomputation from each block's own weights, for every family;
the default model's equal its original ONNX graph's tensors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from timm.layers import apply_rot_embed_cat

from headscope.engine.block_capture import AttentionCapture
from headscope.engine.explain import explain_head, inner_steps
from headscope.engine.forward import forward_capture
from headscope.zoo import embedded, loaders
from helpers.models import FAMILIES, TINY, make
from helpers.server import ROOT

# Every family of the capture tests, plus EVA-CLIP's layout: separate q/k/v projections and a
# LayerNorm between the concatenated heads and W_O (so W_O's input is not the plain concatenation).
EXPLAIN_FAMILIES = [(f[0], f[1], f[2]) for f in FAMILIES] + [
    ("eva02_base_patch16_clip_224", dict(TINY, img_size=64), (64, 64)),
]


def reference_heads(model, x) -> list[dict[str, torch.Tensor]]:
    """Every block's attention written out from its own weights and its real input.

    Block inputs come from plain pre-hooks on the blocks and the projection's output from a
    forward hook on the real ``attn.proj`` module (neither is the capture's). Returns per block:
    q, k, v ``[B, H, N, d]`` (after QK-norm and RoPE), bias ``[H, N, N]`` or None, scores and
    attn ``[B, H, N, N]``, o ``[B, H, N, d]``, proj_in ``[B, N, H*d]`` and proj_out ``[B, N, D]``.
    """
    inputs, proj_out = [], []
    handles = [
        b.register_forward_pre_hook(lambda m, a, kw: inputs.append((a, kw)), with_kwargs=True) for b in model.blocks
    ]
    handles += [b.attn.proj.register_forward_hook(lambda m, a, out: proj_out.append(out)) for b in model.blocks]
    with torch.no_grad():
        model.forward_features(x)
    for h in handles:
        h.remove()
    refs = []
    with torch.no_grad():
        for blk, (args, kwargs), y in zip(model.blocks, inputs, proj_out):
            a = blk.attn
            h = blk.norm1(args[0])
            B, N, _ = h.shape
            H = a.num_heads
            if getattr(a, "qkv", None) is not None:
                qb = getattr(a, "q_bias", None)
                if qb is not None:
                    kb = a.k_bias if a.k_bias is not None else torch.zeros_like(qb)
                    bias_qkv = torch.cat([qb, kb, a.v_bias])
                else:
                    bias_qkv = a.qkv.bias
                qkv = F.linear(h, a.qkv.weight, bias_qkv)
                q, k, v = qkv.reshape(B, N, 3, H, -1).permute(2, 0, 3, 1, 4)
            else:  # separate projections (EVA-CLIP)
                q, k, v = (
                    F.linear(h, p.weight, p.bias).reshape(B, N, H, -1).transpose(1, 2)
                    for p in (a.q_proj, a.k_proj, a.v_proj)
                )
            if hasattr(a, "q_norm"):
                q, k = a.q_norm(q), a.k_norm(k)
            rope = kwargs.get("rope", args[1] if len(args) > 1 else None)
            if type(a).__name__ == "EvaAttention" and rope is not None:
                npt = a.num_prefix_tokens
                half = getattr(a, "rotate_half", False)
                q = torch.cat([q[:, :, :npt], apply_rot_embed_cat(q[:, :, npt:], rope, half=half)], dim=2)
                k = torch.cat([k[:, :, :npt], apply_rot_embed_cat(k[:, :, npt:], rope, half=half)], dim=2)
            d = q.shape[-1]
            scores = (q * d**-0.5) @ k.transpose(-2, -1)
            bias = None
            table = getattr(a, "relative_position_bias_table", None)
            if table is not None:
                # BEiT: table[(relative position index)] -> [H, N, N]
                idx = a.relative_position_index.view(-1)
                bias = table[idx].view(N, N, -1).permute(2, 0, 1)
                scores = scores + bias
            attn = scores.softmax(-1)
            o = attn @ v
            cat = o.transpose(1, 2).reshape(B, N, -1)
            norm = getattr(a, "norm", None)
            proj_in = norm(cat) if norm is not None else cat
            refs.append(dict(q=q, k=k, v=v, bias=bias, scores=scores, attn=attn, o=o, proj_in=proj_in, proj_out=y))
    return refs


def close(a, b, atol, rtol=1e-5):
    torch.testing.assert_close(a, b, atol=atol, rtol=rtol)


@pytest.mark.parametrize("materialise", [False, True], ids=["default", "materialised"])
@pytest.mark.parametrize("name,kwargs,hw", EXPLAIN_FAMILIES, ids=[f[0] for f in EXPLAIN_FAMILIES])
def test_one_heads_computation_matches_independent_recomputation(name, kwargs, hw, materialise):
    model = make(name, kwargs)
    torch.manual_seed(2)
    x = torch.randn(2, 3, *hw)
    refs = reference_heads(model, x)
    cap = AttentionCapture(model)
    with torch.no_grad(), cap.capturing(materialise=materialise):
        model.forward_features(x)
    res = cap.results()
    H = model.blocks[0].attn.num_heads
    N = res[0].num_tokens
    for b in range(2):
        att = res[b]
        for layer, ref in enumerate(refs):
            attn_mod = cap.layers[layer][0]
            for head, query in [(0, 0), (H - 1, N - 1), (1, N // 2)]:
                hc = explain_head(att, attn_mod, layer, head, query)
                d = hc.head_dim
                assert hc.q.shape == (d,) and hc.k.shape == hc.v.shape == (N, d)
                assert hc.head_contributions.shape == (H, ref["proj_out"].shape[-1])
                assert math.isclose(hc.scale, d**-0.5, rel_tol=1e-6)
                close(hc.q, ref["q"][b, head, query], 2e-5)
                close(hc.k, ref["k"][b, head], 2e-5)
                close(hc.v, ref["v"][b, head], 2e-5)
                close(hc.scores, ref["scores"][b, head, query], 5e-5)
                close(hc.attention, ref["attn"][b, head, query], 2e-6)
                # softmax(scores) is the row; scale * q.k + bias are the scores
                close(torch.softmax(hc.scores, -1), hc.attention, 1e-7, 0)
                with_bias = hc.scale * hc.dot + (hc.bias if hc.bias is not None else 0)
                close(with_bias, hc.scores, 2e-5)
                if ref["bias"] is None:
                    assert hc.bias is None
                else:
                    close(hc.bias, ref["bias"][head, query], 1e-6)
                # the row the attention endpoint serves
                close(att.rows(layer, [head], [query])[0, 0], hc.attention, 2e-7, 1e-6)
                close(hc.head_output, ref["o"][b, head, query], 2e-5)
                close(hc.proj_input, ref["proj_in"][b, query], 2e-5)
                if not inner_steps(model, attn_mod)["inner_norm"]:
                    # W_O's input is the plain concatenation: this head's slice is its output
                    close(hc.proj_input[head * d : (head + 1) * d], hc.head_output, 2e-5)
                # sum_h contributions + bias = the output of the real proj module
                y = ref["proj_out"][b, query]
                close(hc.head_contributions.sum(0) + hc.proj_bias, y, 2e-5)
                close(hc.attn_output, y, 2e-5)
                # each share is W_O's columns of that head times that head's slice
                w = attn_mod.proj.weight
                share = w[:, head * d : (head + 1) * d] @ ref["proj_in"][b, query, head * d : (head + 1) * d]
                close(hc.head_contributions[head], share, 2e-5)


def test_inner_steps_name_what_differs():
    def steps(name, kwargs):
        m = make(name, kwargs)
        return inner_steps(m, m.blocks[0].attn)

    vit = steps("vit_small_patch16_224", dict(TINY, img_size=64))
    assert vit == dict(rope=False, relative_bias=False, qk_norm=False, inner_norm=False, absolute_pos=True)
    eva = steps("eva02_tiny_patch14_224", dict(depth=2, img_size=56))
    assert eva["rope"] and not eva["relative_bias"]
    beit = steps("beit_base_patch16_224", dict(TINY, img_size=64))
    assert beit["relative_bias"] and not beit["rope"] and not beit["absolute_pos"]
    assert steps("eva02_base_patch16_clip_224", dict(TINY, img_size=64))["inner_norm"]


@pytest.mark.parametrize("materialise", [False, True], ids=["default", "materialised"])
@pytest.mark.parametrize("name,kwargs,hw", EXPLAIN_FAMILIES, ids=[f[0] for f in EXPLAIN_FAMILIES])
def test_temperature_is_softmax_of_scores_over_t(name, kwargs, hw, materialise):
    model = make(name, kwargs)
    torch.manual_seed(3)
    x = torch.randn(1, 3, *hw)
    refs = reference_heads(model, x)
    cap = AttentionCapture(model)
    with torch.no_grad(), cap.capturing(materialise=materialise):
        model.forward_features(x)
    att = cap.results()[0]
    for layer, ref in enumerate(refs):
        scores = ref["scores"][0]  # H, N, N
        for T in (0.1, 0.5, 3.0, 10.0):
            got = att.rows(layer, temperature=T)
            close(got, (scores / T).softmax(-1), 2e-5 / min(T, 1))
            close(got.sum(-1), torch.ones(got.shape[:-1]), 1e-5, 0)
        # T = 1 is the model itself, whether the maps were kept or are recomputed
        close(att.rows(layer, temperature=1.0), ref["attn"][0], 2e-6)


def test_extreme_temperatures_stay_finite():
    model = make("beit_base_patch16_224", dict(TINY, img_size=64))  # with a relative bias
    cap = AttentionCapture(model)
    with torch.no_grad(), cap.capturing():
        model.forward_features(torch.randn(1, 3, 64, 64))
    att = cap.results()[0]
    logits = att.logits(1)
    cold = att.rows(1, temperature=1e-30)  # 1/T overflows float32: the argmax takes everything
    assert torch.isfinite(cold).all()
    torch.testing.assert_close(cold.argmax(-1), logits.argmax(-1), atol=0, rtol=0)
    torch.testing.assert_close(cold.amax(-1), torch.ones(cold.shape[:-1]), atol=0, rtol=0)
    hot = att.rows(1, temperature=1e30)  # 1/T underflows: uniform
    torch.testing.assert_close(hot, torch.full_like(hot, 1 / att.num_tokens), atol=1e-7, rtol=0)


# -- the default model against its original ONNX graph -------------------------------------
MODELS = ROOT / "models"
GRAPH = "/backbone/encoder/layer.{layer}/attention/"
ONNX_OUTPUTS = {
    "q": "attention/Transpose_1_output_0",  # B, H, N, d
    "k_t": "attention/Transpose_2_output_0",  # B, H, d, N (already transposed)
    "v": "attention/Transpose_output_0",  # B, H, N, d
    "scores": "attention/MatMul_output_0",  # B, H, N, N: (q / 8^1/2) (k / 8^1/2)^T
    "softmax": "attention/Softmax_output_0",
    "o": "attention/MatMul_1_output_0",  # B, H, N, d: softmax @ v
    "concat": "attention/Reshape_3_output_0",  # B, N, H*d: W_O's input
    "proj": "output/dense/Add_output_0",  # B, N, D: W_O x + b, before layer scale
}


@pytest.fixture(scope="module")
def default_model():
    return loaders.load_embedded(MODELS)


@pytest.fixture(scope="module")
def onnx_graph():
    ort = pytest.importorskip("onnxruntime")
    import onnx
    from onnx import numpy_helper

    wheel = (MODELS / "_downloads" / embedded.WHEEL_NAME).read_bytes()
    model = onnx.load_from_string(embedded.read_onnx(wheel))
    names = {
        (layer, key): GRAPH.format(layer=layer) + suffix for layer in range(12) for key, suffix in ONNX_OUTPUTS.items()
    }
    for n in names.values():
        model.graph.output.append(onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None))
    # W_O of every layer as the graph stores it ([in, out]): the second input of the dense MatMul
    inits = {i.name: i for i in model.graph.initializer}
    w_o = {}
    for node in model.graph.node:
        for layer in range(12):
            if node.name == GRAPH.format(layer=layer) + "output/dense/MatMul":
                w_o[layer] = numpy_helper.to_array(inits[node.input[1]])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess, names, w_o


def test_default_model_heads_equal_the_onnx_graph(default_model, onnx_graph):
    sess, names, w_o = onnx_graph
    torch.manual_seed(4)
    x = torch.randn(1, 3, 224, 224)
    keys = list(names)
    got = dict(zip(keys, sess.run([names[k] for k in keys], {"input_image": x.numpy()})))
    att = forward_capture(default_model, x)[0]
    cmp = lambda a, b, tol: np.testing.assert_allclose(a.numpy(), b, atol=tol, rtol=1e-4)  # noqa: E731
    for layer in range(12):
        attn_mod = default_model.capture.layers[layer][0]
        for head, query in [(0, 0), (3, 100), (5, 256)]:
            hc = explain_head(att, attn_mod, layer, head, query)
            cmp(hc.q, got[layer, "q"][0, head, query], 2e-4)
            cmp(hc.k, got[layer, "k_t"][0, head].T, 2e-4)
            cmp(hc.v, got[layer, "v"][0, head], 2e-4)
            cmp(hc.scores, got[layer, "scores"][0, head, query], 5e-4)
            cmp(hc.attention, got[layer, "softmax"][0, head, query], 1e-4)
            cmp(hc.head_output, got[layer, "o"][0, head, query], 2e-4)
            cmp(hc.proj_input, got[layer, "concat"][0, query], 2e-4)
            cmp(hc.attn_output, got[layer, "proj"][0, query], 5e-4)
            # the graph's own W_O ([in, out]) times the graph's concatenation, head by head
            concat = got[layer, "concat"][0, query]
            shares = np.stack([concat[h * 64 : (h + 1) * 64] @ w_o[layer][h * 64 : (h + 1) * 64] for h in range(6)])
            cmp(hc.head_contributions, shares, 5e-4)
        # and every head's softmax row of every query, served at temperature 1
        np.testing.assert_allclose(att.rows(layer).numpy(), got[layer, "softmax"][0], atol=1e-4, rtol=0)
