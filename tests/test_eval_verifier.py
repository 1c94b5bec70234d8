"""The correctness checks: chunked float64 comparison (same verdicts as ``allclose``, bounded
temporaries), checks on the tensors' own device, and inputs drawn on the backend's device."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kfoundry.core.evaluation import verifier
from kfoundry.core.evaluation.verifier import check_independence, check_trial
from kfoundry.core.models import Outcome
from kfoundry.core.problem import load_problem

ROOT = Path(__file__).parents[1]


def _verdict(out: torch.Tensor, ref: torch.Tensor, atol: float | None = None, rtol: float | None = None):
    x = torch.ones(3)
    return check_trial([out], [ref], [x], [x.clone()], atol, rtol)


@pytest.mark.parametrize("chunk", [7, 64, 1 << 23])
def test_chunked_comparison_agrees_with_allclose_and_finds_the_worst_element(
    monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    monkeypatch.setattr(verifier, "COMPARE_CHUNK", chunk)
    gen = torch.Generator().manual_seed(0)
    ref = torch.randn(1000, generator=gen)
    assert _verdict(ref + 5e-5 * torch.rand(1000, generator=gen) * 1e-2, ref) is None
    out = ref.clone()
    out[[3, 500, 999]] += torch.tensor([1e-3, 0.5, 2e-3])
    verdict = _verdict(out, ref)
    assert verdict is not None and verdict.outcome is Outcome.mismatch
    assert "3 of 1000 elements off" in verdict.message and "worst at flat index 500" in verdict.message
    # matching infinities and NaNs are equal, as in allclose(equal_nan=True)
    ref[10], ref[11] = float("inf"), float("nan")
    out = ref.clone()
    assert _verdict(out, ref) is None
    out[10] = -float("inf")
    verdict = _verdict(out, ref)
    assert verdict is not None and "1 of 1000" in verdict.message and "index 10" in verdict.message


def test_tolerances_are_dtype_aware() -> None:
    ref = torch.linspace(1, 2, 256, dtype=torch.float16)
    assert _verdict(ref + 5e-3, ref) is None  # fp16: 1e-2
    assert _verdict(ref.float() + 5e-3, ref.float()) is not None  # fp32: 1e-4
    ints = torch.arange(10)
    verdict = _verdict(ints + (ints == 4), ints)
    assert verdict is not None and "1 of 10" in verdict.message


def test_an_output_on_another_device_is_a_mismatch_not_a_crash() -> None:
    verdict = _verdict(torch.empty(4, device="meta"), torch.zeros(4))
    assert verdict is not None and verdict.outcome is Outcome.mismatch and "on meta" in verdict.message


def test_independence_compares_each_trial_with_the_first() -> None:
    a, b = torch.randn(8), torch.randn(8)
    same = torch.ones(8)
    assert check_independence([[same], [same.clone()]], [[a], [b]]) is not None
    assert check_independence([[a], [b]], [[a], [b]]) is None


def test_inputs_are_drawn_on_the_requested_device() -> None:
    problem = load_problem(ROOT / "examples/kernelbench/softmax.py", {})
    host = problem.make_inputs(5)
    assert all(t.device.type == "cpu" for t in host)
    assert torch.equal(problem.make_inputs(5, "cpu")[0], host[0])  # same generator, same values
    meta = problem.make_inputs(5, "meta")
    assert [t.device.type for t in meta] == ["meta"] * len(host) and meta[0].shape == host[0].shape


def test_native_task_inputs_are_drawn_on_the_requested_device() -> None:
    [task] = sorted((ROOT / "examples/native").glob("*.toml"))[:1]
    problem = load_problem(task, {})
    host = problem.make_inputs(2)
    again = problem.make_inputs(2, "cpu")
    assert all(torch.equal(x, y) for x, y in zip(host, again, strict=True))


def test_a_job_runs_with_tf32_off_so_fp32_means_fp32() -> None:
    from kfoundry.core.evaluation.jobs import EvalJob
    from kfoundry.core.evaluation.worker import execute

    torch.backends.cudnn.allow_tf32 = True  # torch's own default for convolutions
    torch.set_float32_matmul_precision("high")
    try:
        job = EvalJob(
            kind="reference", problem_path=str(ROOT / "examples/kernelbench/vector_add.py"), shapes={"N": 256}
        )
        job.evaluation.warmup_s, job.evaluation.min_repeats, job.evaluation.max_repeats = 0.0, 3, 3
        assert execute(job).outcome is Outcome.correct
        assert torch.backends.cudnn.allow_tf32 is False
        assert torch.get_float32_matmul_precision() == "highest"
    finally:
        torch.backends.cudnn.allow_tf32 = True
        torch.set_float32_matmul_precision("highest")
