"""Errors meant for people: each renders as one line naming what went wrong and where."""

from __future__ import annotations


class KfError(Exception):
    """A user-facing error: the CLI prints its message on one line and exits with status 2."""

    exit_code = 2


class ConfigError(KfError):
    """A run configuration is invalid (bad key, wrong type, unknown plugin)."""


class PluginError(KfError):
    """A plugin could not be found, loaded or registered."""


class ProblemError(KfError):
    """A problem file is malformed or cannot be loaded."""


class CandidateError(KfError):
    """A candidate file is malformed or cannot be loaded."""


class BackendUnavailable(KfError):
    """A backend cannot do what was asked on this machine (for example: no device to run on)."""


class StoreError(KfError):
    """The store cannot be opened, locked, read or written (one line naming the path and the cause)."""
