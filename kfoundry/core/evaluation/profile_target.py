"""What ``ncu`` launches in the profiling sandbox: build the candidate and call its ``forward`` once.

``python -m kfoundry.core.evaluation.profile_target JOB.json`` (an :class:`EvalJob`). Runs confined,
as the sandbox's user, next to ``ncu`` (``profile.py``); its inputs are the problem's own (seed 0),
moved to the device before the call, so the kernels ncu records are the candidate's own launches.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    import torch

    from kfoundry import runtime
    from kfoundry.core.evaluation.jobs import EvalJob
    from kfoundry.core.evaluation.runner import build_backend
    from kfoundry.core.problem import load_problem

    job = EvalJob.model_validate_json(Path(argv[0]).read_text())
    assert job.candidate is not None
    problem = load_problem(job.problem_path, job.shapes)
    backend = build_backend(job)
    runtime.set_backend(backend)
    device = backend.torch_device
    model = problem.build_candidate(job.candidate, runtime.load, seed=0).to(device)
    inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in problem.make_inputs(0)]
    with torch.no_grad():
        model(*inputs)
    runtime.synchronize()
    print("profile_target: forward done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
