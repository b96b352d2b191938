"""LeGrad's authors' own code (PyPI ``legrad_torch==1.1``, package ``legrad``: ``LeWrapper`` and its
``compute_legrad``) run on open_clip 3.x, for the tests that check Headscope's ``legrad`` against it.

``legrad_torch`` pins ``open-clip-torch<=2.23.0``; `make test` installs it with ``--no-deps``, next
to open_clip 3.x. Two shims make it run there, here and nowhere in the app:

* **CLIP (open_clip's own VisionTransformer).** open_clip 3.x runs its transformer batch-first
  (``nn.MultiheadAttention(batch_first=True)``, tokens ``[B, N, D]``); open_clip 2.23, which the
  authors wrote against, ran it sequence-first. ``LeWrapper`` replaces the tower's forward with its
  own, which still hands the blocks ``[N, B, D]``, and replaces the attention of the blocks it reads
  (the last two) with its own sequence-first attention; the blocks before them keep PyTorch's
  batch-first attention and would read the tokens as the batch (each token attending to itself
  alone, the embedding silently wrong). :func:`wrap` sets ``batch_first = False`` on every block's
  ``nn.MultiheadAttention``, which makes those blocks read ``[N, B, D]`` as open_clip 2.23's did; the
  test checks the wrapped model's image embedding against open_clip's own.
* **SigLIP (open_clip's timm trunk).** Nothing in the model; the authors' correction encodes
  ``"a photo of a"`` with ``open_clip.get_tokenizer("ViT-B-16-SigLIP")``, which reads the tokenizer
  from the Hugging Face hub: :func:`compute` hands it the test's stand-in tokenizer instead (the one
  the model under test reads).

``at_grid=True`` runs the authors' code with its bilinear upsampling to pixels left out (the
``F.interpolate`` that ``legrad.wrapper`` calls returns its input), so its answer is the map at the
patch grid; ``at_grid=False`` runs it unchanged.
"""

from __future__ import annotations

import types
from contextlib import ExitStack

import pytest
import torch
import torch.nn.functional as F

legrad_wrapper = pytest.importorskip(
    "legrad.wrapper",
    reason="LeGrad's authors' code (legrad_torch) is missing: make test installs it with "
    "`pip install --no-deps legrad_torch==1.1` (it pins an older open_clip)",
)


def wrap(model: torch.nn.Module, layer_index: int = -2):
    """``legrad.LeWrapper(model, layer_index)`` (it modifies ``model`` in place: pass a copy),
    after the batch-first shim for open_clip's own VisionTransformer."""
    from open_clip.transformer import VisionTransformer

    if isinstance(model.visual, VisionTransformer):
        for blk in model.visual.transformer.resblocks:
            blk.attn.batch_first = False  # the blocks read [N, B, D], as in open_clip 2.23
    return legrad_wrapper.LeWrapper(model, layer_index=layer_index)


def _no_upsampling() -> types.SimpleNamespace:
    """``torch.nn.functional`` as ``legrad.wrapper`` sees it, with ``interpolate`` the identity."""
    ns = types.SimpleNamespace(**{k: getattr(F, k) for k in dir(F) if not k.startswith("__")})
    ns.interpolate = lambda x, *args, **kwargs: x
    return ns


def compute(wrapper, text: torch.Tensor, pixels: torch.Tensor, *, at_grid: bool, tokenizer=None) -> torch.Tensor:
    """The authors' ``compute_legrad(text, pixels)``: ``[1, 1, h, w]`` patches (``at_grid``) or
    pixels.

    Args:
        wrapper: from :func:`wrap`.
        text: ``[1, D]`` the phrase's normalised text embedding.
        pixels: ``[1, 3, H, W]``.
        at_grid: leave out the upsampling to pixels (see the module's docstring).
        tokenizer: what ``open_clip.get_tokenizer`` answers meanwhile (SigLIP's correction).
    """
    import open_clip

    with ExitStack() as stack:
        mp = stack.enter_context(pytest.MonkeyPatch.context())
        if at_grid:
            mp.setattr(legrad_wrapper, "F", _no_upsampling())
        if tokenizer is not None:
            mp.setattr(open_clip, "get_tokenizer", lambda *args, **kwargs: tokenizer)
        return wrapper.compute_legrad(text, pixels).detach()
