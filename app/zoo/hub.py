"""The Hugging Face hub: fail in seconds, with a useful message, when it cannot be reached."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlparse

HUB_PROBE_TIMEOUT_S = 3.0


def hub_endpoint() -> str:
    """The hub's address as huggingface_hub uses it (``HF_ENDPOINT``, else huggingface.co)."""
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def hub_offline_by_choice() -> bool:
    """Whether the environment puts huggingface_hub in offline mode (``HF_HUB_OFFLINE=1``): cache only."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "on", "yes", "true")


def hub_reachable(timeout: float = HUB_PROBE_TIMEOUT_S) -> bool:
    """Can we open a connection to the Hugging Face hub (or a proxy to it)? Fast, no download."""
    if hub_offline_by_choice():
        return False
    if any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True  # the proxy decides; let the real request find out
    url = urlparse(hub_endpoint())
    host = url.hostname or "huggingface.co"
    try:
        port = url.port or (80 if url.scheme == "http" else 443)
    except ValueError:  # a malformed port: huggingface_hub will fail on it too
        return False
    try:
        socket.create_connection((host, port), timeout=timeout).close()
        return True
    except OSError:
        return False


@contextmanager
def hub_offline(offline: bool) -> Iterator[None]:
    """Put huggingface_hub in offline mode (cache only) for the duration, when asked."""
    if not offline:
        yield
        return
    from huggingface_hub import constants

    before = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = before
