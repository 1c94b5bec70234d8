"""Shared helpers of the EVAL tests: small shapes for the examples, a fast evaluation config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kfoundry.core.config import RunConfig, load_config

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
BAD = Path(__file__).resolve().parent / "data" / "bad"

#: Shape overrides that make every example evaluate in about a second on PoCL.
SMALL_SHAPES: dict[str, dict[str, int]] = {
    "vector_add": {"N": 4096},
    "softmax": {"batch_size": 8, "dim": 520},
    "layer_norm": {"batch_size": 8, "features": 512},
    "rms_norm": {"batch_size": 8, "features": 512},
    "gelu": {"N": 4096},
    "matmul": {"M": 40, "K": 48, "N": 36},
    "sum_reduction": {"batch_size": 2, "dim1": 32, "dim2": 24},
    "depthwise_conv2d": {"batch_size": 1, "channels": 4, "height": 16, "width": 12},
    "rotary_embedding": {"batch_size": 1, "seq_len": 16, "heads": 2, "head_dim": 16},
}


def fast_config(tmp: Path | None = None, backend: str | None = None, **evaluation: Any) -> RunConfig:
    """A config whose timing phase takes milliseconds (correctness checks stay complete); ``backend``
    names the backend plugin (default: the config's, OpenCL)."""
    ev = {
        "target_time_s": 0.005,
        "warmup_s": 0.0,
        "min_repeats": 3,
        "max_repeats": 20,
        "rotate_bytes": 0,
        "timeout_s": 60.0,
        # the required and structured trials only (boundary shapes, extreme values...), no extra ones
        "correctness_budget_s": 0.0,
    }
    ev.update(evaluation)
    data: dict[str, Any] = {"evaluation": ev}
    if tmp is not None:
        data["output_dir"] = str(tmp)
    if backend is not None:
        data["backend"] = {"name": backend}
    return load_config(data=data, validate_plugins=False)


#: ``--set`` overrides that make a loop test's evaluations take milliseconds (trials stay real).
LOOP_FAST_EVAL = [
    "evaluation.trials=2",
    "evaluation.target_time_s=0.02",
    "evaluation.warmup_s=0.0",
    "evaluation.min_repeats=3",
    "evaluation.max_repeats=10",
    "evaluation.rotate_bytes=0",
    "evaluation.timeout_s=60",
]
