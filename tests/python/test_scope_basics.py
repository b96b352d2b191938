"""``headscope.load`` / ``Scope.attention`` in-process, on a tiny random-weight ViT: the maps
against an independent softmax(q k^T) of the timm module, list and picture inputs, the
result's fields, statistics, explain, and bad arguments."""

from __future__ import annotations

import hashlib
import io
import re

import numpy as np
import pytest
import timm
import torch
from PIL import Image

import headscope
from headscope.python.inputs import pixels_id, png_bytes

MODEL = "random:test_vit"


@pytest.fixture(scope="module")
def scope(tmp_path_factory):
    return headscope.load(MODEL, device="cpu", models_dir=tmp_path_factory.mktemp("models"))


def _picture(seed: int, hw=(60, 90)) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (*hw, 3), dtype=np.uint8)


def _reference(model: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """Every block's softmax(q k^T * scale), from the block's input and its own qkv weights."""
    inputs: list[torch.Tensor] = []
    hooks = [b.attn.register_forward_pre_hook(lambda m, a: inputs.append(a[0])) for b in model.blocks]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in hooks:
            h.remove()
    out = []
    for blk, h in zip(model.blocks, inputs):
        a = blk.attn
        B, N, C = h.shape  # batch, tokens, channels
        qkv = a.qkv(h).reshape(B, N, 3, a.num_heads, C // a.num_heads).permute(2, 0, 3, 1, 4)
        q, k = a.q_norm(qkv[0]), a.k_norm(qkv[1])
        out.append(((q * a.scale) @ k.transpose(-2, -1)).softmax(-1))  # B, H, N, N
    return out


def test_maps_are_the_models_softmax(scope):
    att = scope.attention(_picture(0), query="all")
    assert isinstance(scope.model, torch.nn.Module) and scope.model is scope.lm.model
    x = scope.pictures.prepare(att.image_bytes).pixels[None]
    ref = torch.stack([r[0] for r in _reference(scope.model, x)])  # L, H, N, N
    assert att.maps.shape == ref.shape
    torch.testing.assert_close(att.maps, ref, atol=2e-6, rtol=1e-5)
    assert np.shares_memory(att.numpy(), att.maps.numpy())
    rows, cols = att.grid
    assert att.tokens["count"] == ref.shape[-1] == att.tokens["num_prefix"] + rows * cols
    # the hooks are gone once Headscope is done: the module is the user's again
    assert all(not b.attn._forward_hooks and not b.attn._forward_pre_hooks for b in scope.model.blocks)


def test_pictures_of_every_kind_and_lists(scope, tmp_path):
    arr = _picture(1)
    pil = Image.fromarray(arr)
    path = tmp_path / "p.png"
    pil.save(path)
    data = path.read_bytes()
    one = scope.attention(arr, layers=-1, heads=[1, 0], query=(1, 2))
    many = scope.attention([arr, pil, path, data, str(path)], layers=-1, heads=[1, 0], query=(1, 2))
    assert len(many) == 5
    png = png_bytes(arr)
    assert one.image_id == pixels_id(pil) != hashlib.sha256(png).hexdigest()[:24]  # pixels, not a PNG, hashed
    assert one.image_bytes == png  # the lossless PNG, when asked for
    assert [a.image_id for a in many[:2]] == [one.image_id] * 2
    assert {a.image_id for a in many[2:]} == {hashlib.sha256(data).hexdigest()[:24]}
    assert many[2].filename == "p.png"
    for a in many:
        torch.testing.assert_close(a.maps, one.maps, atol=1e-6, rtol=0)  # batched == alone
    assert one.maps.shape[:3] == (1, 2, 1) and one.layers == [scope.lm.num_layers - 1] and one.heads == [1, 0]
    assert Image.open(io.BytesIO(png)).tobytes() == arr.tobytes()  # lossless


def test_stats_and_explain(scope):
    from headscope.survey.schema import ROWS

    att = scope.attention(_picture(2))
    df = att.stats()
    L, H = scope.lm.num_layers, scope.lm.num_heads
    assert list(df.columns) == ROWS.names and len(df) == L * H
    assert df["layer"].tolist() == np.repeat(np.arange(L), H).tolist()
    ex = att.explain(-1, 1, "cls")
    assert ex["layer"] == L - 1 and ex["head"] == 1 and ex["query"] == 0
    torch.testing.assert_close(ex["attention"].reshape(-1), att.maps[-1, 1, 0], atol=1e-6, rtol=0)


def test_a_module_in_memory_keeps_its_state():
    model = timm.create_model("test_vit", pretrained=False, num_classes=3)
    model.train()
    scope = headscope.load(model)
    assert scope.model is model and scope.lm.output_kind == "classes"
    att = scope.attention(_picture(3), layers=0)
    assert att.maps.shape[0] == 1 and model.training and all(m.training for m in model.modules())
    assert all(p.requires_grad for p in model.parameters())


def test_a_module_in_memory_is_named_by_its_architecture_or_the_id_given():
    """timm sets a pretrained tag in ``pretrained_cfg`` for random weights too: a module's results
    are named by its architecture (not ``test_vit.r160_in1k``, weights it may not hold), or by
    ``model_id``."""
    model = timm.create_model("test_vit", pretrained=False, num_classes=3)
    assert model.pretrained_cfg.get("tag")  # what the old id spelt out
    assert headscope.load(model).id == "test_vit"
    mine = headscope.load(model, model_id="my-finetune")
    assert mine.id == "my-finetune" and mine.attention(_picture(3), layers=0).meta["model"] == "my-finetune"
    with pytest.raises(TypeError, match="model_id names a timm model object"):
        headscope.load("random:test_vit", model_id="x")
    with pytest.raises(TypeError, match="non-empty string"):
        headscope.load(model, model_id="")


def test_a_result_copies_in_process_and_says_why_it_is_not_pickled():
    """A result is tied to its loaded model: ``copy.deepcopy`` copies its numbers and shares the
    model (select and stats still work); pickling raises a TypeError that says what to save."""
    import copy
    import pickle

    scope = headscope.load("random:test_vit", device="cpu")
    att = scope.attention(_picture(3), layers=0)
    twin = copy.deepcopy(att)
    assert twin.lm is att.lm and twin.lm.model is att.lm.model and torch.equal(twin.maps, att.maps)
    assert twin.maps.data_ptr() != att.maps.data_ptr()
    assert torch.equal(twin.select(query="all").maps, att.select(query="all").maps)
    assert twin.stats().equals(att.stats())
    assert copy.copy(att).maps is att.maps
    with pytest.raises(TypeError, match=r"not pickled: keep its numbers instead, e\.g\. torch\.save"):
        pickle.dumps(att)


def test_a_module_added_after_a_call_is_in_eval_mode_while_headscope_computes():
    """The walk over the model's modules is kept between calls, and forgotten when a module is
    added: a new module (in training mode, as every new module is) is in eval mode during the
    next call and back in training mode after it."""
    model = timm.create_model("test_vit", pretrained=False, num_classes=3).eval()
    scope = headscope.load(model)
    scope.attention(_picture(3), layers=0)
    seen: list[bool] = []
    extra = torch.nn.Identity()
    extra.register_forward_hook(lambda m, args, out: seen.append(m.training))
    model.blocks[0].ls1 = torch.nn.Sequential(model.blocks[0].ls1, extra)
    scope.attention(_picture(3), layers=0)
    assert seen == [False] and extra.training


def test_overlapping_calls_keep_a_training_model_in_eval_mode_until_the_last_one_ends():
    """Calls that take the model's lock only inside their work (output, importance, pruning)
    overlap with another thread's: the second one in found the modules in eval mode already, and
    the first one out set them training under the second one's forwards (dropout on: 6 of 40
    outputs differed beside a thread computing attention)."""
    model = timm.create_model("test_vit", pretrained=False, num_classes=3, drop_rate=0.5).train()
    scope = headscope.load(model)
    first, second = scope.computing(lock=False), scope.computing(lock=False)
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert not any(m.training for m in model.modules())  # the second call is still computing
    second.__exit__(None, None, None)
    assert all(m.training for m in model.modules())


def test_a_big_endian_float_array_is_the_picture_of_its_values(scope):
    """FITS and some TIFF readers give ``>f4``: it was refused with advice (``astype(np.uint8)``)
    that turned values 0..1 into a black picture."""
    a = np.random.default_rng(7).random((40, 50, 3), dtype=np.float32)
    want = scope.attention(a, layers=0).maps
    got = scope.attention(a.astype(">f4"), layers=0).maps
    assert torch.equal(got, want)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_a_model_whose_weights_are_not_float32_is_refused_with_the_way_to_half_precision(dtype):
    """``load(model.half())`` loaded, then every call was torch's "Input type (float) and bias type
    (c10::Half) should be the same"; a float64 model's relevance said fp32."""
    model = timm.create_model("test_vit", pretrained=False, num_classes=3).to(dtype)
    name = str(dtype).removeprefix("torch.")
    with pytest.raises(ValueError, match=f"weights are {name}: .*model.float\\(\\).*precision='bf16'"):
        headscope.load(model)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"layers": 99}, ValueError, "layers: index 99 is out of range"),
        ({"temperature": 0}, ValueError, "temperature: Input should be greater than 0"),
        ({"query": "patch:99,99"}, ValueError, "query: patch (99, 99) is outside"),
        ({"heads": [0.5]}, TypeError, "heads: None (all), an int"),
        ({"layers": []}, ValueError, "layers: an empty selection selects nothing"),  # not "all" (the text "")
        ({"heads": np.array([0.5])}, TypeError, "heads: None (all), an int"),
        ({"aggregate": "median"}, ValueError, "aggregate: Input should be"),
    ],
)
def test_bad_arguments(scope, kwargs, error, message):
    with pytest.raises(error) as e:
        scope.attention(_picture(4), **kwargs)
    assert str(e.value).startswith(message)


def test_bad_pictures(scope, tmp_path):
    with pytest.raises(TypeError, match="a picture is a path, bytes"):
        scope.attention(3.5)
    with pytest.raises(TypeError, match="uint8"):
        scope.attention(np.zeros((8, 8, 3), np.int64))
    with pytest.raises(ValueError, match=r"0\.\.1 \(not the model's normalised input"):
        scope.attention(np.full((8, 8, 3), 200.0, np.float32))  # 0..255 as floats
    with pytest.raises(ValueError, match=r"pictures\[1\]: .*missing.png"):
        scope.attention([_picture(5), tmp_path / "missing.png"])
    with pytest.raises(ValueError, match="not an image"):
        scope.attention(b"not a picture")
    with pytest.raises(ValueError, match=r"^https://example\.org/cat\.png: a URL; .*download it first"):
        scope.attention("https://example.org/cat.png")  # named as given, not as a path with "//" folded
    # 16-bit levels: astype(np.uint8) would wrap them, so the hint divides
    with pytest.raises(TypeError, match=r"got uint16: convert it, e\.g\. \(a // 257\)\.astype\(np\.uint8\)"):
        scope.attention(np.zeros((8, 8, 3), np.uint16))
    # a mask: astype(np.uint8) alone gives levels 0 and 1, so the hint scales it
    with pytest.raises(TypeError, match=r"got bool: convert it, e\.g\. a\.astype\(np\.uint8\) \* 255"):
        scope.attention(np.zeros((8, 8, 3), bool))
    # a 0-d or 1-d array is a shape error (a 0-d one said "shape (1,)")
    with pytest.raises(ValueError, match=r"HxWx3 \(RGB\), HxWx4 \(RGBA\) or HxW \(grey\); got shape \(\)$"):
        scope.attention(np.array(0.5))
    # a file that is not a picture: the error names it, alone as in a list
    text = tmp_path / "notes.txt"
    text.write_text("not a picture")
    with pytest.raises(ValueError, match=f"^{re.escape(str(text))}: the file is not an image"):
        scope.attention(text)
    with pytest.raises(ValueError, match=f"^pictures\\[0\\]: {re.escape(str(text))}: the file is not an image"):
        scope.attention([text])
    with pytest.raises(ValueError, match="has no architecture named"):
        headscope.load("random:no_such_arch_xyz")


@pytest.mark.parametrize(
    ("size", "error", "message"),
    [
        (0, ValueError, "at least 1; got 0"),
        (-3, ValueError, "got -3"),
        (2.5, TypeError, "got 2.5"),
        ("8", TypeError, "got '8'"),
    ],
)
def test_a_batch_size_that_is_not_a_count_is_refused_before_the_model_loads(size, error, message):
    with pytest.raises(error, match=f"batch_size: .*{message}"):
        headscope.load("random:no_such_arch_xyz", batch_size=size)  # the model's error would come later
    assert headscope.load(MODEL, device="cpu", batch_size=np.int64(3)).batch_size == 3


def test_version_and_lazy_import():
    import subprocess
    import sys

    assert headscope.__version__ and headscope.__version__[0].isdigit()
    code = "import sys, headscope; assert 'torch' not in sys.modules, 'import headscope pulled in torch'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_integer_arrays_and_tensors_select_as_lists_do(scope):
    want = scope.attention(_picture(6), layers=[0, -1], heads=[1], query=[0, 2])
    for layers, heads, query in [
        (np.array([0, -1]), np.array([1]), np.array([0, 2])),
        (torch.tensor([0, -1]), torch.tensor(1), torch.tensor([0, 2])),
    ]:
        got = scope.attention(_picture(6), layers=layers, heads=heads, query=query)
        assert got.layers == want.layers and got.heads == want.heads
        assert torch.equal(got.maps, want.maps)


def test_select_is_another_answer_of_the_same_capture(scope):
    pic = _picture(6)
    att = scope.attention(pic, layers=0, query="cls", temperature=0.5)
    again = att.select(layers=[1, -1], heads=1, query=(0, 1))
    want = scope.attention(pic, layers=[1, -1], heads=1, query=(0, 1), temperature=0.5)
    torch.testing.assert_close(again.maps, want.maps, atol=0, rtol=0)
    assert again.params.temperature == 0.5 and again.image_id == att.image_id
    with pytest.raises(TypeError, match="select\\(\\) takes .*scope.attention\\(image, ablate="):
        att.select(ablate="0:1")
    # A rollout's options are refused without a rollout, and left behind by select() to another aggregate.
    with pytest.raises(ValueError, match="discard_ratio: an option of aggregate=rollout"):
        scope.attention(pic, discard_ratio=0.5)
    rolled = scope.attention(pic, aggregate="rollout", head_fusion="max", discard_ratio=0.5, query="cls")
    fused = rolled.select(aggregate="mean", layers=-1)
    torch.testing.assert_close(fused.maps, scope.attention(pic, aggregate="mean", layers=-1, query="cls").maps)
    assert fused.params.discard_ratio == 0 and fused.params.head_fusion == "mean"


def test_cells_and_pairs_as_lists_and_arrays(scope):
    """A list of cells (or of ``(layer, head)`` pairs) may hold ``[a, b]`` lists, or be an
    ``N x 2`` integer array or tensor (``np.argwhere``'s shape): they were refused. A lone list
    of two ints stays two token indices, and the error says a cell is a tuple."""
    pic = _picture(7)
    want = scope.attention(pic, layers=-1, query=[(0, 1), (2, 3)], ablate=[(0, 1), (1, 0)])
    for query, ablate in [
        ([[0, 1], [2, 3]], [[0, 1], [1, 0]]),
        (np.array([[0, 1], [2, 3]]), np.array([[1, 0], [0, 1]])),
        (torch.tensor([[0, 1], [2, 3]]), ((1, 0), (0, 1))),
    ]:
        got = scope.attention(pic, layers=-1, query=query, ablate=ablate)
        assert got.query == want.query and got.ablate == want.ablate == ((0, 1), (1, 0))
        assert torch.equal(got.maps, want.maps)
    assert scope.attention(pic, layers=-1, query=[0, 1]).query == [0, 1]  # two token indices, not a cell
    with pytest.raises(TypeError, match="a cell as a tuple"):
        scope.attention(pic, query=[[0, 1, 2]])
    with pytest.raises(TypeError, match="N x 2 array"):
        scope.attention(pic, ablate=np.array([[0, 1, 2]]))


def test_the_default_query_is_the_cls_row(scope):
    """No query: the CLS row (the first patch's on a model without a CLS token, in
    test_scope_vs_api.py against the server for SigLIP and Swin)."""
    pic = _picture(8)
    assert torch.equal(scope.attention(pic, layers=-1).maps, scope.attention(pic, layers=-1, query="cls").maps)
    assert scope.attention(pic, layers=-1).query == [0]


def test_true_and_false_go_only_to_the_switches(scope):
    """``mass=True`` was a mass of 1 and ``temperature=True`` a temperature of 1 (pydantic reads a
    bool as a number), where the REST API refuses ``mass=true``."""
    from headscope.python.params import ParameterError

    att = scope.attention(_picture(3), layers=-1, heads=0)
    with pytest.raises(ParameterError, match="mass: a number or text, not True"):
        att.stats(mass=True)
    with pytest.raises(ParameterError, match="temperature: a number or text, not False"):
        scope.attention(_picture(3), layers=-1, heads=0, temperature=False)
    assert att.stats(mass=1).shape[0] > 0  # the number itself is taken


def test_explain_takes_none_for_its_defaults_and_no_bool(scope):
    """``explain(layer=None)`` was "layer: Input should be a valid integer" where None is the
    default everywhere else; ``explain(layer=True)`` explained layer 1."""
    from headscope.python.params import ParameterError

    att = scope.attention(_picture(4), layers=-1, heads=0)
    default = att.explain()
    none = att.explain(layer=None, head=None)
    assert none["layer"] == default["layer"] and none["head"] == default["head"] == 0
    assert torch.equal(none["attention"], default["attention"])
    with pytest.raises(ParameterError, match="layer: a number or text, not True"):
        att.explain(layer=True)
