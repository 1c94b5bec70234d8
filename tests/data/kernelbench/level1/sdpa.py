import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 32
num_heads = 32
seq_len = 512
head_dim = 1024


class Model(nn.Module):
    """Scaled dot-product attention."""

    def __init__(self):
        super().__init__()

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v)


def get_inputs():
    return [torch.rand(batch_size, num_heads, seq_len, head_dim), torch.rand(batch_size, num_heads, seq_len, head_dim), torch.rand(batch_size, num_heads, seq_len, head_dim)]


def get_init_inputs():
    return []
