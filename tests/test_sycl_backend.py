"""The SYCL backend: run-time compiled SYCL kernels on the Intel OpenCL CPU device (skipped without the extra)."""

from __future__ import annotations

import importlib.metadata as md
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from eval_helpers import EXAMPLES, fast_config

from kfoundry.core.backend import CompileFailed
from kfoundry.core.errors import BackendUnavailable
from kfoundry.core.evaluation import Evaluator
from kfoundry.core.models import Candidate, Outcome
from kfoundry.core.plugins import reset_plugin_manager
from kfoundry.core.problem import load_problem
from kfoundry.plugins.backends import sycl_runtime
from kfoundry.plugins.backends.sycl import (
    INSTALL_HINT,
    LaunchError,
    SyclBackend,
    SyclHardware,
    SyclOptions,
    parse_kernels,
    with_defines,
)
from kfoundry.runtime import LocalMemory, cdiv

HEADER = r"""
#include <sycl/sycl.hpp>
namespace syclext = sycl::ext::oneapi;
namespace syclexp = sycl::ext::oneapi::experimental;
"""

ADD = (
    HEADER
    + r"""
extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
void add(const float* a, const float* b, float* c, int n) {
    size_t i = syclext::this_work_item::get_nd_item<1>().get_global_id(0);
    if (i < (size_t)n) c[i] = (a[i] + b[i]) * SCALE;
}

// 2-D: dimension 1 is the fastest-varying one (columns)
extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<2>))
void scale2d(double* x, size_t w, double s) {
    auto it = syclext::this_work_item::get_nd_item<2>();
    size_t row = it.get_global_id(0), col = it.get_global_id(1);
    x[row * w + col] *= s;
}
"""
)

#: Row softmax, one work-group per row: a local_accessor tree reduction with group barriers;
#: row sums with work_group_static memory (size from a define) and a sub-group reduction.
REDUCE = (
    HEADER
    + r"""
extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
void softmax(const float* x, float* out, sycl::local_accessor<float, 1> scratch, int cols) {
    auto it = syclext::this_work_item::get_nd_item<1>();
    auto g = it.get_group();
    size_t row = it.get_group(0), lid = it.get_local_id(0), L = it.get_local_range(0);
    const float* xr = x + row * cols;
    float m = -std::numeric_limits<float>::infinity();
    for (size_t j = lid; j < (size_t)cols; j += L) m = sycl::fmax(m, xr[j]);
    scratch[lid] = m;
    sycl::group_barrier(g);
    for (size_t s = L / 2; s > 0; s >>= 1) {
        if (lid < s) scratch[lid] = sycl::fmax(scratch[lid], scratch[lid + s]);
        sycl::group_barrier(g);
    }
    m = scratch[0];
    sycl::group_barrier(g);
    float sum = 0.f;
    for (size_t j = lid; j < (size_t)cols; j += L) sum += sycl::exp(xr[j] - m);
    sum = sycl::reduce_over_group(g, sum, sycl::plus<float>());
    for (size_t j = lid; j < (size_t)cols; j += L) out[row * cols + j] = sycl::exp(xr[j] - m) / sum;
}

extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
void rowsum(const float* x, float* out, int cols) {
    auto it = syclext::this_work_item::get_nd_item<1>();
    auto g = it.get_group();
    syclexp::work_group_static<float[WG]> partial;
    size_t row = it.get_group(0), lid = it.get_local_id(0);
    float acc = 0.f;
    for (size_t j = lid; j < (size_t)cols; j += WG) acc += x[row * cols + j];
    acc = sycl::reduce_over_group(it.get_sub_group(), acc, sycl::plus<float>());
    auto sg = it.get_sub_group();
    if (sg.get_local_id()[0] == 0) partial[sg.get_group_id()[0]] = acc;
    sycl::group_barrier(g);
    if (lid == 0) {
        float total = 0.f;
        for (size_t s = 0; s < sg.get_group_range()[0]; ++s) total += partial[s];
        out[row] = total;
    }
}
"""
)


def _skip_reason() -> str:
    return SyclBackend().capabilities().reason


@pytest.fixture(scope="module")
def backend() -> Iterator[SyclBackend]:
    b = SyclBackend()
    caps = b.capabilities()
    if not caps.can_run:
        pytest.skip(caps.reason)
    b.select_device(None)
    yield b


@pytest.fixture(scope="module")
def add_module(backend: SyclBackend) -> object:
    return backend.load(ADD, defines={"SCALE": 1.0})


# -- pure Python: run without the extra ------------------------------------------------------------


def test_defines_go_after_the_includes() -> None:
    out = with_defines(ADD, {"WG": 64, "SCALE": 0.5, "FAST": True})
    lines = out.splitlines()
    at = lines.index("#define WG 64")
    assert lines[at - 1] == "#include <sycl/sycl.hpp>"
    assert lines[at + 1] == "#define SCALE 0.5f" and lines[at + 2] == "#define FAST 1"
    assert lines[at + 3] == ADD.splitlines()[2]
    assert with_defines("void f();", {"X": 1}) == "#define X 1\nvoid f();"
    with pytest.raises(CompileFailed, match="not an identifier"):
        with_defines(ADD, {"A-B": 1})


def test_parse_kernel_signatures() -> None:
    sigs = {s.name: s for s in parse_kernels(ADD + REDUCE, {"WG": 64})}
    assert [p.kind for p in sigs["add"].params] == ["ptr", "ptr", "ptr", "i32"]
    assert sigs["scale2d"].ndim == 2 and [p.kind for p in sigs["scale2d"].params] == ["ptr", "u64", "f64"]
    assert [p.kind for p in sigs["softmax"].params] == ["ptr", "ptr", "local", "i32"]
    assert [p.name for p in sigs["rowsum"].params] == ["x", "out", "cols"]


def test_missing_extra_gives_the_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    real = md.version

    def version(name: str) -> str:
        if name == "intel-opencl-rt":
            raise md.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(sycl_runtime.md, "version", version)
    rt, why = sycl_runtime.find_wheels()
    assert rt is None and why.startswith(INSTALL_HINT) and "intel-opencl-rt" in why


# -- on the device ---------------------------------------------------------------------------------


def test_devices_and_profile(backend: SyclBackend) -> None:
    devices = backend.devices()
    assert devices and devices[0].backend == "sycl"
    d = devices[0]
    assert d.max_work_group_size and d.compute_units and d.local_mem_bytes and d.global_mem_bytes
    assert d.sub_group_sizes and d.device_type in ("cpu", "gpu", "accelerator", "other")
    assert "intel-sycl-rt" in backend.toolchain_version()
    assert [p.name for p in SyclHardware().detect("sycl")] == [p.name for p in devices]
    assert SyclHardware().detect("cuda") == []
    with pytest.raises(BackendUnavailable, match="no device matching"):
        backend.select_device("no-such-device")
    backend.select_device(0)


def test_vector_add_zero_copy(backend: SyclBackend, add_module: object) -> None:
    mod = add_module
    assert mod.kernel_names == ["add", "scale2d"]  # type: ignore[attr-defined]
    assert mod.compile_time_s > 0 and mod.resources["add"]["max_work_group_size"] >= 1  # type: ignore[attr-defined]
    report = mod.resources["add"]  # type: ignore[attr-defined]
    # the device image's (SPIR-V) size, and the local memory the OpenCL runtime counts: none
    assert report["binary_bytes"] > 20 and report["local_mem_bytes"] == 0
    n = 1000
    a, b, c = torch.rand(n), torch.rand(n), torch.zeros(n)
    mod.add(a, b, c, n, grid=(8, 1, 1), block=(128, 1, 1))  # type: ignore[attr-defined]
    backend.synchronize()
    torch.testing.assert_close(c, a + b)
    x = torch.ones(3, 5, dtype=torch.float64)
    mod.scale2d(x, 5, 2.5, grid=(3, 1), block=(1, 5))  # type: ignore[attr-defined]
    backend.synchronize()
    assert torch.all(x == 2.5)


def test_defines_change_the_kernel(backend: SyclBackend) -> None:
    mod = backend.load(ADD, defines={"SCALE": 3.0})
    n = 300
    a, b, c = torch.rand(n), torch.rand(n), torch.zeros(n)
    mod.add(a, b, c, n, grid=(cdiv(n, 64),), block=(64,))
    backend.synchronize()
    torch.testing.assert_close(c, (a + b) * 3.0)


@pytest.mark.parametrize("wg", [32, 128])
def test_local_memory_barriers_and_sub_groups(backend: SyclBackend, wg: int) -> None:
    mod = backend.load(REDUCE, defines={"WG": wg})
    assert mod.resources["rowsum"]["local_mem_bytes"] >= wg * 4  # its work_group_static<float[WG]>
    rows, cols = 5, 300
    x = torch.randn(rows, cols)
    out = torch.empty_like(x)
    sums = torch.empty(rows)
    mod.softmax(x, out, LocalMemory(wg * 4), cols, grid=(rows,), block=(wg,))
    mod.rowsum(x, sums, cols, grid=(rows,), block=(wg,))
    backend.synchronize()
    torch.testing.assert_close(out, torch.softmax(x, dim=1))
    torch.testing.assert_close(sums, x.sum(dim=1), atol=1e-4, rtol=1e-4)


def test_compile_error_keeps_the_log(backend: SyclBackend) -> None:
    bad = ADD.replace("(a[i] + b[i])", "(a[i] + undefined_thing)")
    with pytest.raises(CompileFailed, match="line 9:") as info:
        backend.load(bad, defines={"SCALE": 1.0})
    assert "undefined_thing" in info.value.log and "error" in info.value.log
    with pytest.raises(CompileFailed, match="no extern"):
        backend.load(HEADER + "void helper(float* x) { x[0] = 1.f; }\n")


def test_launch_errors(backend: SyclBackend, add_module: object) -> None:
    mod = add_module
    a = torch.rand(16)
    with pytest.raises(LaunchError, match=r"takes 4 arguments \(a, b, c, n\), got 3"):
        mod.add(a, a, a, grid=(1,), block=(16,))  # type: ignore[attr-defined]
    with pytest.raises(LaunchError, match="argument 3 .n.: a tensor for the non-pointer"):
        mod.add(a, a, a, a, grid=(1,), block=(16,))  # type: ignore[attr-defined]
    with pytest.raises(LaunchError, match="pointer parameter .* needs a tensor, got int"):
        mod.add(a, 3, a, 16, grid=(1,), block=(16,))  # type: ignore[attr-defined]
    with pytest.raises(LaunchError, match="float 1.5 for the integer parameter"):
        mod.add(a, a, a, 1.5, grid=(1,), block=(16,))  # type: ignore[attr-defined]
    with pytest.raises(LaunchError, match="does not fit"):
        mod.add(a, a, a, 2**40, grid=(1,), block=(16,))  # type: ignore[attr-defined]
    with pytest.raises(LaunchError, match="numpy float64 for a parameter"):
        mod.add(a, a, a, np.float64(1), grid=(1,), block=(16,))  # type: ignore[attr-defined]
    with pytest.raises(LaunchError, match="not contiguous"):
        mod.add(torch.rand(4, 4).t(), a, a, 16, grid=(1,), block=(16,))  # type: ignore[attr-defined]
    with pytest.raises(LaunchError, match="nd_range_kernel<1>"):
        mod.add(a, a, a, 16, grid=(1, 2), block=(16, 1))  # type: ignore[attr-defined]
    with pytest.raises(LaunchError, match="exceeds this kernel's limit"):
        mod.add(a, a, a, 16, grid=(1,), block=(1 << 20,))  # type: ignore[attr-defined]
    with pytest.raises(AttributeError, match="kernels: add, scale2d"):
        mod.nope  # type: ignore[attr-defined]  # noqa: B018
    mod.add(a, a, a, np.int32(16), grid=(1,), block=(16,))  # type: ignore[attr-defined]  # still usable
    backend.synchronize()


def test_copy_mode_without_system_usm() -> None:
    b = SyclBackend(SyclOptions(zero_copy=False))
    if not b.capabilities().can_run:
        pytest.skip(b.capabilities().reason)
    b.select_device(None)
    mod = b.load(ADD, defines={"SCALE": 2.0})
    n = 500
    a, x, c = torch.rand(n), torch.rand(n), torch.zeros(n)
    mod.add(a, x, c, n, grid=(cdiv(n, 128),), block=(128,))
    b.synchronize()
    torch.testing.assert_close(c, (a + x) * 2.0)


@pytest.fixture
def sycl_entry_point() -> Iterator[None]:
    """The ``sycl`` entry point must be installed: the sandbox workers find the backend through it."""
    if reason := _skip_reason():
        pytest.skip(reason)
    assert any(ep.name == "sycl" for ep in md.entry_points(group="kfoundry")), "reinstall: pip install -e ."
    reset_plugin_manager()
    yield


def test_evaluator_judges_a_sycl_candidate(sycl_entry_point: None, tmp_path: Path) -> None:
    problem = load_problem(EXAMPLES / "kernelbench" / "vector_add.py", {"N": 4096})
    config = fast_config(tmp_path, backend="sycl", timeout_s=120.0, cache=False, shape_variants=0)
    seed = EXAMPLES / "kernelbench" / "seeds" / "vector_add_sycl.py"
    broken = seed.read_text().replace("a[i] + b[i]", "a[i] - b[i]")
    with Evaluator(problem, config) as evaluator:
        good, tuned, bad = evaluator.evaluate_many(
            [
                Candidate(source=seed.read_text(), language="sycl", label=seed.name),
                Candidate(source=seed.read_text(), language="sycl", params={"BLOCK": 64}),
                Candidate(source=broken, language="sycl"),
            ]
        )
    assert good.outcome is Outcome.correct, f"{good.message}\n{good.log}"
    assert good.timing is not None and good.timing.n >= 3 and good.timing.median_ms > 0
    assert good.compile_time_s is not None and good.resources
    assert tuned.outcome is Outcome.correct, tuned.message
    assert bad.outcome is Outcome.mismatch, bad.message


@pytest.mark.slow  # 12 s; .ci/run runs it with the slow subset
def test_the_naive_softmax_seed_is_correct(sycl_entry_point: None, tmp_path: Path) -> None:
    """The seed the optimize loop measures its SYCL speedups against ("x faster than the naive seed")."""
    problem = load_problem(EXAMPLES / "kernelbench" / "softmax.py", {"batch_size": 16, "dim": 512})
    config = fast_config(tmp_path, backend="sycl", max_repeats=10, cache=False, shape_variants=0)
    seed = EXAMPLES / "kernelbench" / "seeds" / "softmax_sycl.py"
    with Evaluator(problem, config) as evaluator:
        record = evaluator.evaluate(Candidate(source=seed.read_text(), language="sycl", label=seed.name))
    assert record.outcome is Outcome.correct, f"{record.message}\n{record.log}"
    assert record.timing is not None and record.timing.median_ms > 0
