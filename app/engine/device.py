"""Device and precision choices, kept apart so they can be tested without a GPU.

Precision. Headscope computes in fp32 unless asked otherwise (``precision`` ``fp32``, the
default on every device): an attention microscope's numbers are its product. fp32 means fp32:
:func:`exact_fp32` turns TF32 off in CUDA matmuls and cuDNN convolutions for the duration of
Headscope's own calls and gives the caller's flags back afterwards (cuDNN allows TF32 in
convolutions by default, which made the saliency decoder's forward and backward, hence every
gradient relevance map, differ from the CPU's by a few percent of the map's maximum).
``bf16`` and ``fp16`` are autocast, a choice; ``auto`` is bf16 on CUDA (fp16 without bf16
support) and fp32 elsewhere. :func:`precision_name` is what every answer's metadata says.

Copies to the host. :func:`to_host` is how a result leaves the device: on CUDA without blocking
into pinned memory, with a CUDA event the calling thread (an answer thread of the server) waits
on, so the thread that queues forwards never waits for a copy.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import cast

import torch

PRECISIONS = ("fp32", "bf16", "fp16", "auto")
DEFAULT_PRECISION = "fp32"


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

    ``fp32`` (the default everywhere) is plain fp32; ``bf16`` and ``fp16`` autocast; ``auto``
    means bf16 on CUDA when supported (fp16 otherwise) and fp32 on CPU and MPS.

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


def autocast(device_type: str, dtype: torch.dtype | None) -> contextlib.AbstractContextManager[object]:
    """An autocast context for ``dtype``; for fp32 (None), autocast turned off on the device, so a
    caller's own ``torch.autocast`` block does not make an fp32 computation bf16."""
    if dtype is None:
        try:
            return torch.autocast(device_type=device_type, enabled=False)
        except RuntimeError:  # a device type this torch has no autocast for: nothing to turn off
            return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, dtype=dtype)


def precision_name(dtype: torch.dtype | None) -> str:
    """What an answer's ``precision`` says for an autocast dtype: ``fp32``, ``bf16`` or ``fp16``."""
    if dtype is None or dtype == torch.float32:
        return "fp32"
    if dtype == torch.bfloat16:
        return "bf16"
    if dtype == torch.float16:
        return "fp16"
    raise ValueError(f"no precision name for {dtype}")


# torch >= 2.9 sets reduced-precision fp32 per backend and operator (``fp32_precision``: ``ieee``,
# ``tf32``, ``bf16``, ``none`` = inherit). Once a user has set one of those, the older getters
# (``allow_tf32``, ``get_float32_matmul_precision``) raise, so where the new API exists it is the
# only one read or written. Only these operators are touched, and only when not already exact:
# a value written and set back still counts, for torch, as set by the user (a later
# ``torch.backends.fp32_precision = ...`` no longer reaches it), so untouched is best.
_CUDA_OPS = ("cuda.matmul", "cudnn.conv")
_CPU_OPS = ("mkldnn.matmul", "mkldnn.conv")
_EXACT = ("ieee", "none")


def _new_api() -> bool:
    return hasattr(torch.backends, "fp32_precision")


def _op(name: str) -> object:
    obj: object = torch.backends
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def _ops() -> tuple[str, ...]:
    # cuDNN's and cuBLAS's settings are left alone where no CUDA device computes
    return (_CUDA_OPS if torch.cuda.is_available() else ()) + _CPU_OPS


# per-backend: (operator, its fp32_precision) pairs; older torch: (matmul TF32, cuDNN TF32, precision)
Flags = tuple[tuple[str, str], ...] | tuple[bool, bool, str]


def _new_flags() -> tuple[tuple[str, str], ...]:
    return tuple((name, _op(name).fp32_precision) for name in _ops())  # type: ignore[attr-defined]


def _legacy_flags() -> tuple[bool, bool, str]:
    return (
        bool(torch.backends.cuda.matmul.allow_tf32),
        bool(torch.backends.cudnn.allow_tf32),
        torch.get_float32_matmul_precision(),
    )


def tf32_flags() -> Flags:
    """The process's reduced-precision fp32 settings, as a value to compare and give back.

    On torch with per-backend ``fp32_precision``: ``(("cuda.matmul", "tf32"), ...)`` for the
    operators Headscope computes with (CUDA's only where CUDA is available). On older torch: CUDA
    matmuls' TF32, cuDNN convolutions' TF32, the float32 matmul precision.
    """
    return _new_flags() if _new_api() else _legacy_flags()


def reduced_fp32() -> list[str]:
    """The settings under which fp32 is not computed exactly now (TF32, bf16 matmuls): empty
    inside :func:`exact_fp32`."""
    if _new_api():
        return [f"{name}={value}" for name, value in _new_flags() if value not in _EXACT]
    matmul, cudnn, precision = _legacy_flags()
    named = (("cuda.matmul", matmul), ("cudnn", cudnn), ("matmul_precision", precision != "highest"))
    return [name for name, reduced in named if reduced]


def _exact_flags() -> Flags:
    if _new_api():
        return tuple((name, value if value in _EXACT else "ieee") for name, value in _new_flags())
    return (False, False, "highest")


def _set_tf32_flags(flags: Flags) -> None:
    if _new_api():
        pairs = cast(tuple[tuple[str, str], ...], flags)
        for (name, value), (_, now) in zip(pairs, _new_flags()):
            if value != now:  # only what differs: see _CUDA_OPS
                _op(name).fp32_precision = value  # type: ignore[attr-defined]
        return
    matmul, cudnn, precision = flags
    # The matmul precision and matmul.allow_tf32 are one setting seen twice: the precision
    # first, then the flag (restoring ("high", False) must leave the flag False).
    torch.set_float32_matmul_precision(str(precision))
    torch.backends.cuda.matmul.allow_tf32 = bool(matmul)
    torch.backends.cudnn.allow_tf32 = bool(cudnn)


# The settings are the process's, so the calls running at once share one exact section: the
# first in saves the caller's settings, the last out gives them back. Each call saving and giving
# back its own let one that ended first put the caller's bf16 back under another still computing.
# Every call coming in makes them exact (the caller's code may have changed them meanwhile; the
# first such change is what is given back when there was none to give back yet).
_section = threading.Lock()
_inside = 0  # calls inside the section now
_given_back: Flags | None = None  # the caller's settings, set back when the last call leaves


@contextlib.contextmanager
def exact_fp32() -> Iterator[None]:
    """fp32 means fp32 while Headscope computes: no TF32 in CUDA matmuls or cuDNN convolutions,
    no bf16 in oneDNN's (the CPU's) fp32 matmuls and convolutions; the caller's settings are
    set back afterwards.

    The settings are the process's (torch has no per-thread one): calls from several threads at
    once share one exact section (the caller's settings come back when the last one ends), and a
    user thread running matmuls meanwhile runs them exactly too. Nesting is fine. Under bf16/fp16
    autocast they are exact too: the ops autocast leaves in fp32 stay exact.
    """
    global _inside, _given_back
    with _section:
        if _inside == 0:
            _given_back = None
        now, exact = tf32_flags(), _exact_flags()
        if now != exact:  # already exact: nothing written
            if _given_back is None:
                _given_back = now
            _set_tf32_flags(exact)
        _inside += 1
    try:
        yield
    finally:
        with _section:
            _inside -= 1
            if _inside == 0 and _given_back is not None:
                _set_tf32_flags(_given_back)
                _given_back = None


def exact_fp32_process() -> None:
    """Exact fp32 for the rest of the process: for a process Headscope owns (the server), where
    several threads compute at once and the settings, being the process's, must not flicker."""
    _set_tf32_flags(_exact_flags())


def exact_computing(device_type: str) -> contextlib.ExitStack:
    """Around every Headscope computation: :func:`exact_fp32`, and a caller's own
    ``torch.autocast`` turned off on ``device_type`` and on the CPU (where host-side products run),
    so fp32 is fp32 wherever the call is made from. The engine's entry points autocast to a
    bf16/fp16 precision asked for themselves, inside this."""
    stack = contextlib.ExitStack()
    stack.enter_context(exact_fp32())
    for dev in dict.fromkeys((device_type, "cpu")):
        stack.enter_context(autocast(dev, None))
    return stack


def where_float64(t: torch.Tensor) -> torch.Tensor:
    """``t`` where float64 exists: MPS has none (``.double()`` raises there), so a tensor on it is
    brought to the host; elsewhere ``t`` itself."""
    return t.cpu() if t.device.type == "mps" else t


def is_oom(exc: BaseException) -> bool:
    """True for CUDA (and MPS) out-of-memory errors."""
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def to_host(t: torch.Tensor) -> torch.Tensor:
    """``t`` in host memory, waited for by the calling thread only.

    On CUDA the copy is issued without blocking into pinned (page-locked) memory on the current
    stream, after the work that computes ``t``, and the calling thread waits for a CUDA event
    recorded after the copy: the server's answer threads wait for their own copies while the
    worker thread goes on queueing forwards. Elsewhere this is ``t.cpu()`` (no copy on the CPU).
    """
    host, wait = to_host_later(t)
    wait()
    return host


def to_host_later(t: torch.Tensor) -> tuple[torch.Tensor, Callable[[], None]]:
    """``t``'s copy in host memory, and the wait for it: :func:`to_host` without the waiting.

    On CUDA the host tensor is written by the device after the work queued before it; call the
    wait (any thread may) before reading it. Elsewhere the copy is made at once and the wait does
    nothing.
    """
    if t.device.type != "cuda":
        return t.cpu(), _ready
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    with torch.cuda.device(t.device):
        host.copy_(t, non_blocking=True)
        # blocking: the waiting thread sleeps (cudaEventBlockingSync); a default event's wait spins
        # a core, one per answer thread waiting behind the next forward
        done = torch.cuda.Event(blocking=True)
        done.record(torch.cuda.current_stream(t.device))
    return host, done.synchronize


def _ready() -> None:
    """A wait with nothing to wait for."""


def release_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
    elif device.type == "mps":
        torch.mps.empty_cache()
