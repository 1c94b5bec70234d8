"""Record a sample of the tiled OpenCL matmul space at one size on this machine's OpenCL device.

The warm-start benchmark (``benchmarks/warm_start.py``) needs the same kernel recorded at several
sizes and on more than one device. A full recording (1020 configurations) takes ~30 min on a 2-core
PoCL host, so this records the same seeded sample of the space at every size (a sample is a valid
replay space: the recorded configurations that did not fail)::

    python benchmarks/warm_start_record.py --size 128 --sample 300 \
        --out benchmarks/spaces/warm_start/opencl_matmul_xeon_128.json

Kernel, space and timing are ``benchmarks/record_opencl_matmul.py``'s (imported, not copied).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pyopencl as cl

sys.path.insert(0, str(Path(__file__).parent))
from record_opencl_matmul import RESTRICTIONS, TUNE_PARAMS, _time_config  # noqa: E402

from kfoundry.core.models import DeviceProfile  # noqa: E402
from kfoundry.core.recorded import CacheWriter  # noqa: E402
from kfoundry.core.space import ParamSpace  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--size", type=int, default=256, help="M = N = K")
    parser.add_argument(
        "--sample", type=int, default=300, help="configurations (the same seeded sample at every size)"
    )
    args = parser.parse_args()
    ctx = cl.create_some_context(interactive=False)
    device = ctx.devices[0]
    queue = cl.CommandQueue(ctx)
    size = args.size
    space = ParamSpace(
        TUNE_PARAMS,
        restrictions=RESTRICTIONS,
        constants={"M": 128, "N": 128},  # the smallest size recorded: the sample is valid at every size
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
    keys = space.keys
    picked = sorted(
        np.random.default_rng(12).choice(len(keys), size=min(args.sample, len(keys)), replace=False)
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
        Path(args.out),
        device_name=f"{device.platform.name}: {device.name}".strip(),
        kernel_name="matmul",
        problem_size=[size, size, size],
        tune_params=TUNE_PARAMS,
    )
    configs = [c for c in (space.config(keys[int(i)]) for i in picked) if not writer.has(c)]
    print(f"{len(picked)} sampled of {space.size} valid configurations, {len(configs)} to record", flush=True)
    start = time.perf_counter()
    for i, config in enumerate(configs, 1):
        writer.add(config, _time_config(ctx, queue, config, size, bufs, ref))
        if i % 25 == 0 or i == len(configs):
            print(f"{i}/{len(configs)} recorded, {time.perf_counter() - start:.0f} s", flush=True)
    writer.close()


if __name__ == "__main__":
    main()
