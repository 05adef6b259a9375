"""What the token mixers whose weights act on positions share (MLP-Mixer's token-mixing MLP,
gMLP's spatial gating unit): weights sized by ``data.seq_len`` when the model is built, one
length check, a causal mask that keeps the lower triangle of a position-space weight, and
padding that contributes nothing.

A position-space weight W maps the positions of its input to those of its output,
``y_t = sum_s W[t, s] x_s + b_t`` for every channel; with W lower-triangular (W[t, s] = 0 for
s > t) output t reads only inputs s <= t, so a stack of such maps is causal.  A shorter input
of T positions uses the leading columns of W (its inputs) and, where W's rows are positions,
the leading rows -- the same as zero-padding the input to ``data.seq_len`` and keeping the first
T outputs, which keeps the causal mask intact.
"""

from __future__ import annotations

import torch

from xformer_bench.errors import ConfigError


def check_length(name: str, length: int, max_length: int) -> None:
    """One line when an input is longer than the ``data.seq_len`` the weights were built for."""
    if length > max_length:
        raise ConfigError(f"attention={name} has weights for data.seq_len={max_length} positions "
                          f"and got an input of {length}; build it with data.seq_len >= {length}")


def mix_positions(
    weight: torch.Tensor,  # (T_out, T_in): [t, s] = what output t takes of input position s
    bias: torch.Tensor,  # (T_out,)
    x: torch.Tensor,  # (B, T_in, D)
    *,
    causal: bool,
) -> torch.Tensor:  # (B, T_out, D)
    """``W x + b`` over positions, the same map for every channel; ``causal`` zeroes W[t, s]
    for s > t (and its gradient), so output t sees inputs s <= t only."""
    if causal:
        weight = weight.tril()  # (T_out, T_in)
    return torch.matmul(weight, x) + bias[:, None]  # (B, T_out, D)


def drop_padding(x: torch.Tensor, key_padding_mask: torch.Tensor | None) -> torch.Tensor:
    """``x`` (B, T, D) with padded positions (mask (B, T), True = padding) set to zero: a
    linear map over positions then takes nothing from them."""
    return x if key_padding_mask is None else x.masked_fill(key_padding_mask[..., None], 0.0)
