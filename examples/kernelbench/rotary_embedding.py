import torch
import torch.nn as nn

batch_size = 4
seq_len = 256
heads = 8
head_dim = 64


class Model(nn.Module):
    """Rotary position embedding (rotate-half form) of x (batch, seq, heads, head_dim) by cos/sin (seq, head_dim/2)."""

    def __init__(self):
        super().__init__()

    def forward(self, x, cos, sin):
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        c, s = cos[None, :, None, :], sin[None, :, None, :]
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def get_inputs():
    return [
        torch.rand(batch_size, seq_len, heads, head_dim),
        torch.rand(seq_len, head_dim // 2),
        torch.rand(seq_len, head_dim // 2),
    ]


def get_init_inputs():
    return []
