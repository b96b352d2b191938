"""Device and precision choices, kept apart so they can be tested without a GPU."""

from __future__ import annotations

import contextlib

import torch


def resolve_device(spec: str = "auto") -> torch.device:
    """``auto`` picks CUDA, then Apple MPS, then CPU; explicit choices are checked.

    Args:
        spec: ``auto``, ``cpu``, ``cuda``, ``cuda:N`` or ``mps``.
    """
    spec = (spec or "auto").strip().lower()
    if spec == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        dev = torch.device(spec)
    except RuntimeError:
        raise ValueError(f"device {spec!r}: use auto, cpu, cuda, cuda:N or mps") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {spec!r} asked for, but CUDA is not available here")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"device {spec!r}: only {torch.cuda.device_count()} CUDA device(s)")
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError("device 'mps' asked for, but MPS is not available here")
    elif dev.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"device {spec!r}: use auto, cpu, cuda, cuda:N or mps")
    return dev


def autocast_dtype(device_type: str, precision: str = "auto", bf16_supported: bool | None = None) -> torch.dtype | None:
    """The autocast dtype for a device, or None for plain fp32.

    ``auto`` means bf16 on CUDA when supported (fp16 otherwise) and fp32 on CPU and MPS, where
    fp32 is the exact default.

    Args:
        device_type: ``cpu``, ``cuda`` or ``mps``.
        precision: ``auto``, ``fp32``, ``fp16`` or ``bf16``.
        bf16_supported: override detection (tests); None asks torch.
    """
    if precision == "fp32":
        return None
    if precision == "bf16":
        return torch.bfloat16
    if precision == "fp16":
        return torch.float16
    if precision != "auto":
        raise ValueError(f"precision {precision!r}: use auto, fp32, fp16 or bf16")
    if device_type != "cuda":
        return None
    if bf16_supported is None:
        bf16_supported = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return torch.bfloat16 if bf16_supported else torch.float16


def autocast(device_type: str, dtype: torch.dtype | None):
    """An autocast context for ``dtype``, or a no-op for fp32."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, dtype=dtype)


def is_oom(exc: BaseException) -> bool:
    """True for CUDA (and MPS) out-of-memory errors."""
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def release_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
    elif device.type == "mps":
        torch.mps.empty_cache()
