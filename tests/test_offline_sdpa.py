"""Scaled dot-product attention in the offline generator: the fused schedule lowers it as a scores
product, softmax rows (scale and causal bound applied as they read) and a probabilities-times-V product
(:mod:`kfoundry.plugins.llms.offline.lower_attention`); judged on PoCL by the real evaluator against
torch at small, ragged shapes (query and key lengths, head and value widths all different), causal and
not, with and without ``scale=``, broadcast batch dims and an epilogue; the cooperative schedule's
register-blocked products and lane loops too.

The problems here clean their operands of NaN and infinities first: which outputs torch's attention
makes NaN from a non-finite score or value is an artefact of its kernels' blocking (the CPU one, PoCL's
reference, gives 0 for some all-NaN score rows and NaN for others of other lengths), which no
lowering reproduces; the KernelBench problems' own NaN/inf trial fails on PoCL for that reason, before
this lowering as after (tests/test_offline_breadth.py's slow sweep). A non-finite value of V past the
diagonal is reproduced off CUDA (its column NaN in every row, as torch's CPU kernel while the keys fit one
of its query blocks): tests/test_offline_graph_warp_gemm.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from eval_helpers import fast_config

from kfoundry.core.evaluation import Evaluator
from kfoundry.core.generator import GeneratorUnsupported, ProblemSummary
from kfoundry.core.models import Outcome
from kfoundry.core.problem import Problem, load_problem
from kfoundry.plugins.llms.offline import cookbook_graph
from kfoundry.plugins.llms.offline import lower as lowering
from kfoundry.plugins.llms.offline.generator import OfflineGenerator
from kfoundry.plugins.llms.offline.recipe import Recipe

#: slow tier (about 2 minutes of PoCL evaluations): the default run stays well under 20 minutes on 2 cores
pytestmark = pytest.mark.slow

DATA = Path(__file__).resolve().parent / "data" / "kernelbench"
SMALL: dict[str, dict[str, int]] = json.loads((DATA / "small_shapes.json").read_text())

SRC = """import torch
import torch.nn as nn
import torch.nn.functional as F

B = 2
H = 3
LQ = 13
LK = 9
E = 5
DV = 7


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q, k, v):
        # finite operands (the evaluator's NaN/inf trial; see the module docstring)
        q = torch.where(q == q, q.clamp(-8.0, 8.0), 0.0)
        k = torch.where(k == k, k.clamp(-8.0, 8.0), 0.0)
        v = torch.where(v == v, v.clamp(-8.0, 8.0), 0.0)
        return {expr}


def get_inputs():
    return [torch.randn(B, H, LQ, E), torch.randn({kv}, LK, E), torch.randn({kv}, LK, DV)]


def get_init_inputs():
    return []
"""

#: (name, output expression, k/v leading dims, shape overrides)
CASES = [
    ("plain", "F.scaled_dot_product_attention(q, k, v)", "B, H", {}),
    ("causal", "F.scaled_dot_product_attention(q, k, v, is_causal=True)", "B, H", {}),
    ("causal_long_keys", "F.scaled_dot_product_attention(q, k, v, is_causal=True)", "B, H", {"LK": 21}),
    ("scale", "F.scaled_dot_product_attention(q, k, v, scale=0.3)", "B, H", {}),
    ("causal_scale", "F.scaled_dot_product_attention(q, k, v, None, 0.0, True, scale=1.7)", "B, H", {}),
    ("broadcast_heads", "F.scaled_dot_product_attention(q, k, v, is_causal=True)", "B, 1", {}),
    ("epilogue", "torch.relu(F.scaled_dot_product_attention(q, k, v) * 2.0 - 0.1)", "B, H", {}),
    (
        "causal_epilogue",
        "torch.relu(F.scaled_dot_product_attention(q, k, v, is_causal=True) * 2.0 - 0.1)",
        "B, H",
        {"LQ": 37, "LK": 40},
    ),
    ("wide", "F.scaled_dot_product_attention(q, k, v)", "B, H", {"LQ": 37, "LK": 35, "E": 20, "DV": 19}),
]


def _problem(tmp: Path, expr: str, kv: str, shapes: dict[str, int]) -> Problem:
    path = tmp / "attn.py"
    path.write_text(SRC.format(expr=expr, kv=kv))
    return load_problem(path, dict(shapes))


def _check(problem: Problem, recipe: Recipe) -> None:
    with Evaluator(problem, fast_config(cache=False)) as evaluator:
        record = evaluator.evaluate_many([recipe.candidate()])[0]
    assert record.outcome is Outcome.correct, f"{recipe.name}: {record.message}\n{(record.log or '')[-3000:]}"


@pytest.mark.parametrize(("name", "expr", "kv", "shapes"), CASES, ids=[c[0] for c in CASES])
def test_fused_attention_takes_the_products_and_is_correct(
    name: str, expr: str, kv: str, shapes: dict[str, int], tmp_path: Path
) -> None:
    problem = _problem(tmp_path, expr, kv, shapes)
    recipes = {r.name: r for r in OfflineGenerator().recipes(problem.summary(), "opencl")}
    fused = recipes["graph/fused"]
    # two tiled products and a softmax row kernel, no per-row recomputation of the scores
    assert fused.kernel.count("As[TILE][TILE]") == 2 and "sdpa_softmax" in fused.kernel, name
    assert "sdpa_rows" not in fused.kernel
    _check(problem, fused)
    if name in ("causal", "scale"):  # the unfused schedule keeps the one-pass lowering
        assert (
            "sdpa" in recipes["graph/unfused"].kernel
            and "sdpa_softmax" not in recipes["graph/unfused"].kernel
        )
        _check(problem, recipes["graph/unfused"])


@pytest.mark.parametrize("name", ["causal", "broadcast_heads", "wide"])
def test_cooperative_attention_is_correct(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA schedule's logic on PoCL: register-blocked products (K loaded along its rows), a warp per
    softmax row."""
    _, expr, kv, shapes = next(c for c in CASES if c[0] == name)
    monkeypatch.setattr(lowering, "LANE_MIN", 4)
    problem = _problem(tmp_path, expr, kv, shapes)
    spec = OfflineGenerator().spec(problem.summary())
    recipe = cookbook_graph.recipe(spec, "opencl", "graph/fused_coop", 2)
    recipe.defaults["RB"] = 2
    assert recipe.kernel.count("accv[RB][RB]") == 2 and "kf_lane" in recipe.kernel
    assert "const int bj = ty + 16 * l, bk = tx;" in recipe.kernel  # the scores' B (K) read k-fast
    _check(problem, recipe)


def test_the_kernelbench_attention_recipes_take_the_products() -> None:
    """At the real size (B=32, H=32, L=512, E=1024) the fused recipes are the three-kernel schedule, the
    causal one's probabilities-times-V product bounded at each row tile's diagonal."""
    for key in ("level1/sdpa.py", "level1/sdpa_causal.py"):
        problem = load_problem(DATA / key, {})
        recipes = {r.name: r for r in OfflineGenerator().recipes(problem.summary(), "cuda")}
        for name in ("graph/fused", "graph/fused_coop"):
            kernel = recipes[name].kernel
            assert "sdpa_softmax" in kernel and "sdpa_rows" not in kernel, (key, name)
            assert ("(KF_GRP(1) + 1) *" in kernel) is key.endswith("causal.py"), (key, name)
        assert "_sdpa" in recipes["graph/unfused"].kernel


def test_masks_dropout_and_grouped_heads_are_refused() -> None:
    for extra in ("attn_mask=q[..., :1] > 0", "dropout_p=0.1", "enable_gqa=True"):
        src = SRC.format(expr=f"F.scaled_dot_product_attention(q, k, v, {extra})", kv="B, H")
        with pytest.raises(GeneratorUnsupported, match="mask, dropout or grouped heads"):
            OfflineGenerator().recipes(ProblemSummary(name="attn", reference_source=src), "opencl")
