"""``<family>/onchip_split`` (cookbook_rows_onchip): the chunked rows whose blocks wait for each other.

The blocks of a row spin on an arrival counter, so the one-block-at-a-time CPU emulation of
tests/test_offline_cuda_emulated.py would hang. :data:`EMU_H` here runs blocks *concurrently*, as a GPU
does, with at most ``resident`` of them at once, started in grid order as each earlier one finishes (a
GPU's block scheduler): a block's threads are ``std::thread`` s, ``__syncthreads`` its own
``std::barrier``, its ``__shared__`` arrays live in its own arena (the kernel source's declarations are
rewritten to references into it). With ``resident`` = K (the blocks of one row) the ticket argument of the
module doc is what keeps the run from deadlocking. The same kernels compile with NVRTC for sm_90 at the
full KernelBench sizes (registers within the ``__launch_bounds__`` cap).
"""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import kfoundry.runtime as runtime
from kfoundry.core.problem import load_problem
from kfoundry.plugins.llms.offline import cookbook_rows_onchip as onchip
from kfoundry.plugins.llms.offline.generator import OfflineGenerator

#: slow tier (its CPU emulator's first g++ build takes ~45 s): the default run stays well under 20 minutes on 2 cores
pytestmark = pytest.mark.slow

DATA = Path(__file__).resolve().parent / "data" / "kernelbench"

EMU_H = r"""// CPU emulation, blocks concurrent (at most emu_resident at once, started in grid order)
#include <atomic>
#include <barrier>
#include <semaphore>
#include <thread>
#include <vector>
#include <math.h>
#include <cmath>
#include <cstring>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <algorithm>
#include <memory>
using std::min; using std::max;
struct dim3 { unsigned x = 1, y = 1, z = 1; };
struct float4 { float x, y, z, w; };
static inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
struct EmuBlock {
    std::barrier<>* bar;
    std::vector<std::unique_ptr<std::barrier<>>> wbar;
    float xf[1024];
    alignas(16) unsigned char sh[64 * 1024];
    alignas(16) unsigned char dyn[256 * 1024];
};
thread_local dim3 threadIdx, blockIdx;
thread_local EmuBlock* emu_blk = nullptr;
static dim3 blockDim, gridDim;
static int emu_resident = 1;
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__
#define __launch_bounds__(...)
#define __syncthreads() emu_blk->bar->arrive_and_wait()
#define __threadfence() std::atomic_thread_fence(std::memory_order_seq_cst)
#define __nanosleep(n) std::this_thread::yield()
static inline int emu_tid() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }
template <class T> static inline T __ldg(const T* p) { return *p; }
template <class T> static inline T __ldcs(const T* p) { return *p; }
template <class T> static inline T __ldcg(const T* p) { return *p; }
template <class T> static inline void __stcs(T* p, T v) { *p = v; }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline float __shfl_xor_sync(unsigned, float v, int o) {
    int t = emu_tid(), w = t >> 5;
    emu_blk->wbar[w]->arrive_and_wait(); emu_blk->xf[t] = v; emu_blk->wbar[w]->arrive_and_wait();
    return emu_blk->xf[(w << 5) + (((t & 31) ^ o) & 31)];
}
static inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
static void emu_launch(dim3 g, dim3 b, const std::function<void()>& fn) {
    gridDim = g; blockDim = b;
    const unsigned n = b.x * b.y * b.z;
    std::counting_semaphore<1 << 20> slots(emu_resident);
    std::vector<std::thread> blocks;
    for (unsigned z = 0; z < g.z; ++z) for (unsigned y = 0; y < g.y; ++y) for (unsigned x = 0; x < g.x; ++x) {
        slots.acquire();  // a block starts once a slot is free, in grid order
        blocks.emplace_back([=, &fn, &slots] {
            auto blk = std::make_unique<EmuBlock>();
            std::barrier<> bar(n); blk->bar = &bar;
            for (unsigned w = 0; w < (n + 31) / 32; ++w) blk->wbar.emplace_back(new std::barrier<>(std::min(32u, n - 32 * w)));
            std::vector<std::thread> ts;
            EmuBlock* p = blk.get();
            for (unsigned t = 0; t < n; ++t) ts.emplace_back([=, &fn] {
                emu_blk = p; threadIdx = {t % b.x, (t / b.x) % b.y, t / (b.x * b.y)}; blockIdx = {x, y, z}; fn(); });
            for (auto& t : ts) t.join();
            slots.release();
        });
    }
    for (auto& t : blocks) t.join();
}
extern "C" void emu_set_resident(int n) { emu_resident = n; }
"""

_SIG = re.compile(
    r'extern "C" __global__ void(?:\s+__launch_bounds__\([^)]*\))?\s+(\w+)\s*\(([^)]*)\)',
    re.S,
)
_CTYPES = {"ptr": ctypes.c_void_p, "f": ctypes.c_float, "i": ctypes.c_int}
_CDECL = {"ptr": "void*", "f": "float", "i": "int"}


def _kind(param: str) -> str:
    p = param.strip()
    return "ptr" if "*" in p else "f" if p.startswith("float") else "i"


class _Module:
    """A compiled emulation: ``module.<kernel>(*args, grid=, block=, shared_mem=)`` as the runtime's."""

    def __init__(
        self, lib: ctypes.CDLL, kernels: dict[str, list[str]], log: list[str], resident: int
    ) -> None:
        self.lib, self.kernels, self.log, self.resident = lib, kernels, log, resident

    def __getattr__(self, name: str) -> Callable[..., None]:
        kinds = self.kernels[name]
        fn = getattr(self.lib, "launch_" + name)
        fn.argtypes = [ctypes.c_uint] * 6 + [_CTYPES[k] for k in kinds]

        def call(
            *args: Any, grid: tuple[int, ...] = (1,), block: tuple[int, ...] = (1,), shared_mem: int = 0
        ) -> None:
            assert shared_mem <= 256 * 1024
            g = tuple(grid) + (1,) * (3 - len(grid))
            b = tuple(block) + (1,) * (3 - len(block))
            conv = [
                a.data_ptr() if isinstance(a, torch.Tensor) else float(a) if k == "f" else int(a)
                for a, k in zip(args, kinds, strict=True)
            ]
            self.log.append(name)
            self.lib.emu_set_resident(self.resident)
            fn(*[int(v) for v in g], *[int(v) for v in b], *conv)

        return call


def _shared_to_arena(source: str) -> str:
    """Every ``__shared__`` declaration as a reference into the running block's arena (4 KB slots)."""
    slot = iter(range(16))

    def static(m: re.Match[str]) -> str:
        t, name, dims = m.group(1), m.group(2), m.group(3) or ""
        s = next(slot)
        if dims:
            return f"{t} (&{name}){dims} = *reinterpret_cast<{t}(*){dims}>(emu_blk->sh + {s} * 4096);"
        return f"{t}& {name} = *reinterpret_cast<{t}*>(emu_blk->sh + {s} * 4096);"

    source = re.sub(
        r"extern __shared__ (\w+) (\w+)\[\];", r"\1* \2 = reinterpret_cast<\1*>(emu_blk->dyn);", source
    )
    return re.sub(r"__shared__ (\w+) (\w+)(\[\d+\])?;", static, source)


def emu_loader(log: list[str], resident: int) -> Callable[..., _Module]:
    def load(
        source: str, defines: dict[str, Any] | None = None, build_options: list[str] | None = None
    ) -> _Module:
        defs = "".join(f"#define {k} {int(v)}\n" for k, v in (defines or {}).items())
        kernels: dict[str, list[str]] = {}
        wrappers = []
        for m in _SIG.finditer(source):
            name, params = m.group(1), [p for p in m.group(2).split(",") if p.strip()]
            kinds = [_kind(p) for p in params]
            kernels[name] = kinds
            decl = "".join(f", {_CDECL[k]} a{i}" for i, k in enumerate(kinds))
            cast = ", ".join(
                f"({p.strip().rsplit(' ', 1)[0]})a{i}" if k == "ptr" else f"a{i}"
                for i, (p, k) in enumerate(zip(params, kinds, strict=True))
            )
            wrappers.append(
                f'extern "C" void launch_{name}(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, '
                f"unsigned bz{decl}) {{ emu_launch({{gx, gy, gz}}, {{bx, by, bz}}, [=]() {{ {name}({cast}); }}); }}"
            )
        full = EMU_H + defs + _shared_to_arena(source) + "\n" + "\n".join(wrappers) + "\n"
        cache = Path(tempfile.gettempdir()) / "kfoundry_cuda_emu_concurrent"
        cache.mkdir(exist_ok=True)
        key = hashlib.sha1(full.encode()).hexdigest()[:16]
        so = cache / f"{key}.so"
        if not so.exists():
            cpp = cache / f"{key}.cpp"
            cpp.write_text(full)
            tmp = cache / f"{key}.{id(log)}.so"
            cmd = ["g++", "-std=c++20", "-O1", "-shared", "-fPIC", "-pthread", "-o", str(tmp), str(cpp)]
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            assert proc.returncode == 0, proc.stderr[-3000:]
            tmp.rename(so)
        return _Module(ctypes.CDLL(str(so)), kernels, log, resident)

    return load


def _spec(key: str, shape: Any) -> Any:
    problem = load_problem(DATA / key, shape)
    return problem, OfflineGenerator().spec(problem.summary())


#: (problem, shape, parameters, SMs, resident blocks, the kernel expected): chunks of BLOCK * (V + S)
#: float4 = 128 float4 here (MINB 1), so K chunks per row with a shorter last one; SMs * MINB = K is the
#: tightest bound the recipe accepts, run with exactly K blocks resident.
CASES = [
    # 2000 = 500 float4: K 4, the last chunk 116 float4; registers and shared memory (V 2, S 2)
    ("level1/softmax_rows.py", {"batch_size": 5, "dim": 2000}, {"V": 2, "S": 2}, 4, 4, "rows"),
    # 2001: not a multiple of 4, the scalar loads; the last float4 slot partial
    ("level1/log_softmax_rows.py", {"batch_size": 3, "dim": 2001}, {"V": 2, "S": 2}, 4, 4, "rows"),
    # registers only (S 0), streaming hints off
    ("level1/softmax_rows.py", {"batch_size": 3, "dim": 1540}, {"V": 4, "S": 0, "HINT": 0}, 4, 4, "rows"),
    # layer norm over 4 x 16 x 33 = 2112 (K 5, the last chunk 16 float4) with random weight and bias
    (
        "level1/layer_norm_4d.py",
        {"batch_size": 3, "features": 4, "dim1": 16, "dim2": 33},
        {"V": 2, "S": 2},
        5,
        5,
        "rows",
    ),
    # more resident than one row: rows overlap (2 SMs x MINB 4)
    (
        "level1/layer_norm_module.py",
        {"batch_size": 4, "features": 3, "dim1": 9, "dim2": 27},
        {"V": 1, "S": 3, "MINB": 4},
        2,
        8,
        "rows",
    ),
    # layer norm rows of 3 x 5 x 7 = 105: not a multiple of 4, scalar loads and the weight's scalar path
    (
        "level1/layer_norm_4d.py",
        {"batch_size": 2, "features": 3, "dim1": 5, "dim2": 7},
        {"V": 1, "S": 1},
        1,
        1,
        "rows",
    ),
    # K 4 > 1 SM x MINB 1: the recipe falls back to the block-per-row kernel
    ("level1/softmax_rows.py", {"batch_size": 3, "dim": 2000}, {"V": 2, "S": 2}, 1, 1, "rows_plain"),
]


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
@pytest.mark.parametrize(("key", "shape", "params", "sms", "resident", "kernel"), CASES)
def test_onchip_split_matches_eager_on_the_concurrent_emulation(
    key: str,
    shape: dict[str, int],
    params: dict[str, int],
    sms: int,
    resident: int,
    kernel: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log: list[str] = []
    monkeypatch.setattr(runtime, "load", emu_loader(log, resident))
    monkeypatch.setattr(onchip, "MIN_ROW4", 16)
    problem, spec = _spec(key, shape)
    recipe = onchip.onchip_split(spec)
    assert recipe is not None
    source = recipe.render().replace("\n_ONCHIP_SMS = 132\n", f"\n_ONCHIP_SMS = {sms}\n")
    namespace: dict[str, Any] = {
        "PARAMS": {**recipe.defaults, "BLOCK": 32, "MINB": 1, **params},
        "__name__": "kf_candidate",
    }
    exec(compile(source, recipe.name, "exec"), namespace)
    torch.manual_seed(0)
    reference = problem.make_reference()
    model = namespace["ModelNew"](*problem.make_init_inputs())
    if spec.affine:  # weight and bias that are not ones and zeros, the same in both
        ln = next(m for m in reference.modules() if isinstance(m, torch.nn.LayerNorm))
        with torch.no_grad():
            ln.weight.copy_(torch.randn_like(ln.weight))
            ln.bias.copy_(torch.randn_like(ln.bias))
            model.m0.weight.copy_(ln.weight)
            model.m0.bias.copy_(ln.bias)
    x = problem.make_inputs(1)[0] * 4.0 - 2.0
    with torch.no_grad():
        expected = reference.double()(x.double())
        got = model(x)
    assert log == [kernel]
    assert got.shape == expected.shape
    torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
def test_onchip_split_unaligned_input_takes_the_scalar_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    """A row length that is a multiple of 4 but data that is not 16-byte aligned: the scalar path."""
    log: list[str] = []
    monkeypatch.setattr(runtime, "load", emu_loader(log, 4))
    monkeypatch.setattr(onchip, "MIN_ROW4", 16)
    problem, spec = _spec("level1/softmax_rows.py", {"batch_size": 2, "dim": 1200})
    recipe = onchip.onchip_split(spec)
    assert recipe is not None
    namespace: dict[str, Any] = {
        "PARAMS": {**recipe.defaults, "BLOCK": 32, "MINB": 1, "V": 2, "S": 1},
        "__name__": "kf_candidate",
    }
    # 300 float4 in chunks of 96: K 4, the resident bound 4 SMs x MINB 1, run with 4 resident
    source = recipe.render().replace("\n_ONCHIP_SMS = 132\n", "\n_ONCHIP_SMS = 4\n")
    exec(compile(source, recipe.name, "exec"), namespace)
    model = namespace["ModelNew"]()
    torch.manual_seed(1)
    x = (torch.randn(2 * 1200 + 1) * 3.0)[1:].view(2, 1200)
    assert x.data_ptr() % 16 != 0
    with torch.no_grad():
        got = model(x)
    assert log == ["rows"]
    torch.testing.assert_close(got.double(), torch.softmax(x.double(), dim=1), rtol=1e-4, atol=1e-6)


def test_onchip_split_refuses_what_it_does_not_handle() -> None:
    _, spec = _spec("level1/softmax_rows.py", None)
    assert onchip.onchip_split(spec) is not None
    _, short = _spec("level1/softmax_rows.py", {"batch_size": 3, "dim": 1000})
    assert onchip.onchip_split(short) is None  # short rows: the block- and cluster-per-row recipes
    _, strided = _spec("level1/rms_norm_dim1.py", None)
    assert strided.inner != 1 and onchip.onchip_split(strided) is None
    # rows whose chunks would not all be resident (2^29 elements: 32768 chunks of 2048 float4 > 528)
    assert onchip.onchip_split(dataclasses.replace(spec, R=1 << 29)) is None
    assert onchip.onchip_split(dataclasses.replace(spec, R=(1 << 31) - 1)) is None
    _, reduce = _spec("level1/mean_dim1.py", None)
    assert onchip.onchip_split(reduce) is None
    assert onchip.recipes(spec, "opencl") == []


def test_onchip_split_is_64_bit_safe_and_left_alone_by_the_widening() -> None:
    index_width = pytest.importorskip("kfoundry.plugins.llms.offline.index_width")
    adapt, wide_needed = index_width.adapt, index_width.wide_needed
    _, spec = _spec("level1/softmax_rows.py", None)  # 4096 x 393216: twice it passes 2^31
    assert wide_needed(spec)
    recipe = onchip.onchip_split(spec)
    assert recipe is not None
    assert adapt([recipe], spec)[0].kernel == recipe.kernel  # "index64": not rewritten
    for offset in ("X + (size_t)row * (size_t)R", "Y + (size_t)row * (size_t)R", "(size_t)row * (size_t)K"):
        assert offset in recipe.kernel
    assert "outer * k < 2**31 - 1" in recipe.forward or "_onchip_ok" in recipe.forward


def test_onchip_split_is_among_the_cuda_recipes() -> None:
    for key in ("level1/softmax_rows.py", "level1/log_softmax_rows.py", "level1/layer_norm_4d.py"):
        problem, spec = _spec(key, None)
        names = [r.name for r in OfflineGenerator().recipes(problem.summary(), "cuda")]
        assert f"{spec.family}/onchip_split" in names, names


def _nvrtc() -> bool:
    try:
        from kfoundry.plugins.backends.cuda_compile import nvrtc_available

        return bool(nvrtc_available()[0])
    except Exception:  # noqa: BLE001 - no cuda extra
        return False


@pytest.mark.skipif(not _nvrtc(), reason="NVRTC not installed (pip install 'kfoundry[cuda]')")
@pytest.mark.parametrize("key", ["level1/softmax_rows.py", "level1/layer_norm_module.py"])
def test_onchip_split_compiles_for_sm90_within_its_register_cap(key: str) -> None:
    from kfoundry.plugins.backends.cuda_compile import compile_nvrtc

    _, spec = _spec(key, None)
    recipe = onchip.onchip_split(spec)
    assert recipe is not None
    p = recipe.defaults
    res = compile_nvrtc(recipe.kernel, "sm_90", [f"-D{k}={v}" for k, v in p.items()])
    rows = res.resources["rows"]
    assert rows["registers"] * int(p["BLOCK"]) * int(p["MINB"]) <= 65536
    assert rows["spill_stores"] <= 16, rows  # the 64-register cap may spill a word or two, not the cache
    assert "createpolicy" in res.ptx or not spec.affine  # layer norm's weight and bias: evict-last
