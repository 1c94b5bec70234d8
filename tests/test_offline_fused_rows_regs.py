"""The CUDA row reduction plus broadcast consumer kernel (``lower_scan.fused_rows``) with its block's slice
in registers (``KF_PER`` elements per thread, loaded up front; the consumer applied to the registers) and
its partials double-buffered in shared memory (one cluster barrier per row), run as CUDA source on the CPU
(``test_offline_cuda_emulated``): against torch with ragged rows, NaN / Inf, a consumer that also reads
another tensor, bit-for-bit against the loop fallback (``KF_PER`` 0), and clusters of two blocks through
an emulation where a cluster's blocks run at once (distributed shared memory, split cluster barriers, a
block's shared memory poisoned as it exits)."""

from __future__ import annotations

import re
import shutil
import textwrap
from pathlib import Path
from typing import Any

import pytest
import test_offline_cuda_emulated as emu
import torch
from test_offline_cuda_emulated import emu_load

import kfoundry.runtime as runtime
from kfoundry.core.problem import Problem, load_problem
from kfoundry.plugins.llms.offline import cookbook_graph, lower_scan
from kfoundry.plugins.llms.offline.generator import OfflineGenerator

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")

DATA = Path(__file__).resolve().parent / "data" / "kernelbench"


def _problem(tmp: Path, forward: str, shape: tuple[int, int]) -> Problem:
    src = f"""
        import torch
        import torch.nn as nn

        class Model(nn.Module):
            def __init__(self):
                super().__init__()

            def forward(self, x, z):
                return {forward}

        def get_inputs():
            return [torch.rand{shape!r}, torch.rand{shape!r}]

        def get_init_inputs():
            return []
        """
    path = tmp / "problem.py"
    path.write_text(textwrap.dedent(src))
    return load_problem(path, {})


def _model(problem: Problem, monkeypatch: pytest.MonkeyPatch, loader: Any, rg: int = 0) -> Any:
    """``graph/fused_coop`` for CUDA built from ``problem`` at small shapes, its programs from ``loader``;
    ``rg`` > 0: RG waves of clusters on a 1-SM GPU (clusters loop over many rows)."""
    monkeypatch.setattr(lower_scan, "ROWS_MIN", 16)
    monkeypatch.setattr(lower_scan, "ROWS_MIN_ROWS", 1)
    monkeypatch.setattr(runtime, "load", loader)
    recipe = cookbook_graph.recipe(OfflineGenerator().spec(problem.summary()), "cuda", "graph/fused_coop", 2)
    assert re.findall(r"^KF_KERNEL .*\b(k\d+_\w+)\(", recipe.kernel, re.M) == ["k0_rows"], recipe.kernel
    assert "_program(KF_CL=_kf_cl, KF_PER=_kf_per)" in recipe.forward, recipe.forward
    assert "float kf_v[KF_PER];" in recipe.kernel and "kf_part[kf_it & 1]" in recipe.kernel
    source = recipe.render()
    wave = "p['RG'] * 132 // _kf_cl"
    assert wave in source
    source = source.replace(wave, "p['RG'] * 1")
    namespace: dict[str, Any] = {"PARAMS": {**recipe.defaults, "RG": rg}, "__name__": "kf_candidate"}
    exec(compile(source, recipe.name, "exec"), namespace)
    return namespace["ModelNew"](*problem.make_init_inputs())


class _Loads:
    """A loader recording the defines of each program (and forcing some)."""

    def __init__(self, load: Any = emu_load, **force: int) -> None:
        self.load, self.force, self.defines = load, force, []  # type: ignore[var-annotated]

    def __call__(self, source: str, defines: dict[str, Any] | None = None, **kw: Any) -> Any:
        if "KF_CL" not in (defines or {}):
            return None  # the module's default program: the row kernel launches from ``_program`` only
        d = {**(defines or {}), **self.force}
        self.defines.append(d)
        return self.load(source, d, **kw)


def _norm_rows(key: str, rows: int, dim: int) -> Problem:
    return load_problem(DATA / key, {"batch_size": rows, "dim": dim})


def _input(rows: int, dim: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    # distinct values: a register read of another element shows
    x = torch.randn(rows, dim, generator=g) + 0.25
    x[0, 7] = float("nan")  # a NaN row: NaN throughout
    x[1, dim - 1] = float("inf")  # +inf in the tail: its row's sum inf, the element's result NaN, others 0
    if rows > 2:
        x[2, 3] = float("-inf")
    return x


def _expected(problem: Problem, *inputs: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return problem.make_reference().double()(*[t.double() for t in inputs]).float()


@pytest.mark.parametrize(
    ("key", "dim", "per"), [("level1/l2_norm.py", 1001, 2), ("level1/l1_norm.py", 4099, 9)]
)
def test_register_path_matches_torch_and_the_loop_fallback_bit_for_bit(
    key: str, dim: int, per: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows of 1001 / 4099 (no multiple of 512 or 4; one block per row): KF_PER 2 / 9 elements per thread,
    the last partly past the row; the same values as torch (NaN, inf included) and (L2), bit for bit, as
    the loop that re-reads the slice (the same per-thread summation order)."""
    problem = _norm_rows(key, 5, dim)
    x = _input(5, dim)
    expected = _expected(problem, x)
    regs = _Loads()
    with torch.no_grad():
        got = _model(problem, monkeypatch, regs)(x)
    assert [(d["KF_CL"], d["KF_PER"]) for d in regs.defines] == [(1, per)]
    torch.testing.assert_close(got, expected, rtol=2e-6, atol=1e-7, equal_nan=True)
    assert got[0].isnan().all() and got[1, -1].isnan() and (got[1, :-1] == 0).all()
    if key != "level1/l2_norm.py":
        return  # one build of the loop (a g++ build of the emulation is seconds)
    loop = _Loads(KF_PER=0)
    with torch.no_grad():
        again = _model(problem, monkeypatch, loop)(x)
    assert [d["KF_PER"] for d in loop.defines] == [0]
    assert torch.equal(got.view(torch.int32), again.view(torch.int32))


def test_consumer_loads_of_another_tensor_stay_global(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``z * x / ||x||``: the consumer's loads of x come from the registers, its loads of z from memory
    (were z's element taken from x's registers, or x's from another element, the result would differ)."""
    problem = _problem(tmp_path, "(z * x) / torch.norm(x, p=2, dim=1, keepdim=True) - x", (3, 777))
    g = torch.Generator().manual_seed(1)
    x, z = torch.randn(3, 777, generator=g), torch.randn(3, 777, generator=g)
    regs = _Loads()
    model = _model(problem, monkeypatch, regs)
    with torch.no_grad():
        got = model(x, z)
    assert [d["KF_PER"] for d in regs.defines] == [2]
    torch.testing.assert_close(got, _expected(problem, x, z), rtol=1e-5, atol=1e-6)


#: the emulation's changes for clusters of gridDim.x blocks run at once: per-block barriers and warp
#: exchanges, a cluster barrier whose arrive and wait are split (std::barrier tokens), each block's shared
#: memory in its own arena (distributed shared memory: an address moved to another block's arena), poisoned
#: (NaN) when a cluster starts and as each of its blocks exits; the last block of a cluster lags after each
#: cluster barrier, so a partial rewritten before it has read it (or freed by an exit) shows
_CLUSTER_SUBS = [
    ("static std::barrier<>* g_bar = nullptr;", "thread_local std::barrier<>* g_bar = nullptr;"),
    ("static std::vector<std::barrier<>*> g_wbar;", "thread_local std::vector<std::barrier<>*> g_wbar;"),
    (
        "static float g_xf[1024]; static long long g_xl[1024];",
        "thread_local float* g_xf; thread_local long long* g_xl;",
    ),
    (
        "template <class T> static inline T* __cluster_map_shared_rank(T* p, unsigned) { return p; }\n"
        "#define __cluster_barrier_arrive() g_bar->arrive_and_wait()\n"
        "#define __cluster_barrier_wait() ((void)0)\n",
        "#define EMU_SMEM 4096\n"
        "alignas(16) static unsigned char g_csm[8][EMU_SMEM];\n"
        "template <class T> static inline T* __cluster_map_shared_rank(T* p, unsigned rk) {\n"
        "    return reinterpret_cast<T*>(reinterpret_cast<unsigned char*>(p) + ((long)rk - (long)blockIdx.x) * EMU_SMEM); }\n"
        "static std::barrier<>* g_cbar = nullptr;\n"
        "thread_local std::optional<std::barrier<>::arrival_token> g_tok;\n"
        "#define __cluster_barrier_arrive() (g_tok.emplace(g_cbar->arrive()))\n"
        "// the last block lags after each cluster barrier: its reads of the others' partials come late\n"
        "static inline void emu_lag() { if (blockIdx.x + 1 == gridDim.x) std::this_thread::sleep_for(std::chrono::milliseconds(20)); }\n"
        "#define __cluster_barrier_wait() (g_cbar->wait(std::move(*g_tok)), g_tok.reset(), emu_lag())\n",
    ),
]

_CLUSTER_LAUNCH = r"""static void emu_launch(dim3 g, dim3 b, const std::function<void()>& fn) {
    gridDim = g; blockDim = b;
    const unsigned n = b.x * b.y * b.z, cl = g.x;
    for (unsigned z = 0; z < g.z; ++z) for (unsigned y = 0; y < g.y; ++y) {
        std::memset(g_csm, 0xff, sizeof g_csm);
        std::barrier<> cbar(n * cl); g_cbar = &cbar;
        std::vector<std::unique_ptr<std::barrier<>>> bars;
        std::vector<std::vector<std::barrier<>*>> wbs(cl);
        std::vector<std::vector<float>> xf(cl, std::vector<float>(1024));
        std::vector<std::vector<long long>> xl(cl, std::vector<long long>(1024));
        std::vector<std::atomic<unsigned>> left(cl);
        for (unsigned x = 0; x < cl; ++x) {
            bars.emplace_back(new std::barrier<>(n)); left[x] = n;
            for (unsigned w = 0; w < (n + 31) / 32; ++w) wbs[x].push_back(new std::barrier<>(std::min(32u, n - 32 * w)));
        }
        std::vector<std::thread> ts;
        for (unsigned x = 0; x < cl; ++x) for (unsigned t = 0; t < n; ++t) ts.emplace_back([&, x, t, y, z] {
            threadIdx = {t % b.x, (t / b.x) % b.y, t / (b.x * b.y)}; blockIdx = {x, y, z};
            g_bar = bars[x].get(); g_wbar = wbs[x]; g_xf = xf[x].data(); g_xl = xl[x].data();
            fn();
            if (--left[x] == 0) std::memset(g_csm[x], 0xff, EMU_SMEM); });
        for (auto& t : ts) t.join();
        for (auto& v : wbs) for (auto* p : v) delete p;
    }
}
"""


def _cluster_load(source: str, defines: dict[str, Any] | None = None, **kw: Any) -> Any:
    """``emu_load`` with the cluster emulation: ``__shared__`` arrays in the block's arena."""
    off = 0

    def arena(m: re.Match[str]) -> str:
        nonlocal off
        ctype, name, n = m.group(1), m.group(2), int(m.group(3))
        decl = f"{ctype} (&{name})[{n}] = *reinterpret_cast<{ctype}(*)[{n}]>(g_csm[blockIdx.x] + {off});"
        off += 16 * ((4 * n + 15) // 16)
        return decl

    source = re.sub(r"__shared__ (float) (\w+)\[(\d+)\];", arena, source)
    assert "__shared__" not in source.split("k0_rows(", 1)[1] and 0 < off <= 4096
    return emu_load(source, defines, **kw)


def _cluster_header() -> str:
    h = emu.EMU_H.replace(
        "#include <barrier>\n",
        "#include <barrier>\n#include <atomic>\n#include <chrono>\n#include <memory>\n#include <optional>\n",
    )
    for old, new in _CLUSTER_SUBS:
        assert old in h, old
        h = h.replace(old, new)
    start = h.index("static void emu_launch(")
    return h[:start] + _CLUSTER_LAUNCH


def test_clusters_of_two_blocks_loop_over_rows_with_one_barrier_each(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows of 8200 (two blocks of 4100, tails of 4 in the second) on one cluster looping over 24 rows: the
    partials' slots alternate by step, the last step's reads close on the exit barrier (a block leaving
    early poisons its shared memory), on the register path (KF_PER 9)."""
    monkeypatch.setattr(emu, "EMU_H", _cluster_header())
    problem = _norm_rows("level1/l2_norm.py", 24, 8200)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(24, 8200, generator=g) * torch.arange(1, 25).float()[:, None]  # rows of distinct norms
    x[5, 8199] = float("nan")
    loads = _Loads(_cluster_load)
    with torch.no_grad():
        got = _model(problem, monkeypatch, loads, rg=1)(x)
    assert [(d["KF_CL"], d["KF_PER"]) for d in loads.defines] == [(2, 9)]
    torch.testing.assert_close(got, _expected(problem, x), rtol=2e-6, atol=1e-7, equal_nan=True)
    assert got[5].isnan().all() and not got[[4, 6]].isnan().any()


@pytest.mark.parametrize("key", ["level1/l1_norm.py", "level1/l2_norm.py"])
def test_register_path_reads_the_row_once(key: str) -> None:
    """The consumer reads the registers, also where the reduced term is a function of the load (L1's
    ``fabsf(x)``, whose consumer divides the raw ``x``): under ``KF_PER > 0`` the row is loaded once."""
    problem = load_problem(DATA / key, {})
    recipe = cookbook_graph.recipe(OfflineGenerator().spec(problem.summary()), "cuda", "graph/fused_coop", 2)
    regs_path = recipe.kernel.split("#if KF_PER > 0")[1:]
    assert len(regs_path) == 2  # pass 1 and pass 2
    pass1, pass2 = (part.split("#else")[0] for part in regs_path)
    assert pass1.count("buf0[") == 1 and "buf0[" not in pass2 and "kf_v[u] / tot" in pass2
