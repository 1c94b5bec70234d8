"""The fused pointwise kernels take QU quads (four consecutive outputs each) a grid stride apart per thread
and step (``Lowering._quads``): every quad's coordinates, pointers and 16-byte loads first, then each
quad's elements and its store. Checked as CUDA source on the CPU emulation (:func:`emu_load`) at QU 1, 2
and 4 with the grid cut to two blocks of eight threads, so that steps end part-way through their quads and
the carries cross every dimension: a broadcast bias (16-byte quads; a last dim of 37 that takes the scalar
quads, with a tail inside the last quad), sliced operands next to a vectorised one, rows of a vectorised
operand 16-byte aligned or not from one quad to the next; and, on one thread that logs its loads and
stores, that a step issues all its quads' loads before its first store."""

from __future__ import annotations

import ctypes
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from test_offline_cuda_emulated import emu_load

import kfoundry.runtime as runtime
from kfoundry.core.problem import Problem
from kfoundry.plugins.llms.offline.generator import OfflineGenerator
from tests.offline_helpers import GRID_CAP, pointwise_problem

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")


def _source(problem: Problem) -> tuple[str, dict[str, Any]]:
    """(the rendered module, its default parameters) of the CUDA graph/fused_coop recipe."""
    recipe = next(
        r for r in OfflineGenerator().recipes(problem.summary(), "cuda") if r.name == "graph/fused_coop"
    )
    source = recipe.render()
    assert GRID_CAP in source and "#define QU" in source and "kf_qs0" in source, (
        "the quad kernel changed shape"
    )
    return source, dict(recipe.defaults)


def _run(problem: Problem, source: str, params: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    namespace: dict[str, Any] = {"PARAMS": params, "__name__": "kf_candidate"}
    exec(compile(source, "graph/fused_coop", "exec"), namespace)  # noqa: S102
    torch.manual_seed(0)
    inputs = problem.make_inputs(1)
    with torch.no_grad():
        expected = problem.make_reference()(*inputs)
        got = namespace["ModelNew"](*problem.make_init_inputs())(*inputs)
    assert got.shape == expected.shape
    return got, expected


#: (forward, input shapes, whether a 16-byte quad load runs)
CASES = [
    # a broadcast bias: 16-byte quads of both operands; 240 outputs, 60 quads over 16 threads
    ("F.leaky_relu(x0 + x1, 0.1)", [(5, 4, 12), (12,)], True),
    # a last dim of 37: scalar quads, the last one three elements long
    ("F.leaky_relu(x0 + x1, 0.1)", [(3, 37), (37,)], False),
    # a sliced operand read element by element beside a vectorised broadcast one
    ("x0[:, :, 4:16] * 2 - x1", [(5, 4, 18), (4, 12)], True),
    # sliced and narrowed rows, 111 outputs
    ("x0[:, 2:39] - torch.narrow(x1, 1, 1, 37)", [(3, 41), (3, 40)], False),
]


@pytest.mark.parametrize("qu", [1, 2, 4])
@pytest.mark.parametrize(("forward", "shapes", "vector"), CASES)
def test_quads_per_thread_match_eager_on_the_cpu_emulation(
    tmp_path: Path, forward: str, shapes: list[Any], vector: bool, qu: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runtime, "load", emu_load)
    problem = pointwise_problem(tmp_path, forward, shapes)
    source, defaults = _source(problem)
    source = source.replace(GRID_CAP, "min(_cdiv(int(n), b), 2)")
    params = {**defaults, "BLOCK": 8, "QU": qu}
    got, expected = _run(problem, source, params)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    if vector and qu == 2:  # the 16-byte quads ran: reading each float4's first element four times shows
        assert "kf_ql0[kq]" in source
        got, expected = _run(problem, source.replace("kf_ql0[kq]", "kf_ql0[0]"), params)
        assert not torch.allclose(got, expected, rtol=1e-5, atol=1e-5)


#: a log of the one thread's 16-byte loads ('L') and 16-byte stores ('S'), in program order
TRACE = r"""
static char kf_trace[4096]; static int kf_ntrace = 0;
extern "C" const char* kf_trace_log() { kf_trace[kf_ntrace] = 0; return kf_trace; }
extern "C" void kf_trace_reset() { kf_ntrace = 0; }
static inline const float* kf_ld4(const float* p) { kf_trace[kf_ntrace++] = 'L'; return p; }
static inline void kf_st4() { kf_trace[kf_ntrace++] = 'S'; }
#undef KF_STORE4
#define KF_STORE4(p, i, a, b, c, d) (kf_st4(), *reinterpret_cast<float4*>((p) + (i)) = make_float4((a), (b), (c), (d)))
"""


#: the seam of the two phases of a step; cut out, one loop loads and computes quad after quad (a control)
SEAM = (
    "        }\n        #pragma unroll\n        for (int u = 0; u < QU; ++u) {  // phase 2: each quad's elements "
    "and store\n            const kf_long g4 = kf_g0 + u * kf_qg;\n"
)


@pytest.mark.parametrize(("qu", "merged"), [(1, False), (2, False), (4, False), (2, True)])
def test_a_step_issues_every_quads_loads_before_its_first_store(
    tmp_path: Path, qu: int, merged: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One thread over 60 full quads of a two-operand broadcast (x and the bias, one float4 each per quad):
    each step logs its 2 * QU loads, then its QU stores. ``merged``: the two phases' loops made one (each
    quad's loads, then its store: a correct kernel with one quad's loads in flight), which the log tells."""
    libs: list[Any] = []

    def traced_load(src: str, defines: dict[str, Any] | None = None, **kw: Any) -> Any:
        load4 = r"\*reinterpret_cast<KF_G const float4\*>\((kf_qp\d+)\)"
        src, n = re.subn(load4, r"*reinterpret_cast<KF_G const float4*>(kf_ld4(\1))", src)
        assert n == 2 and "KF_KERNEL k0_out" in src, "the quad kernel's 16-byte loads changed shape"
        at = src.index("KF_KERNEL k0_out")
        module = emu_load(src[:at] + TRACE + src[at:], defines, **kw)
        libs.append(module.lib)
        return module

    monkeypatch.setattr(runtime, "load", traced_load)
    problem = pointwise_problem(tmp_path, "F.leaky_relu(x0 + x1, 0.1)", [(5, 4, 12), (12,)])
    source, defaults = _source(problem)
    source = source.replace(GRID_CAP, "min(_cdiv(int(n), b), 1)")
    if merged:
        assert source.count(SEAM) == 1
        source = source.replace(SEAM, "")
    namespace: dict[str, Any] = {"PARAMS": {**defaults, "BLOCK": 1, "QU": qu}, "__name__": "kf_candidate"}
    exec(compile(source, "graph/fused_coop", "exec"), namespace)  # noqa: S102
    torch.manual_seed(0)
    inputs = problem.make_inputs(1)
    model = namespace["ModelNew"](*problem.make_init_inputs())
    (lib,) = libs
    lib.kf_trace_reset()
    with torch.no_grad():
        got = model(*inputs)
        expected = problem.make_reference()(*inputs)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    lib.kf_trace_log.restype = ctypes.c_char_p
    log = lib.kf_trace_log().decode()
    ilp = ("LL" * qu + "S" * qu) * (60 // qu)
    if merged:
        assert log == "LLS" * 60 != ilp, log
    else:
        assert log == ilp, log
