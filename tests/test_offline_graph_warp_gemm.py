"""The warp-tiled matrix products of the cooperative graph schedule (:mod:`.lower_mm_warp`).

``graph/fused_coop`` runs its products of enough tiles in ``matmul/sgemm_warp``'s tiling; its logic is
checked on PoCL (every product taken warp-tiled, :data:`.lower_mm_warp.MIN_TILES` 0) at small shapes and at
shapes that are not multiples of the tiles, through the real evaluator; the CUDA text is compiled by nvcc.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from eval_helpers import fast_config
from offline_helpers import nvcc_resources

from kfoundry.core.evaluation import Evaluator
from kfoundry.core.models import Outcome
from kfoundry.core.problem import load_problem
from kfoundry.plugins.llms.offline import cookbook_graph, lower_mm_warp
from kfoundry.plugins.llms.offline import lower as lowering
from kfoundry.plugins.llms.offline.generator import OfflineGenerator
from kfoundry.plugins.llms.offline.recipe import Recipe

DATA = Path(__file__).resolve().parent / "data" / "kernelbench"
SMALL: dict[str, dict[str, int]] = json.loads((DATA / "small_shapes.json").read_text())
#: ``x @ weight.T`` with a non-linear tail (outside the KernelBench corpus: no table row)
TRANSPOSED = "../gemm_forms/matmul_transposed_relu_scaling.py"

#: (problem, shapes): the small shapes, and ragged ones (M, N, K past a tile and not multiples of 4)
CASES = [
    ("level2/gemm_add_relu.py", SMALL["level2/gemm_add_relu.py"]),
    ("level2/gemm_logsumexp_relu.py", {"batch_size": 131, "in_features": 37, "out_features": 263}),
    ("level2/gemm_scale_batchnorm.py", {"batch_size": 5, "in_features": 21, "out_features": 270}),
    ("level2/gemm_functional_layer_norm.py", {"batch_size": 130, "in_features": 19, "out_features": 33}),
    ("level1/batched_matmul.py", {"batch_size": 2, "k": 21, "m": 131, "n": 9}),
    # x @ weight.T: B's rows run along K (the lintile loads); K not a multiple of 4
    (TRANSPOSED, {"batch_size": 133, "input_size": 38, "hidden_size": 261}),
]
#: PoCL's cases: each evaluation takes 10-25 s on a busy two-core machine (two in the default run)
POCL = [
    CASES[0],
    CASES[4],
    CASES[5],
    *(pytest.param(*c, marks=pytest.mark.slow) for c in CASES[1:4]),
    *(
        pytest.param(k, SMALL[k], marks=pytest.mark.slow)
        for k in ("level2/attention_matmul_softmax_matmul.py",)
    ),
    pytest.param(  # four products (about a minute)
        "level2/linear_qk_scaled_softmax_matmul.py",
        SMALL["level2/linear_qk_scaled_softmax_matmul.py"],
        marks=pytest.mark.slow,
    ),
]


def _coop(
    key: str, shapes: dict[str, int], lang: str, monkeypatch: pytest.MonkeyPatch
) -> tuple[Recipe, object]:
    monkeypatch.setattr(lower_mm_warp, "MIN_TILES", 0)  # every product warp-tiled
    monkeypatch.setattr(lowering, "LANE_MIN", 4)
    problem = load_problem(DATA / key, shapes)
    spec = OfflineGenerator().spec(problem.summary())
    return cookbook_graph.recipe(spec, lang, "graph/fused_coop", 2), problem


def test_pick_takes_the_default_tile_where_the_product_fills_the_gpu() -> None:
    assert lower_mm_warp.pick((1024, 8192), 0) == lower_mm_warp.TILES[0]
    assert lower_mm_warp.pick((1024, 4096), 0) == lower_mm_warp.TILES[1]
    assert lower_mm_warp.pick((128, 512), 0) is None  # too few tiles: the register-blocked schedule
    assert lower_mm_warp.pick((4, 128, 256), 1, min_tiles=4) == lower_mm_warp.TILES[0]
    # attention's P @ V with a head of 64: the 128 x 64 tile, not four times the outputs in 128 x 256
    assert lower_mm_warp.pick((64, 2048, 64), 1) == lower_mm_warp.TILES[2]
    assert lower_mm_warp.pick((64, 2048, 1000), 1) == lower_mm_warp.TILES[0]  # 98% of a 1024 span kept


@pytest.mark.parametrize(("key", "shapes"), POCL)
def test_warp_tiled_products_are_correct_on_pocl(
    key: str, shapes: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe, problem = _coop(key, shapes, "opencl", monkeypatch)
    assert lower_mm_warp.MARKER in recipe.kernel, key
    with Evaluator(problem, fast_config(cache=False)) as evaluator:  # type: ignore[arg-type]
        record = evaluator.evaluate_many([recipe.candidate()])[0]
    assert record.outcome is Outcome.correct, f"{key}: {record.message}\n{(record.log or '')[-3000:]}"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize(
    "key",
    ["level2/gemm_add_relu.py", "level1/batched_matmul.py", "level2/linear_qk_scaled_softmax_matmul.py"],
)
def test_warp_tiled_cuda_compiles_without_spills(
    key: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe, _ = _coop(key, SMALL[key], "cuda", monkeypatch)
    assert lower_mm_warp.MARKER in recipe.kernel and "shared_mem=" in recipe.forward
    assert "__ldg(reinterpret_cast<const float4*>" in recipe.kernel  # plain operands: 16-byte loads
    report = nvcc_resources(recipe.kernel, recipe.defaults, tmp_path)
    assert " 0 bytes spill stores" in report
    assert "bytes spill" not in report.replace(" 0 bytes spill", "")


#: the emulation's cases (outputs that a uniform error in the product would change)
EMULATED = [
    CASES[0],
    CASES[1],
    CASES[4],
    CASES[5],
    ("level2/gemm_add_relu.py", {"batch_size": 130, "in_features": 50, "out_features": 259}),
    (TRANSPOSED, {"batch_size": 64, "input_size": 64, "hidden_size": 260}),
    # ten tile rows: a last group of two rows in the grouped block order
    ("level2/gemm_logsumexp_relu.py", {"batch_size": 1157, "in_features": 8, "out_features": 300}),
]


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
@pytest.mark.parametrize(("key", "shapes"), EMULATED)
def test_warp_tiled_cuda_matches_eager_on_the_cpu_emulation(
    key: str, shapes: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CUDA text itself (dynamic shared memory, float4 fragment reads) at ragged shapes."""
    import torch
    from test_offline_cuda_emulated import emu_load

    import kfoundry.runtime as runtime

    monkeypatch.setattr(runtime, "load", emu_load)
    recipe, problem = _coop(key, shapes, "cuda", monkeypatch)
    assert lower_mm_warp.MARKER in recipe.kernel
    torch.manual_seed(0)
    reference = problem.make_reference()  # type: ignore[attr-defined]
    inputs = problem.make_inputs(1)  # type: ignore[attr-defined]
    namespace: dict[str, object] = {"PARAMS": dict(recipe.defaults), "__name__": "kf_candidate"}
    exec(compile(recipe.render(), recipe.name, "exec"), namespace)
    torch.manual_seed(0)
    model = namespace["ModelNew"](*problem.make_init_inputs())  # type: ignore[attr-defined, operator]
    with torch.no_grad():  # the candidate first: its buffers cannot reuse the reference's freed results
        got = model(*inputs)
        expected = reference(*inputs)
    torch.testing.assert_close(got.float(), expected.float(), rtol=1e-4, atol=1e-4, equal_nan=True)


def test_a_transposed_operand_is_read_along_k() -> None:
    """``x @ w.T`` (and ``q @ k.transpose(-2, -1)``) take the K-major B loads: a warp reading B along N
    there would stride by K floats (matmul_divide_sum_scaling ran at half of cuBLAS on the H200)."""
    for key in (TRANSPOSED, "level2/linear_qk_scaled_softmax_matmul.py"):
        problem = load_problem(DATA / key, {})
        recipe = cookbook_graph.recipe(
            OfflineGenerator().spec(problem.summary()), "cuda", "graph/fused_coop", 1
        )
        assert "mmtile" not in recipe.kernel.split("softmax")[0], key  # the products before the softmax


def test_vector_runs_only_for_a_float_buffer_indexed_last_by_the_run() -> None:
    floats = {"buf0"}
    assert (
        lower_mm_warp.vector_run("buf0[((i) * z2 + (ka))]", "ka", "ka0", floats)
        == "buf0 + ((i) * z2 + (ka0))"
    )
    assert lower_mm_warp.vector_run("buf1[((i) * z2 + (ka))]", "ka", "ka0", floats) is None  # not float
    assert lower_mm_warp.vector_run("buf0[((ka) * z2 + (i))]", "ka", "ka0", floats) is None  # strided
    assert (
        lower_mm_warp.vector_run("expf(buf0[((i) * z2 + (ka))])", "ka", "ka0", floats) is None
    )  # a prologue


def test_aligned_and_shifted_operands_take_their_own_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    """A warp-tiled product reads an aligned operand's runs with 16-byte loads and a view 4 bytes into its
    storage with the four predicated loads of the same kernel: both match eager on PoCL."""
    import torch

    from kfoundry.runtime import load, synchronize

    shapes = {"batch_size": 130, "in_features": 36, "out_features": 264}
    recipe, problem = _coop("level2/gemm_add_relu.py", shapes, "opencl", monkeypatch)
    assert "vload4(0, kf_pv)" in recipe.kernel
    namespace: dict[str, object] = {"PARAMS": dict(recipe.defaults), "__name__": "kf_candidate", "load": load}
    exec(compile(recipe.render(), recipe.name, "exec"), namespace)  # noqa: S102 - the generator's own
    torch.manual_seed(0)
    reference = problem.make_reference()
    torch.manual_seed(0)
    model = namespace["ModelNew"](*problem.make_init_inputs())  # type: ignore[operator]
    (x,) = problem.make_inputs(1)
    shifted = torch.empty(x.numel() + 1)[1:].view(x.shape)  # 4 bytes into its storage
    shifted.copy_(x)
    for inp in (x, shifted):
        with torch.no_grad():
            got = model(inp)
            synchronize()
            expected = reference(inp)
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("head", [32, 21])
def test_causal_attention_skips_the_tiles_above_the_diagonal(
    head: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Causal SDPA warp-tiled: score tiles wholly above the diagonal return before their first load, and
    P @ V stops at each tile's last row (``TILE_END``); with 16-byte loads (head 32) and without (head 21)
    it matches eager on PoCL. (The evaluator's non-finite variant is left out: torch's CPU math path
    multiplies the masked probabilities' zeros by a NaN value, its CUDA kernels skip them, as this lowering
    does.)"""
    import torch

    from kfoundry.runtime import load, synchronize

    shapes = {"batch_size": 1, "num_heads": 2, "seq_len": 300, "head_dim": head}
    recipe, problem = _coop("level1/sdpa_causal.py", shapes, "opencl", monkeypatch)
    assert "return;" in recipe.kernel and "KF_TILE_END" not in recipe.kernel
    assert "(i0 + 128)" in recipe.kernel
    namespace: dict[str, object] = {"PARAMS": dict(recipe.defaults), "__name__": "kf_candidate", "load": load}
    exec(compile(recipe.render(), recipe.name, "exec"), namespace)  # noqa: S102 - the generator's own
    torch.manual_seed(0)
    inputs = problem.make_inputs(1)
    with torch.no_grad():
        expected = problem.make_reference()(*inputs)
        got = namespace["ModelNew"](*problem.make_init_inputs())(*inputs)  # type: ignore[operator]
        synchronize()
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


def test_a_non_finite_value_of_v_past_the_diagonal_spoils_its_column_as_on_torchs_cpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Off CUDA the causal lowering follows torch's CPU kernel: a NaN or infinity in V past every row's
    diagonal still makes its column NaN (0 x NaN); on CUDA the keys past the diagonal are skipped."""
    import torch

    from kfoundry.runtime import load, synchronize

    shapes = {"batch_size": 1, "num_heads": 2, "seq_len": 64, "head_dim": 32}
    recipe, problem = _coop("level1/sdpa_causal.py", shapes, "opencl", monkeypatch)
    assert "_kf_allkeys = int(dev.type != 'cuda')" in recipe.forward
    namespace: dict[str, object] = {"PARAMS": dict(recipe.defaults), "__name__": "kf_candidate", "load": load}
    exec(compile(recipe.render(), recipe.name, "exec"), namespace)  # noqa: S102 - the generator's own
    torch.manual_seed(0)
    q, k, v = problem.make_inputs(1)
    v[0, 0, 60, 3] = float("nan")  # past the diagonal of rows 0..59
    v[0, 1, 10, 7] = float("inf")  # within rows 10..63, past rows 0..9
    k[0, 1, 30, 0] = float("nan")  # a NaN score: rows 30.. only (the masked ones are -inf first)
    with torch.no_grad():
        expected = problem.make_reference()(q, k, v)
        got = namespace["ModelNew"](*problem.make_init_inputs())(q, k, v)  # type: ignore[operator]
        synchronize()
    assert torch.isnan(expected[0, 0, :, 3]).all()
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5, equal_nan=True)
