"""The offline generator: fx recognition, cookbook kernels correct on PoCL, CUDA kernels compile."""

from __future__ import annotations

import shutil
import subprocess
import textwrap
import types
from pathlib import Path

import pytest
import torch

from kfoundry.core.descriptors import opencl_descriptors
from kfoundry.core.generator import Attempt, GenerationRequest, GeneratorUnsupported, ProblemSummary
from kfoundry.core.models import DeviceProfile, EvalRecord, Outcome
from kfoundry.plugins.llms.offline.generator import OfflineGenerator, valid
from kfoundry.plugins.llms.offline.recognize import recognize

HEADER = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"

PROBLEMS = {
    "matmul": """
        M, K, N = 24, 20, 16
        class Model(nn.Module):
            def forward(self, a, b):
                return torch.matmul(a, b)
        def get_inputs(): return [torch.rand(M, K), torch.rand(K, N)]
        def get_init_inputs(): return []
    """,
    "linear": """
        class Model(nn.Module):
            def __init__(self, i, o):
                super().__init__()
                self.fc = nn.Linear(i, o)
            def forward(self, x):
                return torch.relu(self.fc(x)) * 0.5
        def get_inputs(): return [torch.rand(8, 12)]
        def get_init_inputs(): return [12, 16]
    """,
    "softmax": """
        class Model(nn.Module):
            def forward(self, x):
                return torch.softmax(x, dim=1)
        def get_inputs(): return [torch.rand(6, 64)]
        def get_init_inputs(): return []
    """,
    "log_softmax": """
        class Model(nn.Module):
            def forward(self, x):
                return F.log_softmax(x, dim=-1)
        def get_inputs(): return [torch.rand(5, 40)]
        def get_init_inputs(): return []
    """,
    "layer_norm": """
        class Model(nn.Module):
            def __init__(self, shape):
                super().__init__()
                self.ln = nn.LayerNorm(shape)
            def forward(self, x):
                return self.ln(x)
        def get_inputs(): return [torch.rand(4, 4, 8)]
        def get_init_inputs(): return [(4, 8)]
    """,
    "rms_norm": """
        class Model(nn.Module):
            def __init__(self, eps=1e-5):
                super().__init__()
                self.eps = eps
            def forward(self, x):
                return x / torch.sqrt(torch.mean(x ** 2, dim=1, keepdim=True) + self.eps)
        def get_inputs(): return [torch.rand(2, 8, 4, 4)]
        def get_init_inputs(): return []
    """,
    "reduce": """
        class Model(nn.Module):
            def forward(self, x):
                return torch.amax(x, dim=1)
        def get_inputs(): return [torch.rand(3, 10, 7)]
        def get_init_inputs(): return []
    """,
    "elementwise": """
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.act = nn.LeakyReLU(0.2)
            def forward(self, a, b):
                return F.gelu(self.act(a * 2.0 - b)) + torch.sigmoid(b).clamp(max=0.7)
        def get_inputs(): return [torch.rand(8, 64), torch.rand(8, 64)]
        def get_init_inputs(): return []
    """,
    "gelu_chain": """
        class Model(nn.Module):
            def forward(self, a, b):
                return F.gelu(a * 8.0 - 4.0) * torch.tanh(b) + torch.exp(-a)
        def get_inputs(): return [torch.rand(4, 64), torch.rand(4, 64)]
        def get_init_inputs(): return []
    """,
    "depthwise_conv2d": """
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = nn.Conv2d(4, 4, 3, stride=2, padding=1, groups=4, bias=True)
            def forward(self, x):
                return self.conv(x)
        def get_inputs(): return [torch.rand(2, 4, 9, 11)]
        def get_init_inputs(): return []
    """,
    "rotary": """
        class Model(nn.Module):
            def forward(self, x, cos, sin):
                half = x.shape[-1] // 2
                x1, x2 = x[..., :half], x[..., half:]
                c, s = cos[None, :, None, :], sin[None, :, None, :]
                return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)
        def get_inputs(): return [torch.rand(2, 6, 3, 8), torch.rand(6, 4), torch.rand(6, 4)]
        def get_init_inputs(): return []
    """,
}

FAMILY = {"linear": "matmul", "gelu_chain": "elementwise"}


def summary(name: str) -> ProblemSummary:
    return ProblemSummary(name=name, reference_source=HEADER + textwrap.dedent(PROBLEMS[name]))


def reference(name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    exec(HEADER + textwrap.dedent(PROBLEMS[name]), module.__dict__)
    return module


@pytest.mark.parametrize("name", sorted(PROBLEMS))
def test_recognises_the_family(name: str) -> None:
    assert recognize(summary(name)).family == FAMILY.get(name, name)


def test_details_of_recognition() -> None:
    mm = recognize(summary("matmul"))
    assert (mm.M, mm.N, mm.K, mm.linear, mm.expr) == (24, 16, 20, False, None)
    lin = recognize(summary("linear"))
    assert lin.linear and lin.bias and lin.modules == ["nn.Linear(init_inputs[0], init_inputs[1], bias=True)"]
    assert "< 0.0f ? 0.0f :" in lin.expr("opencl") and "fmax" not in lin.expr("cuda")  # relu keeps NaN
    rms = recognize(summary("rms_norm"))
    assert (rms.outer, rms.R, rms.inner, rms.eps) == (2, 8, 16, 1e-5)
    red = recognize(summary("reduce"))
    assert (red.outer, red.R, red.inner, red.reduce_op) == (3, 10, 7, "max")


def test_unknown_problem_is_refused_clearly() -> None:
    src = HEADER + textwrap.dedent("""
        class Model(nn.Module):
            def forward(self, x):
                return torch.sort(x, dim=0)[0]
        def get_inputs(): return [torch.rand(8)]
        def get_init_inputs(): return []
    """)
    with pytest.raises(GeneratorUnsupported, match="not a known operation family.*LLM"):
        recognize(ProblemSummary(name="sort", reference_source=src))


def _run(source: str, params: dict, ref: types.ModuleType) -> torch.Tensor:
    from kfoundry.runtime import synchronize

    namespace: dict = {"PARAMS": params, "__name__": "candidate"}
    exec(compile(source, "candidate", "exec"), namespace)
    torch.manual_seed(0)
    model = namespace["ModelNew"](*ref.get_init_inputs())
    out = model(*ref.inputs)
    synchronize()
    return out


@pytest.mark.parametrize("name", sorted(PROBLEMS))
def test_every_opencl_recipe_is_correct_on_pocl(name: str) -> None:
    """Each recipe, at its defaults and at a random valid setting, matches the reference on PoCL."""
    ref = reference(name)
    torch.manual_seed(0)
    model = ref.Model(*ref.get_init_inputs())
    ref.inputs = ref.get_inputs()
    expected = model(*ref.inputs)
    gen = OfflineGenerator()
    recipes = gen.recipes(summary(name), "opencl")
    assert len(recipes) >= 2
    rng = __import__("random").Random(name)
    for recipe in recipes:
        for params in (recipe.defaults, gen._random_params(recipe, rng, _request(name))):
            out = _run(recipe.render(), dict(params), ref)
            assert out.shape == expected.shape
            torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5, msg=f"{recipe.name} {params}")


def _request(name: str, **kw) -> GenerationRequest:
    device = DeviceProfile(backend="opencl", name="cpu", max_work_group_size=4096)
    return GenerationRequest(problem=summary(name), language="opencl", device=device, **kw)


def test_activations_are_branch_free_so_chains_run_in_vector_math() -> None:
    gen = OfflineGenerator()
    for name in ("gelu_chain", "elementwise"):
        assert "elementwise/vector_math" in [r.name for r in gen.recipes(summary(name), "opencl")]
    assert "fmax" not in recognize(summary("elementwise")).expr("opencl")  # NaN-keeping selects, not fmax


def test_recipes_span_the_descriptor_space() -> None:
    gen = OfflineGenerator()
    ex = opencl_descriptors()
    cells = {gen.cell(r, ex) for r in gen.recipes(summary("matmul"), "opencl")}
    assert len(cells) >= 5
    assert {c[0] for c in cells} == {0, 1, 2, 3}


def test_moves_follow_the_request() -> None:
    gen = OfflineGenerator()
    seeds = gen.seeds(_request("matmul", n=8))
    assert [p.candidate.meta["rank"] for p in seeds] == sorted(p.candidate.meta["rank"] for p in seeds)
    naive = seeds[0].candidate
    ok = EvalRecord(
        candidate_hash="h", eval_key="k", problem="p", backend="opencl", device="d", outcome=Outcome.correct
    )
    parent = Attempt(candidate=naive, record=ok, cell=(0, 0, 0))
    aimed = gen.propose(_request("matmul", mode="improve", parent=parent, target_cell=(2, 3, 1), n=3, seed=1))
    assert any(p.candidate.label == "matmul/local_tiles" for p in aimed)
    assert len({p.candidate.content_hash for p in aimed}) == 3
    for p in aimed:
        space = p.candidate.space
        assert valid(p.candidate.params, space.restrictions) and set(p.candidate.params) == set(space.params)
    broken = naive.with_params({"BLOCK_X": 32, "BLOCK_Y": 16})
    bad = EvalRecord(
        candidate_hash="h",
        eval_key="k",
        problem="p",
        backend="opencl",
        device="d",
        outcome=Outcome.runtime_error,
    )
    fixed = gen.propose(_request("matmul", mode="repair", parent=Attempt(candidate=broken, record=bad), n=1))[
        0
    ]
    assert fixed.candidate.params == naive.params and "repair" in fixed.rationale


def test_the_generator_is_a_plugin(kf_plugin_manager) -> None:
    gen = kf_plugin_manager.get("llm", "offline").build({"step_probability": 0.5})
    assert isinstance(gen, OfflineGenerator) and gen.opts.step_probability == 0.5


NVCC = shutil.which("nvcc")


@pytest.mark.slow
@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
@pytest.mark.parametrize(
    "name",
    ["matmul", "linear", "softmax", "layer_norm", "rms_norm", "elementwise", "depthwise_conv2d", "rotary"],
)
def test_cuda_recipes_compile_for_sm90(name: str, tmp_path: Path) -> None:
    for recipe in OfflineGenerator().recipes(summary(name), "cuda"):
        src = tmp_path / "k.cu"
        src.write_text(recipe.kernel)
        defines = [f"-D{k}={v}" for k, v in recipe.defaults.items()] + ["-DROW_LEN=100"] * recipe.lazy
        defines += [
            f"-D{d}=9" for d in ("D_KS", "D_STRIDE", "D_PAD", "D_N", "D_C", "D_H", "D_W", "D_OH", "D_OW")
        ] * ("D_KS" in recipe.init_defines)
        proc = subprocess.run(
            [NVCC, "-arch=sm_90", "--ptx", "-o", str(tmp_path / "k.ptx"), *defines, str(src)],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, f"{recipe.name}: {proc.stderr[-2000:]}"
