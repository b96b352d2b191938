"""In-process variants: bare forward, Headscope's capture, the peers; and the cross-checks."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import torch

from headscope.engine.analysis import attention_tensor
from headscope.engine.model import LoadedModel
from headscope.engine.selection import Selection

from . import peers
from .ceiling import MatmulsOnly
from .common import BenchFailure, Variant

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "static" / "samples"
INPUT = (224, 224)


def sample_pixels(lm: LoadedModel, n: int, device: str | torch.device = "cpu") -> torch.Tensor:
    """``n`` preprocessed 224x224 sample pictures (cycled, nudged so they differ): ``[n, 3, H, W]``."""
    import dataclasses

    from headscope.config import Settings
    from headscope.serving.pictures import Pictures

    pictures = dataclasses.replace(Pictures.for_model(lm, Settings(resize="square")), input_size=INPUT)
    files = sorted(p for p in SAMPLES.iterdir() if p.suffix in (".png", ".jpg")) if SAMPLES.is_dir() else []
    out = []
    for i in range(n):
        if files:
            px = pictures.prepare(files[i % len(files)].read_bytes()).pixels
        else:
            px = torch.randn(3, *INPUT, generator=torch.Generator().manual_seed(i))
        out.append(px + 0.01 * i)
    return torch.stack(out).to(device)


def sample_pictures(n: int) -> list[bytes]:
    """``n`` sample pictures as 224 x 224 PNG files (bytes), distinct (one pixel nudged each): what
    the Python API's rows take, so that the model sees a 224 px input as in the other rows."""
    import io

    import numpy as np
    from PIL import Image

    files = sorted(p for p in SAMPLES.iterdir() if p.suffix in (".png", ".jpg")) if SAMPLES.is_dir() else []
    out = []
    for i in range(n):
        if files:
            a = np.array(Image.open(files[i % len(files)]).convert("RGB").resize(INPUT[::-1], Image.BICUBIC))
        else:
            a = np.random.default_rng(i).integers(0, 256, (*INPUT, 3), dtype=np.uint8)
        a[0, 0, 0] = i % 256
        buf = io.BytesIO()
        Image.fromarray(a).save(buf, "PNG", compress_level=1)
        out.append(buf.getvalue())
    return out


def bf16_status(device: str = "cpu") -> tuple[bool, str]:
    """Whether bf16 autocast is native here (CUDA with bf16; CPU with AVX512-BF16 / AMX)."""
    if device.startswith("cuda"):
        ok = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        return ok, "native (CUDA)" if ok else "not supported by this GPU"
    flags = set()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    native = [f for f in ("amx_bf16", "avx512_bf16") if f in flags]
    return bool(native), ("native (" + ", ".join(native) + ")") if native else "emulated (no AVX512-BF16/AMX)"


class Checks:
    """Shape and value checks; failures collect here and make the run exit non-zero."""

    def __init__(self) -> None:
        self.failures: list[str] = []
        self.notes: list[str] = []
        self.values: dict[str, Any] = {}

    def fail(self, msg: str) -> None:
        self.failures.append(msg)
        print(f"  CHECK FAILED: {msg}")

    def note(self, msg: str) -> None:
        self.notes.append(msg)
        print(f"  note: {msg}")


def _per_image_check(shape_of):
    def check(out, batch: int) -> None:
        if not isinstance(out, (list, tuple)) or len(out) != batch:
            got = len(out) if hasattr(out, "__len__") else "?"
            raise BenchFailure(f"expected {batch} per-image results, got {type(out).__name__} of {got}")
        for t in out:
            want = shape_of()
            if tuple(t.shape) != want:
                raise BenchFailure(f"result of shape {tuple(t.shape)}, expected {want}")
            if t.dtype != torch.float32:
                raise BenchFailure(f"result dtype {t.dtype}, expected float32")
            sums = t.sum(-1)
            if not torch.isfinite(t).all() or (sums - 1).abs().max() > 1e-3:
                raise BenchFailure(f"rows do not sum to 1 (max error {(sums - 1).abs().max().item():.2e})")

    return check


def build_variants(
    lm: LoadedModel, with_peers: bool, checks: Checks, models_dir: Path, device: str = "cpu"
) -> list[Variant]:
    """Everything timed in-process, each returning the same output kind per group.

    Every variant that produces maps delivers them as float32 host tensors, one per image:
    Headscope computes the requested rows where the capture is kept (the forward's device) and
    moves only those; the peers' maps are moved with ``.cpu()`` (a no-op on CPU), since that is
    what an API or an analysis script needs.
    """
    variants = model_variants(lm, device) + headscope_variants(lm, device)
    if with_peers:
        variants += peer_variants(lm, checks, models_dir, device)
    return variants


def _tokens(lm: LoadedModel) -> int:
    """Tokens of a 224 x 224 input: the CLS token and the patches."""
    return 1 + (INPUT[0] // lm.patch_size[0]) * (INPUT[1] // lm.patch_size[1])


def _map_checks(lm: LoadedModel):
    """The checks of the CLS rows ``[L, H, 1, N]`` and of the full maps ``[L, H, N, N]``, per image."""
    L, H, N = lm.num_layers, lm.num_heads, _tokens(lm)
    return _per_image_check(lambda: (L, H, 1, N)), _per_image_check(lambda: (L, H, N, N))


def model_variants(lm: LoadedModel, device: str = "cpu") -> list[Variant]:
    """The model alone: the bare forward (fp32, the reference; bf16 autocast) and the matrix
    products alone (the fp32 ceiling)."""
    dev_type = torch.device(device).type
    model, N = lm.model, _tokens(lm)

    def bare(x):
        with torch.inference_mode():
            return model.forward_features(x)

    def bare_bf16(x):
        with torch.inference_mode(), torch.autocast(dev_type, dtype=torch.bfloat16):
            return model.forward_features(x)

    def check_bare(out, batch):
        if tuple(out.shape) != (batch, N, model.embed_dim) or not torch.isfinite(out).all():
            raise BenchFailure(f"forward output of shape {tuple(out.shape)}")

    mm = MatmulsOnly(model, N)
    _, how = bf16_status(device)
    return [
        Variant("fwd_fp32", "bare forward fp32 (reference)", bare, check_bare, "model"),
        Variant(
            "fwd_matmuls",
            "matrix products alone (fp32 ceiling)",
            mm,
            None,
            "ceiling",
            note=f"{mm.flops_per_image() / 1e9:.1f} GFLOP/img, random inputs",
        ),
        Variant("fwd_bf16", "bare forward bf16 autocast", bare_bf16, check_bare, "model", note=f"bf16 {how}"),
    ]


def headscope_variants(lm: LoadedModel, device: str = "cpu") -> list[Variant]:
    """Headscope's capture (CLS rows, full maps, bf16) with its phases timed, and the Python API."""
    dev_type = torch.device(device).type
    model, cap = lm.model, lm.capture
    all_l, all_h = list(range(lm.num_layers)), list(range(lm.num_heads))
    sel_cls = Selection(all_l, all_h, [0])
    sel_all = Selection(all_l, all_h, None)
    check_cls, check_full = _map_checks(lm)
    # the phases' clocks wait for the device's queue (CUDA runs asynchronously: unsynchronised,
    # forward_hooked would time only the launches and its kernels would land in results)
    sync = torch.cuda.synchronize if dev_type == "cuda" else (lambda: None)

    def headscope(sel, amp=False):
        """What the worker and the service do: hooked forward, results(), attention_tensor().

        A selection of every row is captured as the service does for ``query=all``: with the
        maps materialised by the unfused forward (``needs_every_row``).
        """
        materialise = sel.queries is None

        def fn(x):
            with torch.inference_mode():
                ctx = torch.autocast(dev_type, dtype=torch.bfloat16) if amp else contextlib.nullcontext()
                t0 = time.perf_counter()
                with ctx, cap.capturing(materialise=materialise):
                    model.forward_features(x)
                sync()
                t1 = time.perf_counter()
                atts = cap.results()
                sync()
                t2 = time.perf_counter()
                out = [attention_tensor(a, sel) for a in atts]
                sync()
                t3 = time.perf_counter()
            fn.variant.phases.setdefault("forward_hooked", []).append(t1 - t0)
            fn.variant.phases.setdefault("results", []).append(t2 - t1)
            fn.variant.phases.setdefault("select", []).append(t3 - t2)
            return out

        fn.variant = None  # set below, once the Variant exists
        return fn

    variants = [
        Variant("hs_cls", "Headscope capture, CLS rows (all L,H)", headscope(sel_cls), check_cls, "headscope"),
        Variant("hs_full", "Headscope capture, full maps (all L,H)", headscope(sel_all), check_full, "headscope"),
        Variant(
            "hs_cls_bf16",
            "Headscope capture, CLS rows, bf16 autocast",
            headscope(sel_cls, amp=True),
            check_cls,
            "headscope",
            note="informative (server precision=bf16)",
        ),
        Variant(
            "py_cls",
            "Python API scope.attention(picture), CLS rows",
            python_api(lm, device),
            check_cls,
            "headscope",
            note="224 px PNG bytes in: decode, resize, forward, answer",
        ),
    ]
    for v in variants:
        if hasattr(v.fn, "variant"):
            v.fn.variant = v
    return variants


def peer_variants(lm: LoadedModel, checks: Checks, models_dir: Path, device: str = "cpu") -> list[Variant]:
    """The same maps from the peers: timm's ``AttentionExtract`` and Hugging Face's eager
    ``Dinov2Model``, each skipped with a note where it is not installed."""
    check_cls, check_full = _map_checks(lm)
    sd = peers.timm_state_dict(models_dir)
    variants: list[Variant] = []
    try:
        ext = peers.build_timm_extract(sd)
        ext.model.to(device)
    except ImportError as e:
        checks.note(f"timm AttentionExtract skipped: {e}")
        ext = None
    if ext is not None:

        def timm_cls(x):
            with torch.inference_mode():
                m = peers.timm_maps(ext, x)
                return list(m[:, :, :, 0:1, :].contiguous().cpu().unbind(0))

        def timm_full(x):
            with torch.inference_mode():
                return list(peers.timm_maps(ext, x).cpu().unbind(0))

        variants += [
            Variant("timm_cls", "timm AttentionExtract, CLS rows", timm_cls, check_cls, "peer"),
            Variant("timm_full", "timm AttentionExtract, full maps", timm_full, check_full, "peer"),
        ]
    try:
        hf = peers.build_hf(sd).to(device)
    except ImportError as e:
        checks.note(f"Hugging Face transformers peer skipped (not installed: {e}); pip install transformers")
        hf = None
    if hf is not None:

        def hf_cls(x):
            with torch.inference_mode():
                m = peers.hf_maps(hf, x)
                return list(m[:, :, :, 0:1, :].contiguous().cpu().unbind(0))

        def hf_full(x):
            with torch.inference_mode():
                return list(peers.hf_maps(hf, x).cpu().unbind(0))

        variants += [
            Variant("hf_cls", "HF Dinov2Model eager, CLS rows", hf_cls, check_cls, "peer"),
            Variant("hf_full", "HF Dinov2Model eager, full maps", hf_full, check_full, "peer"),
        ]
    return variants


def python_api(lm: LoadedModel, device: str):
    """``scope.attention(picture, query="cls")`` of the Python API on the same model: one picture
    at batch 1, a list of B pictures (one batched forward) above; the pictures are PNG bytes of
    224 x 224 (the timed call decodes and prepares them, as a user's call does)."""
    from headscope.config import Settings
    from headscope.python.scope import Scope

    scope = Scope(lm, Settings(), precision="fp32")  # the API's default on every device, as hs_cls
    pictures: dict[int, list[bytes]] = {}

    def fn(x):
        B = x.shape[0]
        if B not in pictures:
            pictures[B] = sample_pictures(B)
            scope.batch_size = max(scope.batch_size, B)
        out = scope.attention(pictures[B] if B > 1 else pictures[B][0], query="cls")
        return [a.maps for a in (out if isinstance(out, list) else [out])]

    return fn


def cross_check(variants: list[Variant], x: torch.Tensor, checks: Checks) -> list[Variant]:
    """Run every variant once on ``x``: shapes, and the same maps from Headscope and the peers.

    Headscope vs timm (same model, same position table): must agree within 1e-4. Headscope vs
    HF: within 1e-4 expected; a larger difference is reported (HF resamples the position table
    its own way), and only a gross one (> 1e-2, a broken weight mapping) fails.
    """
    by_key = {v.key: v for v in variants}
    outs = {}
    keep = []
    B = x.shape[0]
    for v in variants:
        try:
            out = v.fn(x)
            if v.check is not None:
                v.check(out, B)
            outs[v.key] = out
            keep.append(v)
        except BenchFailure as e:
            checks.fail(f"{v.key}: {e}")
        except Exception as e:
            if "bf16" in v.key:  # "where supported"
                checks.note(f"{v.label} skipped: {type(e).__name__}: {str(e)[:120]}")
            else:
                checks.fail(f"{v.key}: {type(e).__name__}: {e}")
    if "hs_full" not in outs or "hs_cls" not in outs:
        return keep
    ref = torch.stack(outs["hs_full"])  # B, L, H, N, N
    cls = torch.stack(outs["hs_cls"])
    d = (cls - ref[:, :, :, 0:1]).abs().max().item()
    checks.values["hs_cls_vs_hs_full"] = d
    if d > 1e-5:
        checks.fail(f"Headscope CLS rows differ from row 0 of its full maps by {d:.2e}")
    if "hs_cls_bf16" in outs:
        checks.values["hs_cls_bf16_vs_fp32"] = (torch.stack(outs["hs_cls_bf16"]) - cls).abs().max().item()
    for peer, tol, hard in (("timm", 1e-4, 1e-4), ("hf", 1e-4, 1e-2)):
        for kind, mine in (("full", ref), ("cls", cls)):
            key = f"{peer}_{kind}"
            if key not in outs:
                continue
            d = (torch.stack(outs[key]) - mine).abs().max().item()
            checks.values[f"{key}_vs_headscope"] = d
            if d > hard:
                checks.fail(f"{by_key[key].label}: maps differ from Headscope's by {d:.2e} (> {hard:g})")
            elif d > tol:
                checks.note(
                    f"{by_key[key].label}: max |difference| to Headscope {d:.2e} (> {tol:g}; "
                    f"position-table resampling differs)"
                )
    del outs
    return keep
