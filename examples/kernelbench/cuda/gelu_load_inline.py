"""Exact (erf) GELU as a KernelBench-style candidate: a C++/CUDA extension built with
torch.utils.cpp_extension.load_inline (nvcc + ninja), launched on PyTorch's current stream."""

import torch  # noqa: F401  (load_inline needs torch imported first)
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA_SRC = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void gelu_kernel(const float4* __restrict__ x, float4* __restrict__ y, long long n4) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n4) {
        const float4 v = x[i];
        y[i] = make_float4(0.5f * v.x * (1.0f + erff(v.x * 0.70710678118654752f)),
                           0.5f * v.y * (1.0f + erff(v.y * 0.70710678118654752f)),
                           0.5f * v.z * (1.0f + erff(v.z * 0.70710678118654752f)),
                           0.5f * v.w * (1.0f + erff(v.w * 0.70710678118654752f)));
    }
}

__global__ void gelu_scalar(const float* __restrict__ x, float* __restrict__ y, long long n) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 0.5f * x[i] * (1.0f + erff(x[i] * 0.70710678118654752f));
}

torch::Tensor gelu_forward(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.is_contiguous(), "contiguous CUDA tensor");
    auto y = torch::empty_like(x);
    const long long n = x.numel();
    if (n == 0) return y;
    auto stream = at::cuda::getCurrentCUDAStream();
    const bool aligned = reinterpret_cast<uintptr_t>(x.data_ptr<float>()) % 16 == 0
                         && reinterpret_cast<uintptr_t>(y.data_ptr<float>()) % 16 == 0;
    if (aligned && n % 4 == 0) {  // float4 loads and stores need 16-byte alignment and whole vectors
        const long long n4 = n / 4;
        gelu_kernel<<<(int)((n4 + 255) / 256), 256, 0, stream>>>(
            reinterpret_cast<const float4*>(x.data_ptr<float>()), reinterpret_cast<float4*>(y.data_ptr<float>()), n4);
    } else {
        gelu_scalar<<<(int)((n + 255) / 256), 256, 0, stream>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    }
    return y;
}
"""

CPP_SRC = "torch::Tensor gelu_forward(torch::Tensor x);"


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.ext = load_inline(
            name="kf_gelu_inline",
            cpp_sources=CPP_SRC,
            cuda_sources=CUDA_SRC,
            functions=["gelu_forward"],
            extra_cuda_cflags=["-O3", "-gencode=arch=compute_90,code=sm_90"],
            verbose=False,
        )

    def forward(self, x):
        return self.ext.gelu_forward(x.contiguous())
