"""The CUDA forms of the elementwise helpers (MUFU.EX2 / MUFU.RCP, which PoCL cannot stand in for) against
float64 for every float32 bit pattern, on a CUDA GPU: max and RMS ulps (ulps of the float64 truth rounded
to float32, floored at 2^-126, as the PoCL tests), NaN where the truth is NaN, the infinities and overflow
kept. The limits sit just above what an H200 measured with the same count (2026-12): kf_expm1 1.53 ulps,
kf_tanh 2.01, sigmoid 3.89, SiLU 22.2 (at the exp overflow x = -88.72, as with an IEEE division), Mish
5.64. Skipped without a GPU or nvcc."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from kfoundry.plugins.llms.offline.cookbook_elementwise import KF_FAST
from kfoundry.plugins.llms.offline.elementwise_ops import helper_source

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or shutil.which("nvcc") is None, reason="needs a CUDA GPU and nvcc"
)

#: name: (float32 expression of x as the FAST recipes write it, float64 truth of x, max ulps, RMS ulps)
CASES = {
    "kf_expm1": ("kf_expm1(x)", "expm1(x)", 1.6, 0.15),
    "kf_tanh": ("kf_tanh(x)", "tanh(x)", 2.1, 0.1),
    "sigmoid": ("(1.0f * KF_RCP1P(1.0f + expf((-x))))", "1.0 / (1.0 + exp(-x))", 4.0, 0.25),
    "silu": ("(x * KF_RCP1P(1.0f + expf((-x))))", "x / (1.0 + exp(-x))", 23.0, 0.3),
    "kf_mish": ("kf_mish(x)", "x * tanh(log1p(exp(x)))", 6.0, 0.45),
    "kf_softplus": ("kf_softplus(x)", "(x > 0.0 ? x : 0.0) + log1p(exp(-fabs(x)))", 4.5, 0.5),
}

_PROGRAM = r"""
#include <cstdio>
#include <cfloat>
#include <cmath>
struct Stats { unsigned int max_bits, at; unsigned long long n, bad; double sum_sq; };
__device__ float got_of(float x) { return GOT; }
__device__ double truth_of(double x) { return TRUTH; }
__global__ void acc(Stats* out) {
    unsigned int mb = 0, at = 0;
    unsigned long long n = 0, bad = 0;
    double ss = 0.0;
    for (unsigned long long k = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; k < (1ull << 32);
         k += (unsigned long long)gridDim.x * blockDim.x) {
        float x = __uint_as_float((unsigned int)k), got = got_of(x);
        double t = truth_of((double)x);
        if (isnan(t)) { bad += !isnan(got); continue; }
        if (isinf(t) || fabs(t) > (double)FLT_MAX) {
            bad += !((isinf(got) || fabsf(got) == FLT_MAX) && (got > 0) == (t > 0));
            continue;
        }
        if (!isfinite(got)) { ++bad; continue; }
        float tf = (float)fabs(t);
        double ulp = fmax((double)nextafterf(tf, INFINITY) - (double)tf, ldexp(1.0, -126));
        if (isinf(nextafterf(tf, INFINITY))) ulp = ldexp(1.0, 104);
        double e = fabs((double)got - t) / ulp;
        ++n; ss += e * e;
        unsigned int eb = __float_as_uint((float)e);
        if (eb > mb) { mb = eb; at = (unsigned int)k; }
    }
    for (int o = 16; o > 0; o >>= 1) {
        unsigned int mb2 = __shfl_down_sync(0xffffffffu, mb, o), at2 = __shfl_down_sync(0xffffffffu, at, o);
        if (mb2 > mb) { mb = mb2; at = at2; }
        n += __shfl_down_sync(0xffffffffu, n, o); bad += __shfl_down_sync(0xffffffffu, bad, o);
        ss += __shfl_down_sync(0xffffffffu, ss, o);
    }
    if ((threadIdx.x & 31) == 0) {
        if (atomicMax(&out->max_bits, mb) < mb) out->at = at;
        atomicAdd(&out->n, n); atomicAdd(&out->bad, bad); atomicAdd(&out->sum_sq, ss);
    }
}
int main() {
    Stats* d; cudaMalloc(&d, sizeof(Stats)); cudaMemset(d, 0, sizeof(Stats));
    acc<<<132 * 16, 256>>>(d);
    Stats s; cudaMemcpy(&s, d, sizeof(Stats), cudaMemcpyDeviceToHost);
    float mx, at; memcpy(&mx, &s.max_bits, 4); memcpy(&at, &s.at, 4);
    printf("max %.4f at %.9g rms %.5f bad %llu cuda %s\n", mx, at, sqrt(s.sum_sq / s.n), s.bad,
           cudaGetErrorString(cudaDeviceSynchronize()));
    return 0;
}
"""


@pytest.mark.parametrize("name", sorted(CASES))
def test_cuda_helpers_for_every_float(name: str, tmp_path: Path) -> None:
    got, truth, max_ulps, rms_ulps = CASES[name]
    major, minor = torch.cuda.get_device_capability()
    helpers = ("kf_expm1", "kf_mish", "kf_softplus")
    head = "#define FAST 1\n" + KF_FAST + "".join(helper_source(n, "cuda") for n in helpers)
    src = tmp_path / "acc.cu"
    src.write_text(head + _PROGRAM.replace("GOT", got).replace("TRUTH", truth))
    exe = tmp_path / "acc"
    build = [shutil.which("nvcc") or "nvcc", f"-arch=sm_{major}{minor}", "-O3", "-o", str(exe), str(src)]
    subprocess.run(build, check=True, capture_output=True, text=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True, timeout=300).stdout
    m = re.search(r"max (\S+) at (\S+) rms (\S+) bad (\d+) cuda (.*)", out)
    assert m is not None and m.group(5).strip() == "no error", out
    worst, rms, bad = float(m.group(1)), float(m.group(3)), int(m.group(4))
    assert bad == 0 and worst <= max_ulps and rms <= rms_ulps, (name, out)
