"""Capture equals an independent recomputation from each block's own weights, for every family."""

from __future__ import annotations

import pytest
import timm
import torch
import torch.nn.functional as F
from timm.layers import apply_rot_embed_cat
from torch.utils._python_dispatch import TorchDispatchMode

from headscope.engine.block_capture import (
    AttentionCapture,
    CaptureBatch,
    CaptureError,
    QKVPart,
    UnsupportedModelError,
)
from headscope.zoo.loaders import prefix_kinds
from helpers.models import FAMILIES, TINY, make

FAMILY_IDS = [f[0] + ("-qk_norm" if f[1].get("qk_norm") else "") for f in FAMILIES]


def reference_attention(model, x) -> list[torch.Tensor]:
    """softmax(q k^T * scale [+ bias]) per block, from the block's weights and its real input.

    Block inputs are recorded with plain pre-hooks on the blocks (not the capture's hooks); q and
    k are rebuilt from the qkv weights exactly as each family's math defines them.
    """
    inputs = []
    handles = [
        b.register_forward_pre_hook(lambda m, a, kw: inputs.append((a, kw)), with_kwargs=True) for b in model.blocks
    ]
    with torch.no_grad():
        model.forward_features(x)
    for h in handles:
        h.remove()
    maps = []
    for blk, (args, kwargs) in zip(model.blocks, inputs):
        a = blk.attn
        h = blk.norm1(args[0])
        B, N, _ = h.shape
        qb = getattr(a, "q_bias", None)
        if qb is not None:
            kb = a.k_bias if a.k_bias is not None else torch.zeros_like(qb)
            qkv = F.linear(h, a.qkv.weight, torch.cat([qb, kb, a.v_bias]))
        else:
            qkv = a.qkv(h)
        q, k, _ = qkv.reshape(B, N, 3, a.num_heads, -1).permute(2, 0, 3, 1, 4)
        if hasattr(a, "q_norm"):  # BEiT has no QK-norm slot
            q, k = a.q_norm(q), a.k_norm(k)
        rope = kwargs.get("rope", args[1] if len(args) > 1 else None)
        if type(a).__name__ == "EvaAttention" and rope is not None:
            npt = a.num_prefix_tokens
            q = torch.cat([q[:, :, :npt], apply_rot_embed_cat(q[:, :, npt:], rope)], dim=2)
            k = torch.cat([k[:, :, :npt], apply_rot_embed_cat(k[:, :, npt:], rope)], dim=2)
        logits = (q * a.scale) @ k.transpose(-2, -1)
        if getattr(a, "relative_position_bias_table", None) is not None:
            logits = logits + a._get_rel_pos_bias()
        maps.append(logits.softmax(-1))
    return maps


@pytest.mark.parametrize("materialise", [False, True], ids=["default", "materialised"])
@pytest.mark.parametrize("name,kwargs,hw,prefix,kind", FAMILIES, ids=FAMILY_IDS)
def test_capture_matches_independent_recomputation(name, kwargs, hw, prefix, kind, materialise):
    model = make(name, kwargs)
    torch.manual_seed(1)
    x = torch.randn(2, 3, *hw)
    ref = reference_attention(model, x)
    cap = AttentionCapture(model)
    assert [k for _, k in cap.layers] == [kind] * len(model.blocks)
    assert prefix_kinds(model) == prefix
    fused_before = [a.fused_attn for a, _ in cap.layers]
    with torch.no_grad():
        plain = model.forward_features(x)
        with cap.capturing(materialise=materialise):
            hooked = model.forward_features(x)
    res = cap.results()
    assert [a.fused_attn for a, _ in cap.layers] == fused_before, "fused attention must be restored"
    torch.testing.assert_close(hooked, plain, atol=1e-5, rtol=1e-5)  # the model's own output
    assert len(res) == 2
    # q, k and v are always kept (any row, any temperature, one head's computation); the maps
    # too when materialised (from the unfused branch, or its math for sdpa layers).
    assert all(q is not None and v is not None for r in res for q, v in zip(r.q, r.v))
    assert all((p is not None) == materialise for r in res for p in r.probs)
    patch = model.patch_embed.patch_size
    n = len(prefix) + (hw[0] // patch[0]) * (hw[1] // patch[1])
    for b in range(2):
        assert res[b].num_tokens == n and res[b].num_layers == len(model.blocks)
        for layer, r in enumerate(ref):
            got = res[b].rows(layer)
            assert got.shape == r[b].shape == (model.blocks[0].attn.num_heads, n, n)
            torch.testing.assert_close(got, r[b], atol=2e-6, rtol=1e-5)
            torch.testing.assert_close(got.sum(-1), torch.ones(got.shape[:-1]), atol=1e-5, rtol=0)
            # A selection equals the same slice of the full map.
            part = res[b].rows(layer, [1, 0], [n - 1, 0])
            torch.testing.assert_close(part, got[[1, 0]][:, [n - 1, 0]], atol=1e-6, rtol=1e-5)


def test_qk_capture_keeps_the_forward_fused_and_output_unchanged():
    model = make("vit_small_patch16_224", dict(TINY, img_size=64))
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        plain = model.forward_features(x)
    cap = AttentionCapture(model)
    assert all(a.fused_attn for a, _ in cap.layers)
    with torch.no_grad(), cap.capturing():
        hooked = model.forward_features(x)
    cap.results()
    torch.testing.assert_close(hooked, plain, atol=0, rtol=0)


def test_one_hook_on_qkv_keeps_q_k_and_v_without_qk_norm():
    """Without QK-norm q, k and v are views of qkv's output: one hook a layer (each hooked module
    call costs the host a few microseconds); with it, q and k come from the norms' own hooks."""
    for qk_norm in (False, True):
        model = make("vit_small_patch16_224", dict(TINY, img_size=64, qk_norm=qk_norm))
        attn = model.blocks[0].attn
        cap = AttentionCapture(model)
        with cap.capturing():
            assert len(attn.qkv._forward_hooks) == 1
            assert len(attn.q_norm._forward_hooks) == len(attn.k_norm._forward_hooks) == int(qk_norm)
        assert not (attn.qkv._forward_hooks or attn.q_norm._forward_hooks or attn.k_norm._forward_hooks)


def test_q_k_and_v_are_timm_s_own_views_made_when_first_read():
    """Without QK-norm the capture keeps qkv's output, and q, k and v are made from it when first
    read (`QKVPart`: one view each, where timm's reshape, permute and unbind are three operators
    the host dispatches per layer and call): the same memory, values and strides as timm's, and
    q's rows alone in one view. A CLS capture reads no v, so none is made."""
    model = make("vit_small_patch16_224", dict(TINY, img_size=64))
    H = model.blocks[0].attn.num_heads
    outs: list[torch.Tensor] = []
    handles = [b.attn.qkv.register_forward_hook(lambda m, a, o: outs.append(o)) for b in model.blocks]
    cap = AttentionCapture(model)
    with torch.inference_mode(), cap.capturing():
        model.forward_features(torch.randn(2, 3, 64, 64))
    for h in handles:
        h.remove()
    views = cap.results()[0].views
    assert views is not None
    for name in "qkv":
        assert all(isinstance(p, QKVPart) for p in views.tensors[name]._items)  # none made yet
    for layer, out in enumerate(outs):
        B, N, _ = out.shape
        want = out.reshape(B, N, 3, H, -1).permute(2, 0, 3, 1, 4).unbind(0)  # timm's
        rows = views.tensors["q"].rows(layer, [2, 3, 4])
        assert torch.equal(rows, want[0].narrow(2, 2, 3)) and rows.stride() == want[0].stride()
        for j, name in enumerate("qkv"):
            got = views.tensors[name][layer]
            assert torch.equal(got, want[j]) and got.stride() == want[j].stride()
            assert got.data_ptr() == want[j].data_ptr()  # a view, no copy
    # qkv's output not contiguous (no linear gives one; a model could): timm's own operators
    odd = torch.randn(2, 3 * H * 4, 5).transpose(1, 2)  # B, N, 3 * H * d
    want = odd.reshape(2, 5, 3, H, 4).permute(2, 0, 3, 1, 4)
    for j in range(3):
        assert torch.equal(QKVPart(odd, H, j).view(), want[j])
        assert torch.equal(QKVPart(odd, H, j).view((1, 2)), want[j].narrow(2, 1, 2))


@pytest.mark.parametrize("name,kwargs,hw,prefix,kind", FAMILIES, ids=FAMILY_IDS)
def test_layer_rows_equal_each_layer_s_rows_bit_for_bit(name, kwargs, hw, prefix, kind, monkeypatch):
    """`CaptureBatch.layer_rows` (the layers' rows in a few products) gives each layer's own
    `rows`, bit for bit: any heads, queries, temperature and batch-mates, in runs of layers
    bounded by STACK_BYTES too, and layers with a bias (BEiT) or kept maps one by one."""
    model = make(name, kwargs)
    torch.manual_seed(2)
    x = torch.randn(3, 3, *hw)
    for materialise in (False, True):
        cap = AttentionCapture(model)
        with torch.no_grad(), cap.capturing(materialise=materialise):
            model.forward_features(x)
        res = cap.results()
        batch, L, H, n = res[0].batch, res[0].num_layers, res[0].num_heads, res[0].num_tokens
        layers = list(range(L))
        cases = [(None, [0], 1.0, [0, 1, 2]), ([1, 0], [n - 1, 0], 0.5, [2]), (None, None, 1.0, [1])]
        for bound in (CaptureBatch.STACK_BYTES, 2 * len(cases[0][3]) * H * n * res[0].q[0].shape[-1] * 4):
            monkeypatch.setattr(CaptureBatch, "STACK_BYTES", bound)
            for heads, queries, t, images in cases:
                out = torch.empty(L, len(images), len(heads or range(H)), len(queries or range(n)), n)
                batch.layer_rows(layers, images, heads, queries, out, t)
                for layer in layers:
                    for j, b in enumerate(images):
                        assert torch.equal(out[layer, j], res[b].rows(layer, heads, queries, temperature=t))


def test_empty_capture_raises():
    model = make("test_vit", {})
    cap = AttentionCapture(model)
    with cap.capturing():
        pass  # the model never ran: a silent empty capture must not pass
    with pytest.raises(CaptureError, match="expected once"):
        cap.results()


def test_double_forward_inside_one_capture_raises():
    model = make("test_vit", {})
    cap = AttentionCapture(model)
    x = torch.randn(1, 3, *model.patch_embed.img_size)
    with torch.no_grad(), cap.capturing():
        model.forward_features(x)
        model.forward_features(x)
    with pytest.raises(CaptureError):
        cap.results()


def test_hooks_are_removed_after_capture():
    model = make("test_vit", {})
    cap = AttentionCapture(model)
    with torch.no_grad(), cap.capturing():
        model.forward_features(torch.randn(1, 3, *model.patch_embed.img_size))
    cap.results()
    for blk in model.blocks:
        assert not blk._forward_hooks and not blk.attn.q_norm._forward_hooks
        assert not blk.attn.proj._forward_pre_hooks and not blk.attn.attn_drop._forward_pre_hooks


@pytest.mark.parametrize(
    "name,kwargs",
    [
        ("xcit_nano_12_p16_224", {}),
        ("cait_xxs24_224", {}),
        ("mvitv2_tiny", {}),
    ],
)
def test_unsupported_families_are_refused_with_the_supported_list(name, kwargs):
    model = timm.create_model(name, pretrained=False, num_classes=0, **kwargs)
    with pytest.raises(UnsupportedModelError, match="supported families: vit, deit"):
        AttentionCapture(model)


class _CopiesOver(TorchDispatchMode):
    """Records every op that copies a tensor of more than ``limit`` bytes."""

    COPIES = {"clone", "copy_", "_to_copy", "contiguous", "cat", "stack", "index_select"}

    def __init__(self, limit: int):
        super().__init__()
        self.limit, self.seen = limit, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name in self.COPIES and isinstance(out, torch.Tensor) and out.nbytes > self.limit:
            self.seen.append((name, tuple(out.shape)))
        return out


@pytest.mark.parametrize(
    "name,kwargs",
    [
        ("vit_small_patch14_dinov2", dict(TINY, img_size=56)),
        ("beit_base_patch16_224", dict(TINY, img_size=64)),
    ],
)
def test_captures_are_views_of_the_forward_and_later_forwards_leave_them_alone(name, kwargs):
    model = make(name, kwargs)
    cap = AttentionCapture(model)
    size = model.patch_embed.img_size
    x = torch.randn(2, 3, *size)
    with torch.inference_mode():
        with cap.capturing():
            model.forward_features(x[:1])
        lone = cap.results()[0]
        before = [lone.rows(layer).clone() for layer in range(lone.num_layers)]
        with cap.capturing():
            model.forward_features(x)
        # Splitting a batch copies nothing but the token norms (B x N floats): no transfer
        # from a GPU, no copy on the host.
        with _CopiesOver(limit=x.shape[0] * lone.num_tokens * 4) as copies:
            pair = cap.results()
        assert copies.seen == []
        # Later forwards must not write into an earlier capture that the cache may still hold.
        with cap.capturing():
            model.forward_features(torch.randn(1, 3, *size))
        cap.results()
    for layer in range(lone.num_layers):
        torch.testing.assert_close(lone.rows(layer), before[layer], atol=0, rtol=0)
        torch.testing.assert_close(lone.rows(layer), pair[0].rows(layer), atol=2e-6, rtol=1e-5)
    # Batch-mates are views of the same batch tensors; a cache charges those buffers once.
    shared = lambda a: {k for k in a.storages() if k[1] != a.last_norms.untyped_storage().data_ptr()}
    assert shared(pair[0]) == shared(pair[1]) and shared(pair[0])
    # Size accounting counts what is kept alive: a storage once, however many views use it.
    held = {
        t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
        for t in (*lone.q, *lone.k, *lone.v, *lone.bias, *lone.probs, *lone.head_out, lone.last_norms)
        if t is not None
    }
    assert lone.nbytes() == sum(held.values()) > 0


def test_captures_can_be_moved_off_the_forward_device():
    model = make("vit_small_patch16_224", dict(TINY, img_size=64))
    cap = AttentionCapture(model)
    with torch.inference_mode():
        with cap.capturing():
            model.forward_features(torch.randn(2, 3, 64, 64))
        # 'meta' stands in for a second device: the CPU-only build has no other.
        moved = cap.results(to="meta")
    for att in moved:
        # the last block's token norms go with the rest: kept where the capture is, like its q and k
        assert att.device.type == "meta" and att.last_norms.device.type == "meta"
        assert all(t.device.type == "meta" for t in (*att.q, *att.k, *att.head_out))
        # rows are computed where the capture is kept
        assert all(t.device.type == "meta" for t in att.v)
        assert att.rows(1, queries=[0]).device.type == "meta"
        assert tuple(att.rows(1, queries=[0]).shape) == (4, 1, 17)


def test_capture_after_a_materialised_one_goes_back_to_q_and_k():
    model = make("vit_small_patch16_224", dict(TINY, img_size=64))
    cap = AttentionCapture(model)
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        with cap.capturing(materialise=True):
            model.forward_features(x)
        assert all(p is not None for p in cap.results()[0].probs)
        with cap.capturing():
            model.forward_features(x)
    assert all(p is None for p in cap.results()[0].probs)


@pytest.mark.parametrize("hw", [(64, 64), (128, 128), (192, 192)])
def test_materialise_only_while_the_maps_stay_at_most_about_twice_the_qk_capture(hw):
    model = make("vit_small_patch16_224", dict(TINY, img_size=64))  # head_dim 16: up to 128 tokens
    cap = AttentionCapture(model)
    x = torch.randn(1, 3, *hw)
    N = 1 + (hw[0] // 16) * (hw[1] // 16)
    sizes = {}
    with torch.no_grad():
        for materialise in (False, True):
            with cap.capturing(materialise=materialise):
                model.forward_features(x)
            sizes[materialise] = cap.results()[0].nbytes()
    extra = sizes[True] / sizes[False] - 1
    # the maps H*N^2 come on top of qkv 3*N*D + head outputs N*D, per layer
    assert cap.materialise_pays(N) == (N <= 8 * 16)
    assert (extra <= 2.05) == cap.materialise_pays(N), (N, extra)


@pytest.mark.parametrize(
    "name,kwargs",
    [("eva02_tiny_patch14_224", dict(depth=2, img_size=56)), ("beit_base_patch16_224", dict(TINY, img_size=64))],
)
def test_a_forward_that_fails_inside_attention_leaves_no_mode_or_hook_behind(name, kwargs):
    model = make(name, kwargs)
    cap = AttentionCapture(model)
    size = model.patch_embed.img_size

    def boom(module, args):
        raise RuntimeError("out of memory, say")

    # fails after the attention module of block 1 entered its SDPA recorder, before it left it
    handle = model.blocks[1].attn.proj.register_forward_pre_hook(boom)
    with torch.no_grad(), pytest.raises(RuntimeError, match="out of memory"), cap.capturing():
        model.forward_features(torch.randn(1, 3, *size))
    handle.remove()
    assert torch._C._len_torch_function_stack() == 0
    for blk in model.blocks:
        assert not blk.attn._forward_hooks and not blk.attn._forward_pre_hooks
    # and the next capture works
    with torch.no_grad(), cap.capturing():
        model.forward_features(torch.randn(1, 3, *size))
    assert len(cap.results()) == 1
