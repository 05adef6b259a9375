"""FLOPs of one training step, counted rather than estimated."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode


def training_step_flops(loss_of_batch: Callable[[torch.Tensor], torch.Tensor],
                        sample: torch.Tensor, batch_size: int) -> int:
    """Forward + backward FLOPs for a batch of ``batch_size`` sequences like ``sample`` (1, T).

    Counted by ``torch.utils.flop_counter`` on one sequence and scaled by the batch size (the
    count is linear in it).  Attention runs in the math backend here so that its matmuls are
    visible to the counter; fused kernels skip the masked half under causality, so this is the
    dense-attention count.  The optimizer update is not included.
    """
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        loss_of_batch(sample).backward()
    return int(counter.get_total_flops()) * batch_size
