"""Compile latency per candidate: NVRTC (the CUDA backend's default), nvcc, and load_inline.

For each CUDA example candidate (examples/kernelbench/cuda/*_cuda.py) its kernel source is compiled
``--repeats`` times by NVRTC and by nvcc (cubin for the device's architecture, ptxas report on);
with a GPU, loading the cubin (cuModuleLoadData) is timed too. The load_inline candidate
(gelu_load_inline.py) is built ``--inline`` times under fresh extension names (no build cache), as
KernelBench-style harnesses do. Prints a table of medians (seconds).

    python benchmarks/cuda_compile_latency.py [--repeats 5] [--inline 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CANDIDATES = ROOT / "examples/kernelbench/cuda"

#: Defines the lazily compiled candidates use at the benchmark sizes (others compile with none).
DEFINES: dict[str, dict[str, int]] = {
    "softmax": {"COLS": 65536, "CLUSTER": 4, "BLOCK": 512},
    "rms_norm": {"COLS": 16384, "CLUSTER": 1, "BLOCK": 512},
    "layer_norm": {"BLOCK": 512, "CHUNK": 16384, "VEC": 4},
    "depthwise_conv2d": {"KS": 3},
    "matmul_tuned": {"BM": 128, "BN": 128, "BK": 16, "TM": 8, "TN": 8, "PAD": 0},
}


def kernel_source(path: Path) -> str:
    """The module-level ``SRC`` of a candidate file (executed with a stub ``load``)."""
    text = (
        path.read_text()
        .replace("from kfoundry.runtime import cdiv, load", "")
        .replace("from kfoundry.runtime import load", "")
    )
    namespace: dict[str, Any] = {}
    exec(compile(text.split("\nclass ModelNew")[0], str(path), "exec"), namespace)
    return str(namespace["SRC"])


def time_compiles(
    source: str, defines: dict[str, int], compiler: str, repeats: int, can_run: bool
) -> dict[str, Any]:
    from kfoundry.plugins.backends.cuda import CudaBackend, CudaOptions

    backend = CudaBackend(CudaOptions(compiler=compiler))  # type: ignore[arg-type]
    compile_s, load_s, kernels, reported = [], [], 0, []
    for _ in range(repeats):
        salt = uuid.uuid4().hex
        unique = f"{source}\n__device__ int kf_salt_{salt} = 1;\n"  # new code each time: no cache can answer
        started = time.perf_counter()
        result = backend.compile(unique, defines=defines)
        compile_s.append(time.perf_counter() - started)
        kernels = len(result.resources)
        reported.append(kernels)
        if can_run:
            started = time.perf_counter()
            backend.load_compiled(result)
            load_s.append(time.perf_counter() - started)
    return {
        "compile_s": statistics.median(compile_s),
        "runs_s": [round(t, 4) for t in compile_s],
        "kernels_reported_per_run": reported,
        "load_s": statistics.median(load_s) if load_s else None,
        "kernels": kernels,
        "arch": result.arch,
    }


def time_load_inline(repeats: int) -> dict[str, Any]:
    """Median wall time of building the load_inline GELU extension under fresh names."""
    import torch.utils.cpp_extension as ext

    text = (CANDIDATES / "gelu_load_inline.py").read_text()
    namespace: dict[str, Any] = {}
    exec(compile(text.split("\nclass ModelNew")[0], "gelu_load_inline.py", "exec"), namespace)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        ext.load_inline(
            name=f"kf_gelu_{uuid.uuid4().hex[:8]}",
            cpp_sources=namespace["CPP_SRC"],
            cuda_sources=namespace["CUDA_SRC"],
            functions=["gelu_forward"],
            extra_cuda_cflags=["-O3", "-gencode=arch=compute_90,code=sm_90"],
            verbose=False,
        )
        times.append(time.perf_counter() - started)
    return {"runs_s": [round(t, 2) for t in times], "median_s": statistics.median(times)}


def main() -> None:
    from kfoundry.plugins.backends.cuda_compile import nvcc_version, nvrtc_available
    from kfoundry.plugins.backends.cuda_launch import driver_device_count

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--inline", type=int, default=2, help="load_inline builds (0: skip)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    can_run = driver_device_count()[0] > 0
    compilers = [c for c, ok in (("nvrtc", nvrtc_available()[0]), ("nvcc", nvcc_version() is not None)) if ok]
    rows = []
    for path in sorted(CANDIDATES.glob("*_cuda.py")):
        name = path.stem.removesuffix("_cuda")
        source = kernel_source(path)
        row: dict[str, Any] = {"candidate": name}
        for compiler in compilers:
            try:
                row[compiler] = time_compiles(source, DEFINES.get(name, {}), compiler, args.repeats, can_run)
            except Exception as exc:  # record and go on: one broken compile must not hide the others
                row[compiler] = {
                    "error": ascii(f"{type(exc).__name__}: {exc}")[:300],
                    "compile_s": float("nan"),
                    "load_s": None,
                    "kernels": 0,
                }
        rows.append(row)
        print(json.dumps(row), flush=True)
    summary: dict[str, Any] = {"rows": rows}
    for compiler in compilers:
        ok = [r[compiler]["compile_s"] for r in rows if "error" not in r[compiler]]
        summary[f"median_{compiler}_s"] = statistics.median(ok) if ok else float("nan")
    if args.inline:
        summary["load_inline"] = time_load_inline(args.inline)
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1))
    print(
        f"\n{'candidate':18} {'kernels':>7} "
        + " ".join(f"{c + ' s':>9}" for c in compilers)
        + f" {'load s':>8}"
    )
    for r in rows:
        first = r[compilers[0]]
        load = f"{first['load_s']:8.4f}" if first["load_s"] is not None else f"{'-':>8}"
        print(
            f"{r['candidate']:18} {first['kernels']:7d} "
            + " ".join(f"{r[c]['compile_s']:9.3f}" for c in compilers)
            + f" {load}"
        )
    print("median  " + "  ".join(f"{c}: {summary[f'median_{c}_s']:.3f} s" for c in compilers))
    if "load_inline" in summary:
        print(
            f"load_inline (fresh builds): median {summary['load_inline']['median_s']:.1f} s, runs {summary['load_inline']['runs_s']}"
        )


if __name__ == "__main__":
    main()
