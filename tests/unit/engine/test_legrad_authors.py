"""Headscope's ``legrad`` for a phrase equals LeGrad's authors' own code (``legrad_torch==1.1``,
``LeWrapper.compute_legrad``) on the same random weights, the same pixels and the same phrase,
for CLIP (``open_clip:ViT-S-32``) and SigLIP (``open_clip:ViT-B-16-SigLIP``).

Headscope answers a ``[h, w]`` map over the patches, min-max normalised and then divided by its sum;
the authors answer ``[1, 1, H, W]`` pixels. Two comparisons, each to 1e-5 absolute (maps in [0, 1]):

* at the patch grid: the authors' code with its upsampling left out (tests/helpers/legrad_authors.py)
  against Headscope's map min-max normalised again (which undoes the division by its sum);
* at the pixels: the authors' code unchanged against Headscope's map taken to pixels by the authors'
  own conventions: CLIP upsamples (bilinear, ``scale_factor=patch``) and then min-maxes, SigLIP
  min-maxes and then upsamples.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("open_clip")

from headscope.engine.relevance import relevance  # noqa: E402
from helpers.clip_models import ARCH, shared_model, shared_reference, siglip_model  # noqa: E402
from helpers.legrad_authors import compute, wrap  # noqa: E402

ATOL = 1e-5


def min_max(x: torch.Tensor) -> torch.Tensor:
    return (x - x.min()) / (x.max() - x.min())


def compare(got: torch.Tensor, wrapper, text, pixels, *, patch: int, upsample_last: bool, tokenizer=None) -> float:
    """Assert both comparisons (see the module's docstring); the largest difference."""
    grid = compute(wrapper, text, pixels, at_grid=True, tokenizer=tokenizer)[0, 0]  # h, w
    ours = min_max(got.double())
    torch.testing.assert_close(ours, grid.double(), atol=ATOL, rtol=0)
    pixels_map = compute(wrapper, text, pixels, at_grid=False, tokenizer=tokenizer)[0, 0]  # H, W
    up = F.interpolate(ours[None, None], scale_factor=patch, mode="bilinear")[0, 0]
    ours_px = min_max(up) if upsample_last else up
    assert ours_px.shape == pixels_map.shape
    torch.testing.assert_close(ours_px, pixels_map.double(), atol=ATOL, rtol=0)
    return max(float((ours - grid).abs().max()), float((ours_px - pixels_map).abs().max()))


def test_clip_legrad_equals_the_authors_code():
    import open_clip

    phrase = "a photo of a red car"
    lm = shared_model()
    ref = copy.deepcopy(shared_reference())  # LeWrapper modifies the model it wraps
    pixels = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        text = F.normalize(ref.encode_text(open_clip.get_tokenizer(ARCH)([phrase])), dim=-1)  # 1, D
        want_embedding = ref.encode_image(pixels)
    wrapper = wrap(ref)
    with torch.no_grad():  # the shim is right: the wrapped tower computes open_clip's own embedding
        torch.testing.assert_close(wrapper.encode_image(pixels), want_embedding, atol=2e-5, rtol=1e-5)
    got = relevance(lm, pixels, f"text:{phrase}", "legrad")[0].maps["legrad"]  # 7, 7
    diff = compare(got, wrapper, text, pixels, patch=wrapper.patch_size, upsample_last=True)
    print(f"CLIP: largest |difference| {diff:.2e}")


def test_siglip_legrad_equals_the_authors_code(tmp_path):
    pytest.importorskip("transformers")  # open_clip's HFTokenizer reads SigLIP's (here a stand-in)
    phrase = "a red car on a wet street"
    lm, ref, tokenizer = siglip_model(tmp_path)
    pixels = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        text = ref.encode_text(tokenizer([phrase]), normalize=True)  # 1, D
        want_embedding = ref.encode_image(pixels)
    wrapper = wrap(ref)
    with torch.no_grad():
        torch.testing.assert_close(wrapper.encode_image(pixels), want_embedding, atol=2e-5, rtol=1e-5)
    got = relevance(lm, pixels, f"text:{phrase}", "legrad")[0].maps["legrad"]  # 14, 14
    # the authors' correction zeroed patches besides the minimum: the comparison covers it
    assert int((got == 0).sum()) >= 2
    diff = compare(got, wrapper, text, pixels, patch=wrapper.patch_size, upsample_last=False, tokenizer=tokenizer)
    print(f"SigLIP: largest |difference| {diff:.2e}")
