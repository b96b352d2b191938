"""What can go wrong when a model is asked for or built."""

from __future__ import annotations


def first_line(e: BaseException | str, limit: int = 200) -> str:
    """An error's first line, whole words up to ``limit`` characters (hub errors run to pages)."""
    line = (str(e).strip().splitlines() or [""])[0]
    return line if len(line) <= limit else line[:limit].rsplit(" ", 1)[0] + " …"


class UnknownModelError(KeyError, ValueError):
    """A model id that the server does not offer (or an architecture timm does not know).

    A ``KeyError`` (an unknown name) and a ``ValueError`` (a bad argument: the Python API's
    ``headscope.load("no-such-model")``)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class ModelLoadError(RuntimeError):
    """Weights could not be obtained or read; the message says how to fix it."""


class HubUnreachableError(ModelLoadError):
    """The Hugging Face hub cannot be reached and the weights are not in the local cache."""


class ModelRefusedError(ValueError):
    """A configured model that cannot load while the server runs (a misspelt name, a family
    Headscope cannot capture, a weights file that is not there): found at start-up, answered
    without trying again (sending the request again cannot help)."""


class ModelTooLargeError(ValueError):
    """A catalogue model over the server's size cap (parameters or weights bytes), or without the
    free disk its download needs; refused before anything is downloaded."""

    def __init__(self, message: str, code: str = "model_too_large"):
        super().__init__(message)
        self.code = code
