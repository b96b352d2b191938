"""A model with weights is built without the random initialisation the weights overwrite
(app/zoo/loaders.py `_create_with`), and holds the same numbers as one built the usual way."""

from __future__ import annotations

import timm
import torch

from headscope.zoo.loaders import _create, _create_with


def usual(arch: str, sd: dict[str, torch.Tensor], **kwargs):
    """Built and initialised, then the weights copied in: what the loaders did before."""
    model, _ = _create(arch, pretrained=False, **kwargs)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    return model, list(missing), list(unexpected)


def weights(arch: str, seed: int = 3, **kwargs) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return {k: v.contiguous() for k, v in timm.create_model(arch, pretrained=False, **kwargs).state_dict().items()}


def assert_same(a: torch.nn.Module, b: torch.nn.Module, size: int = 224) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]), k
    for (name, x), (_, y) in zip(a.named_buffers(), b.named_buffers()):  # those no state dict holds too
        assert torch.equal(x, y), name
    pixels = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(a.eval().forward_features(pixels), b.eval().forward_features(pixels))


def test_a_vit_takes_the_weights_themselves_and_computes_the_same():
    sd = weights("test_vit", num_classes=0)
    model, dynamic, missing, unexpected = _create_with("test_vit", sd, num_classes=0)
    assert (missing, unexpected) == ([], []) and dynamic
    # Its parameters are the loaded tensors (no initialisation computed, no second copy).
    for name, p in model.named_parameters():
        assert p.data_ptr() == sd[name].data_ptr() and p.requires_grad, name
    ref, _, _ = usual("test_vit", sd, num_classes=0)
    assert_same(model, ref, 160)


def test_half_precision_weights_become_the_models_dtype():
    sd = {k: v.half() for k, v in weights("test_vit", num_classes=0).items()}
    model, _, _, _ = _create_with("test_vit", sd, num_classes=0)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert_same(model, usual("test_vit", sd, num_classes=0)[0], 160)


def test_buffers_no_state_dict_holds_are_computed_as_usual():
    # Swin's relative position index and attention masks are not in its state dict.
    kwargs = {"depths": (1, 1, 1, 1), "num_classes": 0}
    sd = weights("swin_tiny_patch4_window7_224", **kwargs)
    model, _, missing, unexpected = _create_with("swin_tiny_patch4_window7_224", sd, **kwargs)
    assert (missing, unexpected) == ([], [])
    assert not any(t.is_meta for t in [*model.parameters(), *model.buffers()])
    assert_same(model, usual("swin_tiny_patch4_window7_224", sd, **kwargs)[0])


def test_missing_and_unexpected_weights_are_reported_as_load_state_dict_reports_them():
    sd = weights("test_vit", num_classes=0)
    lacking = {k: v for k, v in sd.items() if not k.startswith("blocks.0.")}
    lacking["extra.weight"] = torch.zeros(2)
    model, _, missing, unexpected = _create_with("test_vit", lacking, num_classes=0)
    ref, ref_missing, ref_unexpected = usual("test_vit", lacking, num_classes=0)
    assert missing == ref_missing and missing and unexpected == ref_unexpected == ["extra.weight"]
    assert not any(t.is_meta for t in [*model.parameters(), *model.buffers()])
    torch.manual_seed(0)  # what was missing is initialised as timm does, from the same seed
    a, _, _, _ = _create_with("test_vit", lacking, num_classes=0)
    torch.manual_seed(0)
    b, _, _ = usual("test_vit", lacking, num_classes=0)
    assert_same(a, b, 160)
