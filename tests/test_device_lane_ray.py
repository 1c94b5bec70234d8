"""Ray tasks ask for the custom resources of their kind: a job without a GPU for ``cpu_resources``
(it runs where a node offers them), and it gets the job back as usual (slow: starts Ray)."""

from __future__ import annotations

import importlib.util

import pytest
from eval_helpers import EXAMPLES, fast_config

from kfoundry.core.evaluation import EvalJob
from kfoundry.core.models import Candidate, Outcome

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed"),
]


def test_cpu_jobs_ask_for_their_custom_resource() -> None:
    import ray

    from kfoundry.plugins.executors.ray_executor import RayExecutor, RayOptions

    if ray.is_initialized():
        ray.shutdown()
    ray.init(
        address="local", num_cpus=2, resources={"kf_compile": 1}, include_dashboard=False, log_to_driver=False
    )
    try:
        job = EvalJob(
            problem_path=str(EXAMPLES / "kernelbench" / "vector_add.py"),
            shapes={"N": 256},
            candidate=Candidate(
                source=(EXAMPLES / "kernelbench" / "seeds" / "vector_add_opencl.py").read_text()
            ),
            evaluation=fast_config(trials=1).evaluation,
            backend_plugin="opencl",
        )
        ok = RayExecutor(RayOptions(cpu_resources={"kf_compile": 1})).run([job])[0]
        assert ok.outcome is Outcome.correct, ok.message
        # a resource no node has: the task is never scheduled and times out instead of running anywhere
        never = RayExecutor(RayOptions(cpu_resources={"kf_nowhere": 1}, task_timeout_s=5)).run([job])[0]
        assert never.outcome is Outcome.timeout, never.message
    finally:
        ray.shutdown()
