"""The compression functions f_c of the Compressive Transformer (Rae, Potapenko, Jayakumar,
Hillier & Lillicrap 2020, "Compressive Transformers for Long-Range Sequence Modelling", ICLR,
section 3.1), each mapping n old memories to n / c compressed ones, c the compression rate:

* ``mean_pool`` / ``max_pool`` -- 1-D pooling over time, kernel = stride = c: slot j is the
  mean / element-wise max of states j c .. j c + c - 1;
* ``conv``      -- a learned 1-D convolution over time, kernel = stride = c, d_model -> d_model
  channels with a bias (one per layer; the paper's best), PyTorch's default initialisation;
* ``most_used`` -- the n / c states that received the most attention, in their time order.  The
  paper sorts memories by their average attention (usage); here the usage comes from the
  caller (see :mod:`xformer_bench.stacks.compressive` for how it is measured).

Every compressor takes ``old`` (B, n, D) with n a multiple of c and ``usage`` (B, n) or None,
and returns (B, n / c, D).  ``trainable`` says whether it has parameters for the
attention-reconstruction loss to train; ``needs_usage`` whether it reads ``usage``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from xformer_bench.errors import ConfigError


class Compressor(nn.Module):
    trainable = False
    needs_usage = False

    def __init__(self, rate: int):
        super().__init__()
        self.rate = rate

    def forward(self, old: torch.Tensor, usage: torch.Tensor | None = None) -> torch.Tensor:
        raise NotImplementedError


class MeanPool(Compressor):
    def forward(self, old, usage=None):  # (B, n, D) -> (B, n / c, D)
        return F.avg_pool1d(old.transpose(1, 2), self.rate, self.rate).transpose(1, 2)


class MaxPool(Compressor):
    def forward(self, old, usage=None):  # (B, n, D) -> (B, n / c, D)
        return F.max_pool1d(old.transpose(1, 2), self.rate, self.rate).transpose(1, 2)


class Conv(Compressor):
    trainable = True

    def __init__(self, rate: int, d_model: int):
        super().__init__(rate)
        self.conv = nn.Conv1d(d_model, d_model, kernel_size=rate, stride=rate)

    def forward(self, old, usage=None):  # (B, n, D) -> (B, n / c, D)
        return self.conv(old.transpose(1, 2)).transpose(1, 2)


class MostUsed(Compressor):
    needs_usage = True

    def forward(self, old, usage=None):  # (B, n, D), usage (B, n) -> (B, n / c, D)
        keep = old.shape[1] // self.rate
        chosen = usage.topk(keep, dim=1).indices.sort(dim=1).values  # (B, n / c), time order
        return old.gather(1, chosen.unsqueeze(-1).expand(-1, -1, old.shape[2]))


COMPRESSIONS = ("conv", "mean_pool", "max_pool", "most_used")


def build_compressor(name: str, rate: int, d_model: int) -> Compressor:
    if name == "conv":
        return Conv(rate, d_model)
    kinds = {"mean_pool": MeanPool, "max_pool": MaxPool, "most_used": MostUsed}
    if name not in kinds:
        raise ConfigError(f"stack.compression={name!r} is not a compression function; choose "
                          f"one of {', '.join(COMPRESSIONS)}")
    return kinds[name](rate)
