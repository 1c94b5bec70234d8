"""Index width of the offline generator's kernels at the current KernelBench sizes (tensors of up to 2^31
elements and more): 32-bit index arithmetic only where every index provably fits, 64-bit elsewhere.

Nothing here can hold a 2^31-element tensor (24 GiB, 2 cores), so the large-size paths are checked three
ways: (a) the decision, from the problem's shapes, for every problem of tests/data/kernelbench at its
own sizes and at the sizes named in REAL: every recipe the generator lists there either has no 32-bit
index left in its kernel or comes from a problem whose largest tensor fits with margin, and every launch
its ``forward`` makes at those sizes (run on the meta device with a recording ``load``) has a grid the
device takes and int arguments that fit; (b) the 64-bit rewrite forced on, run on PoCL against PyTorch
(small shapes for every recipe of a family, and a few hundred MB); (c) the real-size CUDA sources of
the 64-bit variants compiled with NVRTC.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from kfoundry.core.generator import GeneratorUnsupported
from kfoundry.core.problem import load_problem
from kfoundry.plugins.backends.cuda_compile import nvrtc_available
from kfoundry.plugins.llms.offline.generator import OfflineGenerator
from kfoundry.plugins.llms.offline.index_width import (
    CUDA_MIXED_MINMAX,
    INT32_MAX,
    LAUNCH_SLACK,
    adapt,
    fits_int32,
    max_elements,
    max_per_sample,
    wide_needed,
    widen,
)

DATA = Path(__file__).resolve().parent / "data" / "kernelbench"
SMALL: dict[str, dict[str, int]] = json.loads((DATA / "small_shapes.json").read_text())

#: Current KernelBench sizes (tensors of just under 2^31 elements, or 2^30), whatever the data files hold.
REAL: dict[str, dict[str, int]] = {
    "level1/l1_norm.py": {"batch_size": 32768, "dim": 65535},
    "level1/argmax_dim.py": {"batch_size": 128, "dim1": 4096, "dim2": 4095},
    "level1/mse_loss.py": {"batch_size": 32768, "dim": 32768},
    "level1/hinge_loss.py": {"batch_size": 32768, "dim": 32768},
    "level1/relu.py": {"batch_size": 4096, "dim": 393216},
    "level1/softmax_rows.py": {"batch_size": 4096, "dim": 393216},
    "level1/sum_reduction_keepdim.py": {"batch_size": 128, "dim1": 4096, "dim2": 4095},
}
#: One problem per family of kernels (cookbook families and the lowered graph) for the default run.
FAST = ["level1/relu.py", "level1/softmax_rows.py", "level1/l1_norm.py"]
#: a problem whose lowered graph holds more than 2^30 elements in one sample (a 64-bit graph)
WIDE_GRAPH = (
    "level1/conv_pointwise_2d.py",
    {"batch_size": 1, "in_channels": 64, "out_channels": 128, "height": 4096, "width": 4096},
)

_GEN = OfflineGenerator()


def _problem(key: str, shapes: dict[str, int] | None = None) -> Any:
    try:
        chosen: dict[str, int | float] = dict(shapes if shapes is not None else REAL.get(key, {}))
        problem = load_problem(DATA / key, chosen)
        problem.summary()
    except Exception as exc:  # noqa: BLE001 - a data file mid-update: its own tests report it
        pytest.skip(f"{key}: does not load at these sizes ({str(exc)[:120]})")
    return problem


def _recipes(problem: Any, language: str) -> list[Any]:
    try:
        return _GEN.recipes(problem.summary(), language)
    except GeneratorUnsupported as exc:
        pytest.skip(f"{problem.name}: not recognised ({str(exc)[:120]})")


def _data_keys() -> list[str]:
    return sorted(f"{p.parent.name}/{p.name}" for p in DATA.glob("level*/*.py"))


BIG = sorted(REAL)


# -- a recording load: what forward launches, on the meta device ------------------------------------------


class _Program:
    def __init__(self, log: list[dict[str, Any]], source: str, defines: dict[str, Any]) -> None:
        self.log, self.source, self.defines = log, source, defines

    def __getattr__(self, name: str) -> Callable[..., None]:
        def launch(*args: Any, grid: Any, block: Any, **_: Any) -> None:
            self.log.append(
                {"kernel": name, "source": self.source, "defines": self.defines, "args": args}
                | {"grid": tuple(grid), "block": tuple(block)}
            )

        return launch


def _launches(recipe: Any, problem: Any) -> list[dict[str, Any]]:
    """Every launch ``recipe``'s ``ModelNew`` makes for one call at the problem's sizes (meta tensors)."""
    log: list[dict[str, Any]] = []

    def load(source: str, defines: dict[str, Any] | None = None, **_: Any) -> _Program:
        return _Program(log, source, dict(defines or {}))

    namespace: dict[str, Any] = {"PARAMS": dict(recipe.defaults), "__name__": "kf_candidate", "load": load}
    source = recipe.render().replace("from kfoundry.runtime import load\n", "")
    exec(compile(source, recipe.name, "exec"), namespace)  # noqa: S102 - the generator's own ModelNew
    with torch.device("meta"), torch.no_grad():
        model = namespace["ModelNew"](*problem.make_init_inputs())
        try:
            inputs = problem.make_inputs(0)
        except RuntimeError as exc:  # an input draw that reads a value (.item()) cannot run on meta
            pytest.skip(f"{recipe.name}: inputs cannot be drawn on the meta device ({str(exc)[:80]})")
        model(*inputs)
    assert log, f"{recipe.name}: forward launched nothing"
    return log


# -- (a) the decision at the real sizes -------------------------------------------------------------------

#: a 32-bit ``int`` naming a scalar: what the 64-bit rewrite must leave none of
_NARROW = re.compile(r"\bint\b(?!\s*\*)")
_ALLOWED_BEFORE = re.compile(r"(unsigned|__local|__shared__|KF_LOCAL|volatile|atomic_|struct)\s*(const\s+)?$")


def narrow_ints(source: str) -> list[str]:
    """Lines of ``source`` that still declare or cast to a 32-bit ``int`` scalar (an OpenCL kernel's
    ``int NAME_kf32`` parameter, copied into a 64-bit local before use, is allowed)."""
    out = []
    source = source.replace(CUDA_MIXED_MINMAX, "")
    for m in _NARROW.finditer(source):
        start = source.rfind("\n", 0, m.start()) + 1
        end = source.find("\n", m.end())
        line = source[start : end if end >= 0 else None]
        if _ALLOWED_BEFORE.search(source[start : m.start()]) or re.match(r"\s*\w+_kf32\b", source[m.end() :]):
            continue
        out.append(line.strip())
    return out


def test_the_threshold_keeps_margin() -> None:
    assert fits_int32(1 << 29)
    assert fits_int32((INT32_MAX - LAUNCH_SLACK) // 2)
    assert not fits_int32((INT32_MAX - LAUNCH_SLACK) // 2 + 1)
    assert not fits_int32(1 << 30)  # MSE / hinge at 32768 x 32768
    assert not fits_int32(4096 * 393216)  # the elementwise problems
    assert not fits_int32(32768 * 65535)  # L1 norm


def test_small_sizes_keep_32_bit_kernels() -> None:
    """The fast path: at small shapes the kernels are the cookbook's own (no rewrite)."""
    problem = _problem("level1/softmax_rows.py", SMALL["level1/softmax_rows.py"])
    spec = _GEN.spec(problem.summary())
    assert not wide_needed(spec)
    for recipe in _recipes(problem, "cuda"):
        assert "index64" not in recipe.description
        assert re.search(r"\bint\s+\w+\s*=", recipe.kernel), recipe.name
    assert adapt(_recipes(problem, "cuda"), spec) == _recipes(problem, "cuda")


@pytest.mark.parametrize("key", BIG)
def test_real_sizes_index_in_64_bits(key: str) -> None:
    _check_64_bit(key, _problem(key))


def _check_64_bit(key: str, problem: Any) -> None:
    """Every recipe of ``problem`` at its sizes either indexes in 64 bits or may not (its bound fits)."""
    spec = _GEN.spec(problem.summary())
    assert max_elements(spec) >= max(math.prod(t.shape) for t in _meta_inputs(problem))
    assert not fits_int32(max_elements(spec)), key
    if spec.family == "graph" and fits_int32(max_per_sample(spec)):
        # a lowered graph's flat indices are 64-bit already (kf_long); its int locals stay in one sample
        for language in ("cuda", "opencl"):
            for recipe in _recipes(problem, language):
                assert "index64" not in recipe.description and "kf_long" in recipe.kernel, recipe.name
        return
    assert wide_needed(spec), f"{key}: {max_elements(spec)} elements taken for 32-bit"
    for language in ("cuda", "opencl"):
        for recipe in _recipes(problem, language):
            left = narrow_ints(recipe.kernel)
            if (
                left
                and "index64" in recipe.description
                and "[index64: 64-bit index" not in recipe.description
            ):
                # the recipe's own claim (e.g. onchip_split: 64-bit row offsets, 32-bit positions within a
                # row): its kernel forms 64-bit offsets and a row fits 32 bits with margin
                assert re.search(r"long long|size_t|kf_long", recipe.kernel), recipe.name
                assert fits_int32(spec.R * max(spec.inner, 1)), (key, recipe.name, spec.R, spec.inner)
                continue
            assert not left, f"{key} {language} {recipe.name}: 32-bit indices left: {left[:4]}"
            if language == "cuda":
                assert not re.search(r"(?<!long long\))(blockIdx|gridDim)\.[xyz]", recipe.kernel), recipe.name


def _meta_inputs(problem: Any) -> list[torch.Tensor]:
    with torch.device("meta"):
        return [t for t in problem.make_inputs(0) if isinstance(t, torch.Tensor)]


@pytest.mark.parametrize("key", BIG)
def test_real_size_launches_fit_the_device(key: str) -> None:
    """At the real sizes every launch's grid fits (x < 2^31, y and z <= 65535, 1024 threads a block),
    and every int argument fits its parameter: 4 bytes on OpenCL (the launcher's int32), 8 on CUDA where
    the kernel is widened (``long long``)."""
    _check_launches(key, _problem(key))


def _check_launches(key: str, problem: Any) -> None:
    for language in ("cuda", "opencl"):
        for recipe in _recipes(problem, language):
            for launch in _launches(recipe, problem):
                what = f"{key} {language} {recipe.name} {launch['kernel']}"
                gx, gy, gz = (*launch["grid"], 1, 1)[:3]
                assert 1 <= gx <= INT32_MAX and 1 <= gy <= 65535 and 1 <= gz <= 65535, (what, launch["grid"])
                assert math.prod(launch["block"]) <= 1024, (what, launch["block"])
                ints = [a for a in launch["args"] if isinstance(a, int) and not isinstance(a, bool)]
                limit = (1 << 63) - 1 if language == "cuda" else INT32_MAX
                assert all(-limit - 1 <= a <= limit for a in ints), (what, ints)
                assert all(abs(v) <= INT32_MAX for v in launch["defines"].values() if isinstance(v, int)), (
                    what
                )


@pytest.mark.slow
@pytest.mark.parametrize("key", _data_keys())
def test_every_data_problem_at_its_own_sizes(key: str) -> None:
    """tests/data/kernelbench at the sizes its files hold (the current KernelBench sizes): where 64-bit
    indices are needed they are used, and every launch fits."""
    problem = _problem(key, {})
    if not fits_int32(max_elements(_GEN.spec(problem.summary()))):
        _check_64_bit(key, problem)
    _check_launches(key, problem)


@pytest.mark.slow
@pytest.mark.parametrize("key", sorted(SMALL))
def test_32_bit_kernels_have_margin_at_their_sizes(key: str) -> None:
    """Where a problem keeps 32-bit kernels, its launches' work-items and its largest tensor stay far
    below 2^31 (so ``gid``, ``gid + stride`` and every element offset fit)."""
    for shapes in (SMALL[key], {}):
        problem = _problem(key, shapes)
        spec = _GEN.spec(problem.summary())
        if wide_needed(spec) or spec.family == "graph":  # a graph's thread ids are kf_long (KF_GID)
            continue
        for recipe in _recipes(problem, "cuda"):
            for launch in _launches(recipe, problem):
                items = math.prod(launch["grid"]) * math.prod(launch["block"])
                assert items + 2 * max_elements(spec) <= INT32_MAX, (key, recipe.name, launch["grid"])


# -- the rewrite itself -------------------------------------------------------------------------------------


def test_widen_rewrites_indices_not_bit_patterns() -> None:
    src = """
__kernel void f(__global const float* restrict X, __global int* restrict idx, int n, const int m) {
    __local int counts[64];
    int i = get_global_id(0);
    unsigned int bits = as_uint(X[0]);
    for (int r = 0; r < m; ++r) idx[(int)i] = counts[r & 63] + (int)bits;
}
"""
    out = widen(src, "opencl")
    assert "int n_kf32" in out and "const int m_kf32" in out and "long n = n_kf32; long m = m_kf32;" in out
    assert "__global int* restrict idx" in out and "__local int counts[64];" in out
    assert "unsigned int bits" in out and "long i = get_global_id(0);" in out and "(long)i" in out
    assert not narrow_ints(out)
    cuda = widen(
        src.replace("__kernel void", 'extern "C" __global__ void').replace(
            "get_global_id(0)", "blockIdx.x * 256"
        ),
        "cuda",
    )
    assert "long long n" in cuda and "const long long m" in cuda and "((long long)blockIdx.x) * 256" in cuda
    assert widen("pid = tl.program_id(0) * B", "triton") == "pid = tl.program_id(0).to(tl.int64) * B"


def test_widen_reads_past_kernel_attributes() -> None:
    body = "(const float* X, float* Y, int n) {\n    int i = blockIdx.x;\n    Y[i] = X[i] + n;\n}\n"
    heads = [
        "KF_KERNEL __launch_bounds__(256, 1) k0",
        "KF_KERNEL KF_CONV_BOUNDS k0",
        "KF_KERNEL __cluster_dims__(KF_CL, 1, 1) __launch_bounds__(256) k0",
        'extern "C" __global__ void __launch_bounds__((BM / TM) * (BN / TN)) k0',
    ]
    for head in heads:
        out = widen(head + body, "cuda")
        assert "long long n)" in out and "long long i = " in out, (head, out)
        assert head in out, out  # the attributes are kept as they were


# -- (b) the 64-bit variants run on PoCL ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def pocl() -> None:
    from kfoundry.core.plugins import get_plugin
    from kfoundry.runtime import set_backend

    backend = get_plugin("backend", "opencl").build({})
    backend.require_device()
    set_backend(backend)


def _run_on_pocl(recipe: Any, problem: Any, inputs: list[Any]) -> tuple[Any, Any]:
    from kfoundry.runtime import load, synchronize

    namespace: dict[str, Any] = {"PARAMS": dict(recipe.defaults), "__name__": "kf_candidate", "load": load}
    exec(compile(recipe.render(), recipe.name, "exec"), namespace)  # noqa: S102 - the generator's own ModelNew
    torch.manual_seed(0)
    reference = problem.make_reference()
    torch.manual_seed(0)
    model = namespace["ModelNew"](*problem.make_init_inputs())
    with torch.no_grad():
        expected = reference(*inputs)
        got = model(*inputs)
        synchronize()
    return expected, got


def _close(expected: torch.Tensor, got: torch.Tensor, tol: float = 1e-3) -> bool:
    if not expected.dtype.is_floating_point:
        return torch.equal(got, expected)
    return torch.allclose(got.float(), expected.float(), rtol=tol, atol=tol, equal_nan=True)


#: small shapes: every OpenCL recipe with the 64-bit rewrite forced on (cookbook families and graphs)
WIDE_SMALL = [
    "level1/relu.py",
    "level1/gelu.py",
    "level1/softmax_rows.py",
    "level1/layer_norm_module.py",
    "level1/sum_reduction_keepdim.py",
    "level1/argmax_dim.py",
    "level1/l1_norm.py",
    "level1/square_matmul.py",
    "level1/depthwise_conv2d.py",
    "level1/cumsum.py",
    "level1/avg_pool2d.py",
    "level1/conv2d_square.py",
    "level2/gemm_max_subtract_gelu.py",
]


@pytest.mark.parametrize(
    "key",
    [
        k if k in ("level1/relu.py", "level1/l1_norm.py") else pytest.param(k, marks=pytest.mark.slow)
        for k in WIDE_SMALL
    ],
)
def test_widened_recipes_are_correct_on_pocl(pocl: None, key: str) -> None:
    problem = _problem(key, SMALL[key])
    spec = _GEN.spec(problem.summary())
    recipes = adapt(_recipes(problem, "opencl"), spec, force=True)
    for recipe in recipes:
        assert not narrow_ints(recipe.kernel), recipe.name
        expected, got = _run_on_pocl(recipe, problem, problem.make_inputs(1))
        assert got.shape == expected.shape and _close(expected, got), f"{key} {recipe.name}"


#: a few hundred MB on PoCL, 64-bit rewrite forced on
MODERATE = [
    ("level1/relu.py", {"batch_size": 2048, "dim": 16384}, None),  # 32 Mi elements, 128 MB a tensor
    ("level1/softmax_rows.py", {"batch_size": 1024, "dim": 49152}, ["softmax/vector", "softmax/workgroup"]),
    ("level1/l1_norm.py", {"batch_size": 2048, "dim": 32768}, ["graph/fused"]),
    ("level1/argmax_dim.py", {"batch_size": 16, "dim1": 1024, "dim2": 4095}, ["graph/fused"]),
]


@pytest.mark.parametrize(
    ("key", "shapes", "names"),
    [pytest.param(*case, marks=pytest.mark.slow) if i else case for i, case in enumerate(MODERATE)],
    ids=[c[0] for c in MODERATE],
)
def test_widened_kernels_at_a_few_hundred_mb_on_pocl(
    pocl: None, key: str, shapes: dict[str, int], names: list[str] | None
) -> None:
    problem = _problem(key, shapes)
    spec = _GEN.spec(problem.summary())
    recipes = [
        r for r in adapt(_recipes(problem, "opencl"), spec, force=True) if names is None or r.name in names
    ]
    assert recipes
    torch.manual_seed(0)
    inputs = problem.make_inputs(1)
    for recipe in recipes:
        expected, got = _run_on_pocl(recipe, problem, inputs)
        assert got.shape == expected.shape and _close(expected, got, 2e-3), f"{key} {recipe.name}"
        del expected, got


# -- (c) the real-size CUDA sources compile -----------------------------------------------------------------

needs_nvrtc = pytest.mark.skipif(not nvrtc_available()[0], reason="NVRTC not installed (extra `cuda`)")


@needs_nvrtc
@pytest.mark.parametrize("key", [k if k in FAST else pytest.param(k, marks=pytest.mark.slow) for k in BIG])
def test_real_size_cuda_sources_compile_with_nvrtc(key: str) -> None:
    from kfoundry.plugins.backends.cuda import CudaBackend, CudaOptions

    backend = CudaBackend(CudaOptions(compiler="nvrtc", compile_only=True, arch="sm_90a"))
    problem = _problem(key)
    seen = set()
    spec = _GEN.spec(problem.summary())
    recipes = adapt(_recipes(problem, "cuda"), spec, force=True)  # the 64-bit variants, graphs' too
    for recipe in recipes:
        for launch in _launches(recipe, problem):
            marker = (launch["source"], tuple(sorted(launch["defines"].items())))
            if marker in seen:
                continue
            seen.add(marker)
            module = backend.load(launch["source"], defines=launch["defines"])
            assert module.resources, f"{key} {recipe.name}"


def test_a_graph_with_a_sample_past_2_30_elements_is_widened() -> None:
    """One image of 128 x 4096 x 4096 outputs: the implicit-GEMM convolution's per-image int
    coordinates would pass 2^31 - 1, so the lowered graph is widened too; its launches still fit."""
    key, shapes = WIDE_GRAPH
    problem = _problem(key, shapes)
    spec = _GEN.spec(problem.summary())
    assert spec.family == "graph" and not fits_int32(max_per_sample(spec)) and wide_needed(spec)
    for language in ("cuda", "opencl"):
        for recipe in _recipes(problem, language):
            assert "index64" in recipe.description and not narrow_ints(recipe.kernel), recipe.name
    _check_launches(key, problem)
