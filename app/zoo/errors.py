"""What can go wrong when a model is asked for or built."""

from __future__ import annotations


class UnknownModelError(KeyError):
    """A model id that the server does not offer (or an architecture timm does not know)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class ModelLoadError(RuntimeError):
    """Weights could not be obtained or read; the message says how to fix it."""


class HubUnreachableError(ModelLoadError):
    """The Hugging Face hub cannot be reached and the weights are not in the local cache."""
