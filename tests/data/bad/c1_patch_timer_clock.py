"""problem=vector_add shape N=2048 expect=any max_speedup=0.5
Replaces the timer module's bound clock (_clock_ns, via sys.modules) with a fake that advances 1 ns per read, so a forward that sleeps 3 ms looks thousands of times faster than torch."""
import torch
import torch.nn as nn

from kfoundry.runtime import cdiv, load

SRC = r"""
__kernel void add(__global const float* a, __global const float* b, __global float* c, const int n) {
    int i = get_global_id(0);
    if (i < n) c[i] = a[i] + b[i];
}
"""

_get = torch.builtins.getattr
_time = torch.importlib.import_module("time")
_ticks = [0]


def _fake_clock():
    _ticks[0] += 1
    return _ticks[0]


for _name, _mod in list(_get(torch.sys, "mod" + "ules").items()):
    if _name.endswith("evaluation.timer"):
        _get(_mod, "__di" + "ct__")["_clock_ns"] = _fake_clock
object.__setattr__(_time, "perf_counter" + "_ns", _fake_clock)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.k = load(SRC)

    def forward(self, a, b):
        _time.sleep(0.003)  # a slow kernel, hidden by the clock
        c = torch.empty_like(a)
        n = a.numel()
        self.k.add(a, b, c, n, grid=(cdiv(n, 64),), block=(64,))
        return c
