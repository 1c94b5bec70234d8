"""The float64-calibrated comparison on real computations: honest reorderings pass, lost precision fails.

Each case is (candidate output, native reference, float64 reference). ``assess(...).worst`` is the
output's distance to the bound (pass below 1); the margins are asserted, not only the verdicts.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kfoundry.core.evaluation.tolerance import assess, compare_output, float64_reference
from kfoundry.core.models import Outcome

Case = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _clear_low_bits(x: torch.Tensor, bits: int) -> torch.Tensor:
    return (x.view(torch.int32) & ~((1 << bits) - 1)).view(torch.float32)


def _tf32(x: torch.Tensor) -> torch.Tensor:
    return _clear_low_bits(x, 13)  # 10 mantissa bits kept


@functools.cache
def _matmul(k: int, signed: bool) -> tuple[torch.Tensor, torch.Tensor]:
    g = _gen(k + signed)
    a, b = torch.rand(128, k, generator=g), torch.rand(k, 128, generator=g)
    return (a * 2 - 1, b * 2 - 1) if signed else (a, b)


def _mm_case(k: int, signed: bool, compute: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> Case:
    a, b = _matmul(k, signed)
    return compute(a, b), a @ b, a.double() @ b.double()


def _k_chunks(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    acc = torch.zeros(a.shape[0], b.shape[1])
    for k in range(0, a.shape[1], 64):
        acc = acc + a[:, k : k + 64] @ b[k : k + 64]
    return acc


def _sequential(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """One fp32 accumulator per output, one product at a time (a naive kernel's inner loop)."""
    acc = torch.zeros(a.shape[0], b.shape[1])
    for k in range(a.shape[1]):
        acc += a[:, k, None] * b[None, k]
    return acc


def _split_k(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    step = a.shape[1] // 8
    return torch.stack([a[:, k : k + step] @ b[k : k + step] for k in range(0, a.shape[1], step)]).sum(0)


MATMUL_HONEST = {
    "k-chunks": _k_chunks,
    "sequential": _sequential,
    "split-k": _split_k,
    "reversed": lambda a, b: a.flip(1) @ b.flip(0),
}
MATMUL_CHEATS = {
    "tf32 inputs": lambda a, b: _tf32(a) @ _tf32(b),
    "bf16 inputs": lambda a, b: a.bfloat16().float() @ b.bfloat16().float(),
    "low 8 bits cleared": lambda a, b: _clear_low_bits(a @ b, 8),
}


@functools.cache
def _rows() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = torch.rand(64, 16384, generator=_gen(1))
    return x, x.sum(1), x.double().sum(1)


def _sum_sequential() -> Case:
    # torch.cumsum accumulates in float64 on the CPU, so the sequential fp32 sum is spelled out
    x, ref, ref64 = _rows()
    acc = torch.zeros(x.shape[0])
    for k in range(x.shape[1]):
        acc += x[:, k]
    return acc, ref, ref64


def _sum_pairwise() -> Case:
    x, ref, ref64 = _rows()
    while x.shape[1] > 1:
        x = x[:, 0::2] + x[:, 1::2]
    return x[:, 0], ref, ref64


def _fma() -> Case:
    a, b, c = (torch.rand(1 << 20, generator=_gen(s)) * 2 - 1 for s in (2, 3, 4))
    exact = a.double() * b.double() + c.double()
    return exact.float(), a * b + c, exact  # fma: one rounding of the exact result


@functools.cache
def _softmax_input() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = torch.rand(64, 4096, generator=_gen(5))
    return x, torch.softmax(x, 1), torch.softmax(x.double(), 1)


def _softmax_online() -> Case:
    x, ref, ref64 = _softmax_input()
    m, s = torch.full((64,), -math.inf), torch.zeros(64)
    for k in range(0, x.shape[1], 256):
        block = x[:, k : k + 256]
        new = torch.maximum(m, block.max(1).values)
        s = s * torch.exp(m - new) + torch.exp(block - new[:, None]).sum(1)
        m = new
    return torch.exp(x - m[:, None]) / s[:, None], ref, ref64


def _softmax_exp64() -> Case:
    x, ref, ref64 = _softmax_input()
    e = torch.exp((x - x.max(1, keepdim=True).values).double()).float()
    return e / e.sum(1, keepdim=True), ref, ref64


def _softmax_expected_sum() -> Case:
    """Divides by the expected row sum (E[exp(u - 1)] * dim for u ~ U[0,1)) instead of the actual one."""
    x, ref, ref64 = _softmax_input()
    e = torch.exp(x - x.max(1, keepdim=True).values)
    return e / ((1 - math.exp(-1)) * x.shape[1]), ref, ref64


def _softmax_smallest_off() -> Case:
    _, ref, ref64 = _softmax_input()
    small = ref <= ref.flatten().kthvalue(ref.numel() // 10).values
    return torch.where(small, ref * 1.16, ref), ref, ref64


@functools.cache
def _ln_input() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = torch.rand(32, 16384, generator=_gen(6))
    return x, F.layer_norm(x, (16384,)), F.layer_norm(x.double(), (16384,))


def _ln_two_pass() -> Case:
    x, ref, ref64 = _ln_input()
    mu = x.mean(1, keepdim=True)
    return (x - mu) / torch.sqrt(((x - mu) ** 2).mean(1, keepdim=True) + 1e-5), ref, ref64


def _ln_welford() -> Case:
    x, ref, ref64 = _ln_input()
    mean, m2 = torch.zeros(x.shape[0]), torch.zeros(x.shape[0])
    for k in range(x.shape[1]):
        d = x[:, k] - mean
        mean += d / (k + 1)
        m2 += d * (x[:, k] - mean)
    return (x - mean[:, None]) / torch.sqrt(m2[:, None] / x.shape[1] + 1e-5), ref, ref64


@functools.cache
def _gelu_input() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = torch.rand(1 << 20, generator=_gen(7)) * 8 - 4
    return x, F.gelu(x), F.gelu(x.double())


def _one_element_off() -> Case:
    _, ref, ref64 = _gelu_input()
    out = ref.clone()
    out[int(ref.abs().argmax())] *= 1 + 1e-3
    return out, ref, ref64


HONEST: dict[str, Callable[[], Case]] = {
    **{
        f"matmul K={k}{' signed' if s else ''} {n}": functools.partial(_mm_case, k, s, f)
        for k in (512, 4096)
        for s in (False, True)
        for n, f in MATMUL_HONEST.items()
    },
    "sum of 16384, sequential": _sum_sequential,
    "sum of 16384, pairwise": _sum_pairwise,
    "fma instead of mul + add": _fma,
    "softmax, online": _softmax_online,
    "softmax, exp in float64": _softmax_exp64,
    "layer norm, two-pass": _ln_two_pass,
    "layer norm, Welford": _ln_welford,
    "gelu in float64": lambda: (_gelu_input()[2].float(), _gelu_input()[1], _gelu_input()[2]),
    "identical": lambda: (_gelu_input()[1].clone(), _gelu_input()[1], _gelu_input()[2]),
}

CHEATING: dict[str, Callable[[], Case]] = {
    **{
        f"matmul K={k}{' signed' if s else ''} {n}": functools.partial(_mm_case, k, s, f)
        for k in (512, 4096)
        for s in (False, True)
        for n, f in MATMUL_CHEATS.items()
    },
    "sum, low 8 bits cleared": lambda: (_clear_low_bits(_rows()[1], 8), *_rows()[1:]),
    "softmax, expected row sum": _softmax_expected_sum,
    "softmax, smallest 10% off by 16%": _softmax_smallest_off,
    "softmax, low 8 bits cleared": lambda: (_clear_low_bits(_softmax_input()[1], 8), *_softmax_input()[1:]),
    "gelu, tanh approximation": lambda: (F.gelu(_gelu_input()[0], approximate="tanh"), *_gelu_input()[1:]),
    "gelu, low 8 bits cleared": lambda: (_clear_low_bits(_gelu_input()[1], 8), *_gelu_input()[1:]),
    "one element of 1M off by 1e-3": _one_element_off,
}


@pytest.mark.parametrize("name", HONEST)
def test_honest_computations_pass_with_margin(name: str) -> None:
    out, ref, ref64 = HONEST[name]()
    assert compare_output(0, out, ref, ref64, None, None) is None
    assert assess(out, ref, ref64).worst < 0.6  # layer norm by Welford is the closest: 0.56


@pytest.mark.parametrize("name", CHEATING)
def test_lost_precision_fails_with_margin(name: str) -> None:
    out, ref, ref64 = CHEATING[name]()
    verdict = compare_output(3, out, ref, ref64, None, None)
    assert verdict is not None and verdict.outcome is Outcome.mismatch
    assert verdict.message.startswith("output 3: ") and "float32 reference" in verdict.message
    assert "worst at flat index" in verdict.message
    assert assess(out, ref, ref64).worst > 1.4  # low 8 bits cleared on GELU is the closest: 1.5


def test_the_softmax_cheat_hides_under_the_old_absolute_tolerance() -> None:
    out, ref, ref64 = _softmax_expected_sum()
    assert compare_output(0, out, ref, None, None, None) is None  # atol = rtol = 1e-4 against ref
    assert compare_output(0, out, ref, ref64, None, None) is not None


def test_the_worst_element_is_named() -> None:
    out, ref, ref64 = _one_element_off()
    verdict = compare_output(0, out, ref, ref64, None, None)
    assert verdict is not None
    assert f"flat index {int(ref.abs().argmax())}:" in verdict.message and "x the float32" in verdict.message


def test_non_finite_values_must_match() -> None:
    ref64 = torch.tensor([1.0, math.nan, math.inf, -math.inf, 2.0], dtype=torch.float64)
    ref = ref64.float()
    assert compare_output(0, ref.clone(), ref, ref64, None, None) is None
    # which non-finite value an honest kernel makes of an infinite input depends on its operation order
    for at, value in ((1, math.inf), (1, -math.inf), (2, math.nan), (3, math.nan)):
        out = ref.clone()
        out[at] = value
        assert compare_output(0, out, ref, ref64, None, None) is None, (at, value)
    cases = {
        0: (math.nan, "NaN/inf values where the reference is finite"),
        1: (1.0, "finite values where the reference is NaN"),
        2: (-math.inf, "finite or the opposite infinity"),
        3: (0.0, "finite or the opposite infinity"),
        4: (math.inf, "NaN/inf values where the reference is finite"),
    }
    for at, (value, words) in cases.items():
        out = ref.clone()
        out[at] = value
        verdict = compare_output(0, out, ref, ref64, None, None)
        assert verdict is not None and words in verdict.message and f"flat index {at}" in verdict.message
        assert compare_output(0, out, ref, None, None, None) is not None  # without ref64 as well


def test_integers_and_bools_compare_exactly() -> None:
    ref = torch.arange(10)
    assert compare_output(0, ref.clone(), ref, None, None, None) is None
    out = ref.clone()
    out[7] += 1
    verdict = compare_output(1, out, ref, None, 0.5, 0.5)
    assert verdict is not None and "1 of 10 elements differ (first at flat index 7" in verdict.message
    flags = torch.tensor([True, False])
    assert compare_output(0, ~flags, flags, None, None, None) is not None


def test_configured_tolerances_replace_the_calibrated_bound() -> None:
    x, ref, ref64 = _softmax_input()
    out = ref * (1 + 1e-3)
    assert compare_output(0, out, ref, ref64, None, None) is not None
    assert compare_output(0, out, ref, ref64, 0.0, 2e-3) is None  # against float64
    verdict = compare_output(0, out, ref, ref64, 0.0, 5e-4)
    assert verdict is not None and "float64 reference" in verdict.message and "rtol=0.0005" in verdict.message


def test_without_float64_the_dtype_defaults_hold() -> None:
    ref = torch.rand(1000, generator=_gen(8))
    assert compare_output(0, ref + 5e-5, ref, None, None, None) is None  # fp32: 1e-4 abs + rel
    assert compare_output(0, ref + 5e-4, ref, None, None, None) is not None
    half = ref.half()
    assert compare_output(0, half + 4e-3, half, None, None, None) is None  # fp16: 1e-2
    assert compare_output(0, half + 4e-2, half, None, None, None) is not None


def test_low_precision_outputs_use_their_own_eps() -> None:
    x = torch.rand(256, 1024, generator=_gen(9)) * 2 - 1
    w = torch.rand(1024, 256, generator=_gen(10)) * 2 - 1
    for dtype in (torch.float16, torch.bfloat16):
        xs, ws = x.to(dtype), w.to(dtype)
        ref, ref64 = xs @ ws, xs.double() @ ws.double()
        honest = _sequential(xs[:, :256].float(), ws[:256].float()) + xs[:, 256:].float() @ ws[256:].float()
        assert compare_output(0, honest.to(dtype), ref, ref64, None, None) is None
        fp8 = (xs.to(torch.float8_e4m3fn).float() @ ws.to(torch.float8_e4m3fn).float()).to(dtype)
        verdict = compare_output(0, fp8, ref, ref64, None, None)
        assert verdict is not None and f"{str(dtype)[6:]} reference" in verdict.message


def test_float64_reference_leaves_model_and_inputs_alone() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 8), nn.BatchNorm1d(8)).eval()
    before = copy.deepcopy(model.state_dict())
    x, index = torch.rand(4, 16), torch.arange(4)
    outs = float64_reference(model, [x])
    assert outs is not None and outs[0].dtype == torch.float64
    assert all(
        v.dtype == before[k].dtype and torch.equal(v, before[k]) for k, v in model.state_dict().items()
    )
    assert x.dtype == torch.float32
    assert model.state_dict()["1.num_batches_tracked"].dtype == torch.int64
    ref = model(x)
    assert (outs[0] - ref.double()).abs().max() < 1e-5

    class Gather(nn.Module):
        def forward(self, v: torch.Tensor, i: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            v.mul_(2)  # an in-place reference must not reach the caller's tensor
            return v[i], i

    v = torch.rand(4, dtype=torch.float64)
    saved = v.clone()
    outs = float64_reference(Gather(), [v, index])
    assert outs is not None and torch.equal(outs[0], saved * 2) and outs[1].dtype == torch.int64
    assert torch.equal(v, saved)


def test_float64_reference_is_none_without_floating_outputs_or_on_failure() -> None:
    class Argmax(nn.Module):
        def forward(self, v: torch.Tensor) -> torch.Tensor:
            return v.argmax()

    class Fails(nn.Module):
        def forward(self, v: torch.Tensor) -> torch.Tensor:
            if v.dtype == torch.float64:
                raise RuntimeError("no float64 kernel")
            return v

    assert float64_reference(Argmax(), [torch.rand(5)]) is None
    assert float64_reference(Fails(), [torch.rand(5)]) is None


def test_an_8m_element_output_is_compared_in_bounded_chunks() -> None:
    ref64 = torch.rand(1 << 23, generator=_gen(11), dtype=torch.float64) * 2 - 1
    ref = ref64.float()
    assert compare_output(0, ref.clone(), ref, ref64, None, None) is None
    out = ref.clone()
    out[(1 << 23) - 5] += 1e-3
    verdict = compare_output(0, out, ref, ref64, None, None)
    assert verdict is not None and f"flat index {(1 << 23) - 5}:" in verdict.message


@pytest.mark.parametrize("chunk", [1 << 23, 5000])
def test_the_one_pass_acceptance_agrees_with_the_full_assessment(
    monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    """Outputs accepted without the banded statistics are those ``assess`` passes, across chunk boundaries
    and with non-finite values in some chunks (which take the masked way)."""
    import kfoundry.core.evaluation.error_envelope as envelope
    import kfoundry.core.evaluation.tolerance as tolerance

    monkeypatch.setattr(tolerance, "COMPARE_CHUNK", chunk)
    monkeypatch.setattr(envelope, "COMPARE_CHUNK", chunk)
    x = torch.exp(torch.randn(20000, generator=_gen(12)) * 4)  # wide dynamic range: the relative pass
    x64 = x.double() * (1 + 2e-8 * torch.randn(20000, generator=_gen(13), dtype=torch.float64))
    ref = x64.float()
    ref[[3, 17000]], x64[[3, 17000]] = math.nan, math.nan
    for scale, passes in ((3e-7, True), (1e-4, False), (0.0, True)):
        out = (x64 * (1 + scale * torch.randn(20000, generator=_gen(14), dtype=torch.float64))).float()
        for finite in (True, False):
            o, r, t = (out, ref, x64) if not finite else (out[5:16000], ref[5:16000], x64[5:16000])
            verdict = compare_output(0, o, r, t, None, None)
            assert (verdict is None) == passes == (assess(o, r, t).worst <= 1)
