"""Static checks and the runtime guard, on sources alone (no kernels run)."""

from __future__ import annotations

import pytest
import torch

from kfoundry.core.evaluation.guard import ForwardGuard
from kfoundry.core.evaluation.static import check_source
from kfoundry.core.models import Candidate

OK = """
import torch
import torch.nn as nn
from kfoundry.runtime import cdiv, load

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.k = load("__kernel void k() {}")

    def forward(self, x):
        y = torch.empty_like(x)
        z = torch.zeros(x.shape[0], dtype=torch.float32)
        self.k.k(grid=(cdiv(x.numel(), 64),), block=(64,))
        return y.view(-1)
"""


def test_clean_candidate_passes() -> None:
    assert check_source(Candidate(source=OK)) == []


@pytest.mark.parametrize(
    ("snippet", "reason"),
    [
        ("import os", "import of os is not allowed"),
        ("import subprocess", "import of subprocess"),
        ("from threading import Thread", "import of threading.Thread"),
        ("import gc", "import of gc"),
        (
            "from torch.utils._python_dispatch import _disable_current_modes",
            "import of torch.utils._python_dispatch",
        ),
        ("x = eval('1')", "use of eval"),
        ("f = open('/etc/passwd')", "use of open"),
        ("t = torch._C._get_tracing_state", "access to ._C"),
        ("import time\ntime.perf_counter = lambda: 0", "access to .perf_counter"),
        ("from . import sibling", "relative import"),
        ("torch.allclose = lambda *a, **k: True", "assignment to torch.allclose"),
        ("torch.Tensor.sum += 0", "assignment to torch.Tensor.sum"),
    ],
)
def test_banned_constructs(snippet: str, reason: str) -> None:
    reasons = check_source(Candidate(source=OK + "\n" + snippet + "\n"))
    assert any(reason in r for r in reasons), reasons


@pytest.mark.parametrize(
    ("forward", "reason"),
    [
        ("return torch.matmul(x, x)", "torch.matmul in forward"),
        ("return F.softmax(x, dim=1)", "F.softmax in forward"),
        ("return x @ x", "'@' in forward"),
        ("return torch.nn.functional.gelu(x)", "torch.nn.functional.gelu in forward"),
    ],
)
def test_torch_compute_in_forward(forward: str, reason: str) -> None:
    source = (
        "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"
        f"class ModelNew(nn.Module):\n    def forward(self, x):\n        {forward}\n"
    )
    assert any(reason in r for r in check_source(Candidate(source=source)))


def test_inheriting_the_reference_is_rejected() -> None:
    source = "import torch.nn as nn\nclass ModelNew(Model):\n    pass\n"
    assert any("inherit" in r for r in check_source(Candidate(source=source)))


def test_syntax_error_and_native_left_to_the_build() -> None:
    assert check_source(Candidate(source="class ModelNew(:\n")) == []
    assert check_source(Candidate(source="__kernel void k() {}", kind="native")) == []
    assert check_source(Candidate(source="   ")) == ["empty source"]


def test_guard_poisons_fresh_memory_and_flags_compute() -> None:
    a = torch.rand(16)
    with torch.no_grad(), ForwardGuard(poison_fresh=True) as guard:
        fresh = torch.empty(16)
        ints = torch.empty(4, dtype=torch.int32)
        view = fresh.view(4, 4).t().contiguous()
    assert torch.isnan(fresh).all() and (ints == -0x5A5A5A5A).all() and view.shape == (4, 4)
    assert guard.forbidden == []
    with torch.no_grad(), ForwardGuard(poison_fresh=False) as guard:
        _ = a + 1
        _ = torch.nn.functional.linear(a[None], torch.ones(2, 16))
        kept = torch.empty(3)
    assert guard.forbidden[0] == "add"
    assert {"mm", "addmm"} & set(guard.forbidden)
    assert kept.shape == (3,)
