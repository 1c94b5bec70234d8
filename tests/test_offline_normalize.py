"""Forms of real KernelBench problems that the tracer or the candidate's preamble had to be taught:
tensor constants made in ``forward`` (``torch.tensor(c, device=x.device)``), inputs drawn from
``torch.distributions``, and ``narrow`` views whose length is a traced size."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import torch
import torch.fx as fx
from torch import nn

from kfoundry.core.generator import ProblemSummary
from kfoundry.core.problem import load_problem
from kfoundry.plugins.llms.offline.lower import init_source
from kfoundry.plugins.llms.offline.normalize import normalize
from kfoundry.plugins.llms.offline.recognize import recognize

DATA = Path(__file__).resolve().parent / "data" / "kernelbench"
SMALL: dict[str, dict[str, int | float]] = json.loads((DATA / "small_shapes.json").read_text())


class _Constants(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.min(x, torch.tensor(0.75, device=x.device))  # a clamp
        x = torch.maximum(torch.tensor(-0.5), x)  # a clamp, the constant first
        x = x * torch.tensor(1.5, dtype=x.dtype) + torch.tensor(2)  # numbers
        x = torch.where(x > 2.0, x, torch.tensor(0.25, device=x.device))  # a number
        return torch.atan2(x, torch.tensor(0.5, device=x.device))  # full_like of x


def _traced(model: nn.Module) -> fx.GraphModule:
    return normalize(fx.symbolic_trace(model))


def test_tensor_constants_made_in_forward_are_rewritten_and_keep_their_values() -> None:
    gm = _traced(_Constants())
    targets = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    assert torch.tensor not in targets and getattr not in targets
    assert not [n for n in gm.graph.nodes if n.op == "get_attr"]
    assert torch.clamp in targets and torch.full_like in targets
    x = torch.randn(4, 7) * 3
    x[0, 0] = float("nan")
    torch.testing.assert_close(gm(x), _Constants()(x), equal_nan=True)


def test_a_constant_a_method_is_called_on_is_left_as_it_is() -> None:
    class M(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.tensor(3.0).sub(x)

    gm = _traced(M())
    x = torch.randn(5)
    torch.testing.assert_close(gm(x), 3.0 - x)


def test_inputs_from_torch_distributions_are_traced_and_not_imported_by_the_candidate() -> None:
    key = "level1/l1_loss_heavy_tailed.py"
    problem = load_problem(DATA / key, SMALL[key])
    spec = recognize(ProblemSummary(name=key, reference_source=problem.source, shapes=dict(problem.shapes)))
    assert spec.family == "graph"
    preamble = init_source(problem.source, dict(problem.shapes))
    imports = [n for n in ast.walk(ast.parse(preamble)) if isinstance(n, ast.Import | ast.ImportFrom)]
    assert not [n for n in imports if isinstance(n, ast.ImportFrom) and n.module == "torch.distributions"]
    assert any(isinstance(n, ast.Import) and n.names[0].asname == "nn" for n in imports)  # _RefInit's base
    # the sampling still validates its arguments outside recognition
    assert torch.distributions.Distribution._validate_args


def test_narrow_with_a_traced_length_and_a_negative_start_is_lowered() -> None:
    key = "level1/narrow_shifted_difference.py"
    problem = load_problem(DATA / key, SMALL[key])
    spec = recognize(ProblemSummary(name=key, reference_source=problem.source, shapes=dict(problem.shapes)))
    assert spec.family == "graph"
