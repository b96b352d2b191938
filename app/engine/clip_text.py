"""The text side of a CLIP-style model (open_clip's CLIP and SigLIP): phrases -> embeddings, and
the image-text score the model is trained on.

:class:`TextTower` holds an open_clip model's text encoder (its image tower is the timm ViT the
rest of the engine captures, see :mod:`app.zoo.open_clip_models`) and its tokenizer. Its forward
is written out block by block from the blocks' own weights (``nn.MultiheadAttention``'s
``in_proj``/``out_proj``) so that every layer's softmax map ``[B, H, T, T]`` can stay in the
autograd graph: the text's per-token relevance (Chefer et al. 2021's bi-modal rule) needs
``dy/dA`` of the text's attention. ``tests/unit/engine/test_clip_text.py`` checks it against
open_clip's own ``encode_text``.

The score (:meth:`TextTower.logits`) is the model's own: CLIP ``exp(logit_scale) * cos(e_img,
e_txt)``; SigLIP the same plus its ``logit_bias`` (the logit of its sigmoid). Zero-shot
probabilities are the softmax of CLIP's scores over the labels and the sigmoid of each SigLIP
score, as each model was trained.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from .relevance import TargetError

MAX_PHRASE_CHARS = 300  # a phrase longer than this: 422 (the tokens must also fit the context)
MAX_LABELS = 64  # zero-shot labels in one request
EMBEDDING_CACHE = 4096  # phrases whose embedding a model keeps


class TextError(TargetError):
    """A phrase that cannot be a text target (empty, too long, not text) or a model without a text
    tower (answered as 422 ``bad_text``)."""

    code = "bad_text"


@dataclass
class TextForward:
    """A text forward: ``embedding`` ``[B, D]`` (unnormalised, as ``encode_text``); ``maps`` per
    layer ``[B, H, T, T]`` softmax maps; ``readout`` ``[B]`` the token the embedding is read from
    (CLIP: the end-of-text token; SigLIP: the last position); ``ids`` ``[B, T]``."""

    embedding: torch.Tensor
    maps: list[torch.Tensor]
    readout: list[int]
    ids: torch.Tensor


def check_phrase(phrase: str) -> str:
    """A phrase as a text target takes it: stripped, not empty, at most :data:`MAX_PHRASE_CHARS`
    characters, no control characters or undecodable bytes (U+FFFD, lone surrogates).

    Raises:
        TextError: otherwise.
    """
    text = phrase.strip()
    if not text:
        raise TextError("the phrase is empty: write text:PHRASE with some words, e.g. text:a dog")
    if len(text) > MAX_PHRASE_CHARS:
        raise TextError(f"the phrase has {len(text)} characters; at most {MAX_PHRASE_CHARS}")
    # U+FFFD: bytes a request could not decode; a lone surrogate: the same bytes in a Python str
    # (os.fsdecode, surrogateescape), which the tokenizer would read as something else.
    if "\ufffd" in text or any(ord(c) < 32 or ord(c) == 127 or 0xD800 <= ord(c) <= 0xDFFF for c in text):
        raise TextError("the phrase holds bytes that are not UTF-8 text or control characters")
    return text


class TextTower:
    """An open_clip model's text encoder, tokenizer and image-text score.

    Args:
        clip: the open_clip model (``CLIP`` or ``CustomTextCLIP`` with open_clip's own
            ``TextTransformer``); only its text parts are used.
        tokenizer: ``open_clip.get_tokenizer(arch)``.
        kind: ``clip`` (softmax over labels) or ``siglip`` (a sigmoid per label, a bias).

    Raises:
        TextError: a text encoder this forward cannot write out (Hugging Face encoders, CoCa's
            class token, a padding mask).
    """

    def __init__(self, clip: nn.Module, tokenizer: Any, kind: str):
        enc: Any = getattr(clip, "text", None) or clip
        if not hasattr(enc, "token_embedding") or not hasattr(enc, "transformer"):
            raise TextError(f"{type(enc).__name__}: only open_clip's own text transformer is supported")
        if getattr(enc, "cls_emb", None) is not None or getattr(enc, "use_pad_mask", False):
            raise TextError("text encoders with a class token or a padding mask are not supported")
        for i, blk in enumerate(enc.transformer.resblocks):
            if not isinstance(getattr(blk, "attn", None), nn.MultiheadAttention) or hasattr(blk, "ln_1_kv"):
                raise TextError(f"text block {i} is not a self-attention block with nn.MultiheadAttention")
        self.clip, self.enc, self.tokenizer, self.kind = clip, enc, tokenizer, kind
        self.pool = getattr(clip, "text_pool_type", None) or getattr(enc, "pool_type", "argmax")
        self.eos_id = getattr(clip, "text_eos_id", None) or getattr(enc, "eos_id", None)
        self.context_length = int(getattr(tokenizer, "context_length", 0) or enc.positional_embedding.shape[0])
        self.logit_scale = float(torch.as_tensor(clip.logit_scale).detach().exp().reshape(-1)[0])
        bias = getattr(clip, "logit_bias", None)
        self.logit_bias = None if bias is None else float(bias.detach().reshape(-1)[0])
        # per (phrase, autocast dtype or None): a Scope in fp32 and one in bf16 may share the tower
        self._cache: OrderedDict[tuple[str, torch.dtype | None], torch.Tensor] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def device(self) -> torch.device:
        return self.enc.token_embedding.weight.device

    def to(self, device) -> TextTower:
        """Move the text encoder to ``device`` (cached embeddings move with the next use)."""
        self.clip.to(device)
        return self

    # -- tokens ------------------------------------------------------------------------------------
    def check(self, phrase: str) -> None:
        """Raise :class:`TextError` for a phrase whose tokens do not fit the context (the tokenizer
        would cut it silently). Plain Python: no torch."""
        encode = getattr(self.tokenizer, "encode", None)
        inner = getattr(self.tokenizer, "tokenizer", None)
        clean = getattr(self.tokenizer, "clean_fn", None)
        if callable(encode):  # open_clip's SimpleTokenizer: 2 special tokens around the words
            n = len(encode(phrase)) + 2
        elif callable(inner) and callable(clean):  # open_clip's HFTokenizer (SigLIP): its own special tokens
            n = len(inner(clean(phrase))["input_ids"])
        else:
            return
        if n > self.context_length:
            most = self.context_length
            raise TextError(f"the phrase {phrase[:40]!r} has {n} tokens; this model reads at most {most}")

    def tokenize(self, phrases: Sequence[str]) -> torch.Tensor:
        """Token ids ``[B, T]`` (``T`` the context length) on the tower's device.

        Raises:
            TextError: a phrase whose tokens do not fit the context.
        """
        for p in phrases:
            self.check(p)
        return self.tokenizer(list(phrases)).to(self.device)

    def special_ids(self) -> set[int]:
        out = {0}
        for name in ("sot_token_id", "eot_token_id", "pad_token_id"):
            v = getattr(self.tokenizer, name, None)
            if isinstance(v, int):
                out.add(v)
        inner = getattr(self.tokenizer, "tokenizer", None)  # open_clip's HFTokenizer: padding, end of text
        out.update(int(i) for i in getattr(inner, "all_special_ids", None) or ())
        if isinstance(self.eos_id, int):
            out.add(self.eos_id)
        return out

    def readout(self, ids: torch.Tensor) -> list[int]:
        """Which token the embedding is read from, per phrase (open_clip's ``text_global_pool``)."""
        B, T = ids.shape  # phrases, context
        if self.pool == "argmax":
            return ids.argmax(-1).tolist()
        if self.pool == "eos" and self.eos_id is not None:
            return (ids == self.eos_id).int().argmax(-1).tolist()
        if self.pool == "first":
            return [0] * B
        return [T - 1] * B  # last

    def words(self, ids: torch.Tensor, readout: int) -> list[tuple[int, str]]:
        """``(position, token text)`` of the phrase's own tokens (no start, end or padding)."""
        special = self.special_ids()
        out = []
        for i, t in enumerate(ids.tolist()):
            if t in special or (self.pool == "argmax" and i >= readout):
                continue
            out.append((i, self.token_text(t)))
        return out

    def token_text(self, token: int) -> str:
        dec = getattr(self.tokenizer, "decoder", None)
        if isinstance(dec, dict) and token in dec:  # SimpleTokenizer: byte-level BPE pieces
            piece = dec[token]
            raw = bytearray(self.tokenizer.byte_decoder[c] for c in piece.replace("</w>", ""))
            return raw.decode("utf-8", errors="replace")
        inner = getattr(self.tokenizer, "tokenizer", None)  # HFTokenizer
        if inner is not None and hasattr(inner, "convert_ids_to_tokens"):
            return str(inner.convert_ids_to_tokens(token))
        return str(token)

    # -- the forward ---------------------------------------------------------------------------------
    def forward(self, ids: torch.Tensor, grad: bool = False) -> TextForward:
        """The text forward, block by block, keeping every softmax map.

        With ``grad`` the token embeddings are a fresh leaf that requires grad, so the maps and
        the embedding are in the autograd graph (the weights stay frozen).
        """
        enc = self.enc
        B, T = ids.shape  # phrases, context
        x = enc.token_embedding(ids) + enc.positional_embedding[:T]  # B, T, D
        if grad:
            x = x.detach().requires_grad_(True)
        mask = getattr(enc, "attn_mask", None)
        if mask is None:
            mask = getattr(self.clip, "attn_mask", None) if enc is self.clip else None
        mask = None if mask is None else mask[:T, :T].to(x.dtype)
        maps = []
        for blk in enc.transformer.resblocks:
            x, p = _block(blk, x, mask)
            maps.append(p)
        x = enc.ln_final(x)
        readout = self.readout(ids)
        pooled = x[torch.arange(B, device=x.device), torch.tensor(readout, device=x.device)]  # B, D
        proj = enc.text_projection
        if proj is not None:
            pooled = proj(pooled) if isinstance(proj, nn.Linear) else pooled @ proj
        return TextForward(pooled, maps, readout, ids)

    def embeddings(self, phrases: Sequence[str]) -> torch.Tensor:
        """Unnormalised text embeddings ``[K, D]`` float32 (no autograd), computed in the
        caller's precision (its autocast on the tower's device) and cached per phrase and
        precision."""
        dev = self.device.type
        amp = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else None
        with self._lock:
            missing = [p for p in dict.fromkeys(phrases) if (p, amp) not in self._cache]
        if missing:
            ids = self.tokenize(missing)
            with torch.inference_mode():
                emb = self.forward(ids).embedding.float()
            with self._lock:
                for p, e in zip(missing, emb):
                    self._cache[(p, amp)] = e
                while len(self._cache) > EMBEDDING_CACHE:
                    self._cache.popitem(last=False)
        with self._lock:
            out = []
            for p in phrases:
                self._cache.move_to_end((p, amp))
                out.append(self._cache[(p, amp)])
        return torch.stack(out)

    def logits(self, image: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        """The model's image-text scores ``[B, K]`` from embeddings ``[B, D]`` and ``[K, D]``."""
        s = self.logit_scale * F.normalize(image.float(), dim=-1) @ F.normalize(text.float(), dim=-1).T
        return s + self.logit_bias if self.logit_bias is not None else s

    def probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        """CLIP: the softmax over the labels; SigLIP: each label's sigmoid (as each was trained)."""
        return torch.sigmoid(logits) if self.kind == "siglip" else logits.softmax(-1)


def _block(blk: Any, x: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """open_clip's ``ResidualAttentionBlock`` written out: ``(output, softmax maps [B, H, T, T])``."""
    attn: nn.MultiheadAttention = blk.attn
    B, T, D = x.shape  # phrases, tokens, width
    H = attn.num_heads
    h = blk.ln_1(x)
    qkv = F.linear(h, attn.in_proj_weight, attn.in_proj_bias)  # B, T, 3D
    q, k, v = qkv.reshape(B, T, 3, H, D // H).permute(2, 0, 3, 1, 4)  # each B, H, T, d
    scores = (q * (D // H) ** -0.5) @ k.transpose(-2, -1)  # B, H, T, T
    if mask is not None:
        scores = scores + mask
    p = scores.softmax(-1)
    o = (p @ v).transpose(1, 2).reshape(B, T, D)
    x = x + blk.ls_1(attn.out_proj(o))
    x = x + blk.ls_2(blk.mlp(blk.ln_2(x)))
    return x, p
