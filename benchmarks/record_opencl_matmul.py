"""Record the full tuning space of a tiled OpenCL matrix multiply on the local OpenCL device (PoCL).

Writes a Kernel Tuner cache file (append-only: a killed recording resumes where it stopped):

    python benchmarks/record_opencl_matmul.py --out benchmarks/spaces/opencl_matmul_pocl.json

Each configuration is compiled, checked against numpy and timed (median-free: Kernel Tuner's ``time``
is the mean of ``times``; we store the median as ``time``, which the tuner benchmark uses).
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyopencl as cl

from kfoundry.core.models import DeviceProfile
from kfoundry.core.recorded import CacheWriter
from kfoundry.core.space import ParamSpace

KERNEL = r"""
#define TSN (BLOCK_SIZE_X * TILE_SIZE_X)
#define TSM (BLOCK_SIZE_Y * TILE_SIZE_Y)
#define NT (BLOCK_SIZE_X * BLOCK_SIZE_Y)

__kernel __attribute__((reqd_work_group_size(BLOCK_SIZE_X, BLOCK_SIZE_Y, 1)))
void matmul(__global const float* restrict A, __global const float* restrict B,
            __global float* restrict C, const int M, const int N, const int K) {
    const int tx = get_local_id(0);
    const int ty = get_local_id(1);
    const int col0 = get_group_id(0) * TSN + tx;
    const int row0 = get_group_id(1) * TSM + ty;
    float acc[TILE_SIZE_Y][TILE_SIZE_X];
    for (int i = 0; i < TILE_SIZE_Y; i++)
        for (int j = 0; j < TILE_SIZE_X; j++)
            acc[i][j] = 0.0f;
#if LOCAL_TILE_K > 0
    __local float As[TSM][LOCAL_TILE_K];
    __local float Bs[LOCAL_TILE_K][TSN];
    const int lid = ty * BLOCK_SIZE_X + tx;
    for (int k0 = 0; k0 < K; k0 += LOCAL_TILE_K) {
        for (int e = lid; e < TSM * LOCAL_TILE_K; e += NT) {
            const int r = e / LOCAL_TILE_K, c = e % LOCAL_TILE_K;
            As[r][c] = A[(get_group_id(1) * TSM + r) * K + k0 + c];
        }
        for (int e = lid; e < LOCAL_TILE_K * TSN; e += NT) {
            const int r = e / TSN, c = e % TSN;
            Bs[r][c] = B[(k0 + r) * N + get_group_id(0) * TSN + c];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int k = 0; k < LOCAL_TILE_K; k++) {
            float b[TILE_SIZE_X];
            for (int j = 0; j < TILE_SIZE_X; j++) b[j] = Bs[k][tx + j * BLOCK_SIZE_X];
            for (int i = 0; i < TILE_SIZE_Y; i++) {
                const float a = As[ty + i * BLOCK_SIZE_Y][k];
                for (int j = 0; j < TILE_SIZE_X; j++) acc[i][j] = fma(a, b[j], acc[i][j]);
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
#else
    for (int k = 0; k < K; k++) {
        float b[TILE_SIZE_X];
        for (int j = 0; j < TILE_SIZE_X; j++) b[j] = B[k * N + col0 + j * BLOCK_SIZE_X];
        for (int i = 0; i < TILE_SIZE_Y; i++) {
            const float a = A[(row0 + i * BLOCK_SIZE_Y) * K + k];
            for (int j = 0; j < TILE_SIZE_X; j++) acc[i][j] = fma(a, b[j], acc[i][j]);
        }
    }
#endif
    for (int i = 0; i < TILE_SIZE_Y; i++)
        for (int j = 0; j < TILE_SIZE_X; j++)
            C[(row0 + i * BLOCK_SIZE_Y) * N + col0 + j * BLOCK_SIZE_X] = acc[i][j];
}
"""

TUNE_PARAMS: dict[str, list[int]] = {
    "BLOCK_SIZE_X": [4, 8, 16, 32],
    "BLOCK_SIZE_Y": [1, 2, 4, 8, 16],
    "TILE_SIZE_X": [1, 2, 4, 8],
    "TILE_SIZE_Y": [1, 2, 4, 8],
    "LOCAL_TILE_K": [0, 8, 16, 32],
}
RESTRICTIONS = [
    "BLOCK_SIZE_X * BLOCK_SIZE_Y >= 16",
    "TILE_SIZE_X * TILE_SIZE_Y <= 32",
    "M % (BLOCK_SIZE_Y * TILE_SIZE_Y) == 0 and N % (BLOCK_SIZE_X * TILE_SIZE_X) == 0",
]


def _time_config(
    ctx: cl.Context, queue: cl.CommandQueue, params: dict[str, int], size: int, bufs: tuple, ref: np.ndarray
) -> dict[str, object]:
    a_buf, b_buf, c_buf = bufs
    defines = " ".join(f"-D{k}={v}" for k, v in params.items())
    t0 = time.perf_counter()
    try:
        program = cl.Program(ctx, KERNEL).build(options=defines)
        kernel = program.matmul
    except cl.Error:
        return {"time": "CompilationFailedConfig", "compile_time": 1000 * (time.perf_counter() - t0)}
    gsize = (size // params["TILE_SIZE_X"], size // params["TILE_SIZE_Y"])
    lsize = (params["BLOCK_SIZE_X"], params["BLOCK_SIZE_Y"])
    args = (a_buf, b_buf, c_buf, np.int32(size), np.int32(size), np.int32(size))
    try:
        kernel(queue, gsize, lsize, *args).wait()  # PoCL specialises for the local size here
    except cl.Error:
        return {"time": "RuntimeFailedConfig", "compile_time": 1000 * (time.perf_counter() - t0)}
    compile_ms = 1000 * (time.perf_counter() - t0)
    t1 = time.perf_counter()
    out = np.empty_like(ref)
    cl.enqueue_copy(queue, out, c_buf).wait()
    if not np.allclose(out, ref, rtol=1e-3, atol=1e-3):
        return {"time": "RuntimeFailedConfig", "compile_time": compile_ms}
    verify_ms = 1000 * (time.perf_counter() - t1)
    t2 = time.perf_counter()
    times: list[float] = []
    while len(times) < 7 or (sum(times) < 300 and len(times) < 30):
        s = time.perf_counter()
        kernel(queue, gsize, lsize, *args).wait()
        times.append(1000 * (time.perf_counter() - s))
    return {
        "time": statistics.median(times),
        "times": times,
        "compile_time": compile_ms,
        "verification_time": verify_ms,
        "benchmark_time": 1000 * (time.perf_counter() - t2),
        "framework_time": 0.0,
        "strategy_time": 0.0,
    }


@dataclass
class Recording:
    """What recording the matmul space needs on this OpenCL device: context, queue, the valid space,
    the inputs and reference on the device, and the Kernel Tuner cache file being written."""

    ctx: Any
    queue: Any
    space: ParamSpace
    bufs: tuple[Any, Any, Any]
    ref: np.ndarray
    writer: CacheWriter
    size: int

    def time(self, config: dict[str, Any]) -> dict[str, Any]:
        return _time_config(self.ctx, self.queue, config, self.size, self.bufs, self.ref)


def start_recording(out: str, size: int, space_size: int | None = None) -> Recording:
    """Open the device, build the space (valid at ``space_size``, default ``size``) and the cache writer."""
    ctx = cl.create_some_context(interactive=False)
    device = ctx.devices[0]
    queue = cl.CommandQueue(ctx)
    at = space_size or size
    space = ParamSpace(
        TUNE_PARAMS,
        restrictions=RESTRICTIONS,
        constants={"M": at, "N": at},
        block=("BLOCK_SIZE_X", "BLOCK_SIZE_Y"),
        local_mem_expr="4 * (BLOCK_SIZE_Y * TILE_SIZE_Y + BLOCK_SIZE_X * TILE_SIZE_X) * LOCAL_TILE_K",
    ).for_device(
        DeviceProfile(
            backend="opencl",
            name=device.name,
            max_work_group_size=device.max_work_group_size,
            max_work_item_sizes=list(device.max_work_item_sizes),
            local_mem_bytes=device.local_mem_size,
        )
    )
    rng = np.random.default_rng(0)
    a = rng.random((size, size), dtype=np.float32) - 0.5
    b = rng.random((size, size), dtype=np.float32) - 0.5
    ref = a @ b
    mf = cl.mem_flags
    bufs = (
        cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=a),
        cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=b),
        cl.Buffer(ctx, mf.WRITE_ONLY, ref.nbytes),
    )
    writer = CacheWriter(
        Path(out),
        device_name=f"{device.platform.name}: {device.name}".strip(),
        kernel_name="matmul",
        problem_size=[size, size, size],
        tune_params=TUNE_PARAMS,
    )
    return Recording(ctx, queue, space, bufs, ref, writer, size)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/spaces/opencl_matmul_pocl.json")
    parser.add_argument("--size", type=int, default=256, help="M = N = K")
    parser.add_argument("--limit", type=int, default=0, help="record at most this many (0: all)")
    args = parser.parse_args()
    rec = start_recording(args.out, args.size)
    space, writer = rec.space, rec.writer
    configs = [c for c in space.configs() if not writer.has(c)]
    if args.limit:
        configs = configs[: args.limit]
    print(f"{space.size} valid configurations, {len(configs)} to record")
    start = time.perf_counter()
    for i, config in enumerate(configs, 1):
        writer.add(config, rec.time(config))
        if i % 25 == 0 or i == len(configs):
            print(f"{i}/{len(configs)} recorded, {time.perf_counter() - start:.0f} s")
    writer.close()


if __name__ == "__main__":
    main()
