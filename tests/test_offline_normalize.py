"""Forms of real KernelBench problems that the tracer or the candidate's preamble had to be taught:
tensor constants made in ``forward`` (``torch.tensor(c, device=x.device)``), inputs drawn from
``torch.distributions``, and ``narrow`` views whose length is a traced size."""

from __future__ import annotations

import ast
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn
from torch.fx.passes.shape_prop import ShapeProp

from kfoundry.core.generator import GeneratorUnsupported, ProblemSummary
from kfoundry.core.problem import load_problem
from kfoundry.plugins.llms.offline.lower import init_source
from kfoundry.plugins.llms.offline.normalize import normalize, with_shapes
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


def test_a_constant_a_method_is_called_on_becomes_full_like() -> None:
    class M(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.tensor(3.0).sub(x)

    gm = _traced(M())
    x = torch.randn(5)
    torch.testing.assert_close(gm(x), 3.0 - x)
    assert torch.full_like in {n.target for n in gm.graph.nodes}


def test_a_tensor_constant_of_several_elements_is_refused_in_one_line() -> None:
    class M(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x @ torch.eye(5)

    with pytest.raises(GeneratorUnsupported, match="tensor constant made in forward"):
        _traced(M())


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


_SPECIAL = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 0.0, 0.2, -0.4, 2.5, -3.5, 0.75])

#: (forward over x of shape (2, 4, 5, 10), holding the special values in every row) per rewritten form
_FORMS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "in-place methods, later reads": lambda x: _inplace(x),
    "sign trunc frac": lambda x: torch.sign(x) + torch.trunc(x) * 2 + x.frac(),
    "shrinks threshold celu": lambda x: (
        F.hardshrink(x, 0.3)
        + F.softshrink(x, 0.3)
        + F.tanhshrink(x)
        + F.threshold(x, 0.1, -1.0)
        + F.celu(x, 0.7)
    ),
    "clamp bounds and aliases": lambda x: (
        torch.clamp_min(x, -1.0) + x.clamp_max(1.0) + torch.clip(x, -2, 2) + torch.special.expit(x)
    ),
    "masked_fill stack": lambda x: torch.stack([x.masked_fill(x > 1.0, -2.0), x], dim=-1),
    "bool ops": lambda x: torch.where((x > 0) & (x < 1), x, -x) + torch.where(~(x > 0) | (x < -1), 1.0, 0.0),
    "nan_to_num logit lerp": lambda x: (
        torch.nan_to_num(torch.logit(torch.sigmoid(x), 1e-6), posinf=9.0) + torch.lerp(x, x * x, 0.25)
    ),
    "glu diff outer": lambda x: (
        F.glu(x, dim=1).diff(dim=-1).sum(-1, keepdim=True) + torch.outer(x[0, 0, 0], x[1, 1, 1]).sum()
    ),
    "chunk unbind picks": lambda x: torch.chunk(x, 2, dim=1)[0] + x.unbind(1)[3].unsqueeze(1),
    "movedim type_as dtype": lambda x: (
        torch.movedim(x, 1, -1).type_as(x) * (x.movedim(1, -1) > 0).to(x.dtype)
    ),
    "prelu": lambda x: F.prelu(x, torch.nan_to_num(x[0, :, 0, 0]).clamp(-1, 1) * 0.1),  # a finite weight
}


def _inplace(x: torch.Tensor) -> torch.Tensor:
    y = x * 1.5
    y.mul_(2.0).add_(1.0)
    z = y.clamp_min_(-3.0)
    return torch.relu_(y * 0.5) + z + y


class _Wrap(nn.Module):
    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)


@pytest.mark.parametrize("name", sorted(_FORMS))
def test_rewritten_forms_keep_values_nan_and_infinities_included(name: str) -> None:
    fn = _FORMS[name]
    x = torch.randn(2, 4, 5, 10) * 2
    x[..., :] = torch.where(torch.rand(2, 4, 5, 10) < 0.5, x, _SPECIAL)
    gm = fx.symbolic_trace(_Wrap(fn))  # the lambda is traced through the module's forward
    gm = normalize(gm)
    ShapeProp(gm).propagate(x.clone())
    while with_shapes(gm):
        ShapeProp(gm).propagate(x.clone())
    torch.testing.assert_close(gm(x.clone()), fn(x.clone()), equal_nan=True)
    left = {str(getattr(n.target, "__name__", n.target)) for n in gm.graph.nodes if n.op != "placeholder"}
    assert not left & _REWRITTEN and not [t for t in left if t.endswith("_") and not t.startswith("_")], left


_REWRITTEN = {
    *("sign", "trunc", "frac", "hardshrink", "softshrink", "tanhshrink", "threshold", "_threshold", "celu"),
    *("clamp_min", "clamp_max", "clip", "special_expit", "masked_fill", "stack", "and_", "or_", "invert"),
    *(
        "nan_to_num",
        "logit",
        "lerp",
        "glu",
        "diff",
        "outer",
        "chunk",
        "unbind",
        "movedim",
        "type_as",
        "prelu",
    ),
}
