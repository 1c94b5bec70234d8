"""Test-session set-up: Triton's interpreter mode, before anything imports triton.

torch imports triton by itself (``torch._dynamo``, reached for instance through a device context while
a problem's inputs are made), and triton reads ``TRITON_INTERPRET`` once, when it is imported: a test
that happens to run before the Triton tests would otherwise leave triton in compiled mode, which the
Triton backend then refuses on a machine without a GPU. Where a GPU is present (the H200 machine) the
Triton tests run compiled, so the variable is left alone there.
"""

from __future__ import annotations

import os
import shutil

import pytest

if shutil.which("nvidia-smi") is None:
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="module")
def pocl_runtime() -> None:
    """``kfoundry.runtime``'s backend set to OpenCL (PoCL here) for a module's kernels."""
    from kfoundry.core.plugins import get_plugin
    from kfoundry.runtime import set_backend

    backend = get_plugin("backend", "opencl").build({})
    backend.require_device()
    set_backend(backend)
