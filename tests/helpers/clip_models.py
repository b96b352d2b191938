"""open_clip models with random weights for the CLIP tests (no download), and the references the
tests compare against: open_clip's own modules, run as open_clip runs them."""

from __future__ import annotations

from functools import lru_cache

import pytest
import torch

ARCH = "ViT-S-32"  # the smallest plain open_clip ViT: 12 layers of width 384, 7 x 7 patches at 224 px
MODEL_ID = f"open_clip:{ARCH}"


def reference_model(arch: str = ARCH, perturb: bool = True) -> torch.nn.Module:
    """open_clip's model built as ``open_clip:ARCH`` builds it (seed 0), in eval mode.

    Args:
        perturb: add seeded noise to every 1-d parameter (biases, norms, layer scale): open_clip
            starts attention biases at zero, which would hide a bias mapped to the wrong place.
    """
    import open_clip

    torch.manual_seed(0)
    model = open_clip.create_model(arch, pretrained=None).eval().requires_grad_(False)
    if perturb:
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for _, p in model.named_parameters():
                if p.ndim == 1 and p.numel() > 1:
                    p.add_(torch.randn(p.shape, generator=g) * 0.1)
    return model


@lru_cache(maxsize=1)
def shared_model():
    """``open_clip:ViT-S-32`` built as the server builds it, once per test process: the CLIP test
    modules only read it (its text tower's embedding cache aside), so they share one build."""
    from headscope.zoo.ids import ModelSpec
    from headscope.zoo.loaders import build

    return build(ModelSpec.parse(MODEL_ID), None)


@lru_cache(maxsize=1)
def shared_reference():
    """``reference_model(perturb=False)`` once per test process (the tests only read it)."""
    return reference_model(perturb=False)


def mha_maps(visual, x: torch.Tensor) -> list[torch.Tensor]:
    """Every layer's softmax maps ``[B, H, N, N]`` of open_clip's image tower, from PyTorch's own
    ``nn.MultiheadAttention`` (``need_weights=True, average_attn_weights=False``) on each block's
    real input (recorded by plain pre-hooks on open_clip's blocks)."""
    inputs: list[torch.Tensor] = []
    blocks = list(visual.transformer.resblocks)
    handles = [b.register_forward_pre_hook(lambda m, a: inputs.append(a[0])) for b in blocks]
    with torch.no_grad():
        visual(x)
        for h in handles:
            h.remove()
        out = []
        for blk, inp in zip(blocks, inputs):
            h = blk.ln_1(inp)
            _, w = blk.attn(h, h, h, need_weights=True, average_attn_weights=False)
            out.append(w)
    return out


SIGLIP_ARCH = "ViT-B-16-SigLIP"  # open_clip's smallest SigLIP (timm trunk with a MAP head, 14 x 14 patches)
SIGLIP_ID = f"open_clip:{SIGLIP_ARCH}"
STANDIN_WORDS = [
    "a",
    "photo",
    "of",
    "dog",
    "cat",
    "red",
    "car",
    "on",
    "wet",
    "street",
    "the",
    "small",
    "big",
    "with",
    "and",
    "in",
]


def siglip_tokenizer(folder, context_length: int = 64):
    """A stand-in for SigLIP's Hugging Face tokenizer (the real one comes from the hub): a word-level
    fast tokenizer saved to ``folder`` and read back through open_clip's own ``HFTokenizer``, as
    SigLIP's is (``clean='canonicalize'``, padded to the context with ``</s>``, which also ends the
    text; ids 0-2 are ``<pad>``, ``</s>``, ``<unk>`` as in SigLIP's vocabulary)."""
    from open_clip.tokenizer import HFTokenizer
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, **{w: i + 3 for i, w in enumerate(STANDIN_WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="</s>", eos_token="</s>", unk_token="<unk>")
    fast.save_pretrained(str(folder))
    return HFTokenizer(str(folder), context_length=context_length, clean="canonicalize")


def siglip_model(folder):
    """``open_clip:ViT-B-16-SigLIP`` (random weights) built as the server builds it, with the stand-in
    tokenizer in place of the hub's, and open_clip's own model with the same weights: built on the
    meta device and given the loaded model's tensors (its text parts, and the image trunk Headscope
    serves), which saves a second random initialisation of 200 M parameters."""
    import open_clip

    from headscope.zoo.ids import ModelSpec
    from headscope.zoo.loaders import build

    tokenizer = siglip_tokenizer(folder)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(open_clip, "get_tokenizer", lambda name, **kw: tokenizer)
        lm = build(ModelSpec.parse(SIGLIP_ID), None)
    ref = open_clip.create_model(SIGLIP_ARCH, pretrained=None, device="meta")
    text = {k: v.clone() for k, v in lm.text.clip.state_dict().items()}  # its visual is gone (nn.Identity)
    trunk = {f"visual.trunk.{k}": v.clone() for k, v in lm.model.state_dict().items()}
    ref.load_state_dict({**text, **trunk}, strict=True, assign=True)
    assert not any(t.is_meta for t in [*ref.parameters(), *ref.buffers()])
    return lm, ref.eval().requires_grad_(False), tokenizer
