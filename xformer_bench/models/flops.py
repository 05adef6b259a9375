"""FLOPs of one training step, counted rather than estimated."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode


def training_step_flops(model: nn.Module, seq_len: int, batch_size: int) -> int:
    """Forward + backward FLOPs of ``model`` on a batch of ``batch_size`` sequences of ``seq_len``.

    Counted by ``torch.utils.flop_counter`` on one sequence and scaled by the batch size (the
    count is linear in it).  Attention runs in the math backend here so that its matmuls are
    visible to the counter; fused kernels skip the masked half under causality, so this is the
    dense-attention count.  The model runs in eval mode, so nothing stateful moves (dropout
    draws no numbers, running statistics stay, experts drop no token: the full-capacity count);
    gradients are cleared afterwards.  The optimizer update is not included.
    """
    was_training = model.training
    sample = torch.zeros(1, seq_len, dtype=torch.long, device=next(model.parameters()).device)
    model.eval()
    try:
        with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
            model(sample).float().mean().backward()
    finally:
        model.train(was_training)
        model.zero_grad(set_to_none=True)
    return int(counter.get_total_flops()) * batch_size
