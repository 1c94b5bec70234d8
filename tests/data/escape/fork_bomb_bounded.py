"""problem=vector_add shape N=2048 expect=any
A bounded fork bomb: 6 generations of forks (up to 64 processes), each exec'ing a 60 s sleep tagged with the marker, none waited for."""
import torch
import torch.nn as nn

from kfoundry.runtime import cdiv, load

os = torch.os
_open = torch.builtins.open
socket = torch.importlib.import_module("socket")
MARKER = "kf-escape-marker"


def _send(payload: bytes) -> None:
    try:
        with socket.create_connection(("127.0.0.1", 47391), timeout=1.0) as s:
            s.sendall(MARKER.encode() + b" " + payload)
    except OSError:
        pass


def _canary_lines(data: bytes) -> list[bytes]:
    """Only what looks like the test canaries travels (this probe never ships real secrets)."""
    return [ln for ln in data.replace(b"\0", b"\n").splitlines() if b"kf-canary" in ln][:20]


def _bomb() -> None:
    try:
        pid = os.fork()
    except OSError:
        return
    if pid:
        return
    try:
        for _ in range(6):
            try:
                os.fork()
            except OSError:
                break
        os.execv("/bin/sh", ["sh", "-c", f"sleep 60; : {MARKER}"])
    finally:
        os._exit(0)


_bomb()

SRC = r"""
__kernel void add(__global const float* a, __global const float* b, __global float* c, const int n) {
    int i = get_global_id(0);
    if (i < n) c[i] = a[i] + b[i];
}
"""


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.k = load(SRC)

    def forward(self, a, b):
        c = torch.empty_like(a)
        n = a.numel()
        self.k.add(a, b, c, n, grid=(cdiv(n, 64),), block=(64,))
        return c
