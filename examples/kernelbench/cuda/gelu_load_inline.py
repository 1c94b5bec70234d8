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

torch::Tensor gelu_forward(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.is_contiguous() && x.numel() % 4 == 0, "contiguous CUDA tensor, numel % 4 == 0");
    auto y = torch::empty_like(x);
    const long long n4 = x.numel() / 4;
    const int blocks = (int)((n4 + 255) / 256);
    gelu_kernel<<<blocks, 256, 0, at::cuda::getCurrentCUDAStream()>>>(
        reinterpret_cast<const float4*>(x.data_ptr<float>()), reinterpret_cast<float4*>(y.data_ptr<float>()), n4);
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
