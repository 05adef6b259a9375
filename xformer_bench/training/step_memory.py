"""Activation memory of one training step, measured the same way on every machine.

A process's resident set mixes the interpreter, the libraries, the data and what earlier runs
of a sweep left cached, so it cannot tell two models apart on a CPU.  Before training, the run
tracks every tensor one forward + backward of the model allocates on a batch of the training
shape (:class:`~xformer_bench.bench.peak_memory.PeakLiveBytes`, the allocation tracker of the
attention benchmark) and records the peak: activations, temporaries and gradients -- not the
parameters nor the optimizer state.  The model runs in eval mode, so nothing stateful moves
(no dropout draws, running statistics and counters stay; experts drop no token), and the
gradients are cleared afterwards: training is exactly what it would have been.
"""

from __future__ import annotations

import torch
from torch import nn

from xformer_bench.bench.peak_memory import peak_bytes


def training_step_memory(model: nn.Module, seq_len: int, batch_size: int,
                         vocab_size: int,
                         inputs: torch.Tensor | tuple[torch.Tensor, ...] | None = None) -> float:
    """MiB allocated at the peak of one forward + backward on ``batch_size`` x ``seq_len``
    random tokens, or on ``inputs`` (a batch of the model's inputs: a tensor or a tuple of
    arguments) when given."""
    device = next(model.parameters()).device
    if inputs is None:
        inputs = torch.randint(0, vocab_size, (batch_size, seq_len),
                               generator=torch.Generator().manual_seed(0))
    arguments = tuple(a.to(device) for a in (inputs if isinstance(inputs, tuple) else (inputs,)))
    was_training = model.training
    model.eval()
    try:
        with torch.random.fork_rng(devices=[]):  # a part that draws in eval (LSH) draws here
            peak = peak_bytes(lambda: model(*arguments).float().mean().backward(), device)
    finally:
        model.train(was_training)
        model.zero_grad(set_to_none=True)
        if hasattr(model, "reset_memory"):
            model.reset_memory()  # a recurrent stack forgets the probe's segment
    return peak / 2**20
