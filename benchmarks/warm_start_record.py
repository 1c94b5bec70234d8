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

sys.path.insert(0, str(Path(__file__).parent))
from record_opencl_matmul import start_recording  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--size", type=int, default=256, help="M = N = K")
    parser.add_argument(
        "--sample", type=int, default=300, help="configurations (the same seeded sample at every size)"
    )
    args = parser.parse_args()
    # the space is the smallest recorded size's (128): the same seeded sample is valid at every size
    rec = start_recording(args.out, args.size, space_size=128)
    space, writer = rec.space, rec.writer
    keys = space.keys
    picked = sorted(
        np.random.default_rng(12).choice(len(keys), size=min(args.sample, len(keys)), replace=False)
    )
    configs = [c for c in (space.config(keys[int(i)]) for i in picked) if not writer.has(c)]
    print(f"{len(picked)} sampled of {space.size} valid configurations, {len(configs)} to record", flush=True)
    start = time.perf_counter()
    for i, config in enumerate(configs, 1):
        writer.add(config, rec.time(config))
        if i % 25 == 0 or i == len(configs):
            print(f"{i}/{len(configs)} recorded, {time.perf_counter() - start:.0f} s", flush=True)
    writer.close()


if __name__ == "__main__":
    main()
