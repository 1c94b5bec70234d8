"""Ray's compile tasks: a CPU task compiles a candidate's programs (its loads inside ``forward`` too)
through the compile service, and the benchmark task serves the artefacts it shipped (slow: starts Ray)."""

from __future__ import annotations

import importlib.util

import pytest
from eval_helpers import EXAMPLES, fast_config

from kfoundry.core.evaluation import EvalJob
from kfoundry.core.models import Candidate, Outcome

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed"),
    pytest.mark.skipif(importlib.util.find_spec("pyopencl") is None, reason="the jobs run on PoCL"),
]


def test_compile_tasks_ship_artefacts_to_the_benchmark_tasks() -> None:
    import ray
    from test_compile_cache import LAZY

    from kfoundry.plugins.executors.ray_executor import RayExecutor, RayOptions

    if ray.is_initialized():
        ray.shutdown()
    ray.init(
        address="local", num_cpus=2, resources={"kf_compile": 2}, include_dashboard=False, log_to_driver=False
    )
    try:
        jobs = [
            EvalJob(
                problem_path=str(EXAMPLES / "kernelbench" / "vector_add.py"),
                shapes={"N": 256},
                candidate=Candidate(source=LAZY.replace("load(SRC", f"load('// {i}\\n' + SRC")),
                evaluation=fast_config(trials=1, shape_variants=1).evaluation,
                backend_plugin="opencl",
            )
            for i in range(2)
        ]
        options = RayOptions(compile_tasks=True, cpu_resources={"kf_compile": 1})
        results = RayExecutor(options).run(jobs)
        assert [r.outcome for r in results] == [Outcome.correct] * 2, [r.message for r in results]
        for r in results:
            assert "ray: compile task: compile job: 2 program(s), 2 artefact(s) shipped" in r.log, r.log[:600]
            assert [c.get("seeded") for c in r.compiles] == [True, True], r.compiles
    finally:
        ray.shutdown()
