"""The errors of a call to a language model, shared by the providers and the ensemble."""

from __future__ import annotations

from kfoundry.core.errors import KfError

__all__ = ["CallRefused", "LLMError", "ModelUnreachable"]


class LLMError(KfError):
    """A provider failure that retrying cannot fix (bad key, unknown model, refused request)."""


class ModelUnreachable(LLMError):
    """No answer from the model's server: nothing listens there, or every recent call failed.

    The message names the member, the provider, the URL and the last error; the loop marks the run
    failed (``kf-run resume`` continues it once the server answers).
    """


class CallRefused(Exception):
    """The server refused this one request (400, 413, 422): not retried, not fatal to the run."""
