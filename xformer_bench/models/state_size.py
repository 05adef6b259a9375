"""The state a token mixer keeps to continue a sequence: bytes per layer, for one sequence of
``seq_len`` positions -- the x-axis of Zoology's Figure 2 (Arora et al. 2023, "Zoology:
Measuring and Improving Recall in Efficient Language Models": recall accuracy against the
recurrent state size).

**The convention.**  A token mixer may say it itself, and a new mixer should::

    def state_bytes(self, seq_len: int, batch: int = 1, dtype=torch.float32) -> int: ...

(a method of the :class:`~xformer_bench.attention.TokenMixer`; a recurrent mixer returns its
state's size, independent of ``seq_len``).  Without it, :func:`mixer_state_bytes` reads what
the mixer declares (``decode_state``, :data:`~xformer_bench.core.decode_cache.DECODE_STATES`):

* multi-head attention: its keys and values, ``2 x seq_len x H_kv x Dh`` (``2 x seq_len x
  d_model`` with every head), except for the kernels whose paper gives a smaller state
  (:data:`KERNEL_STATES`: a sliding window keeps ``window`` positions; linear attention and
  Performer keep the running sum ``phi(k) v^T`` and its normaliser, ``H x F x (Dh + 1)``
  with F features) -- what the mixer needs, even where xbench's decode cache keeps every key;
* ``recurrent``: measured -- the tensors its cache slot holds after one decoding step, each at
  its own width: a real floating tensor at ``dtype``'s (the precision the model keeps its
  state in), a complex or integer one at its own (S4D's complex64 state: 8 bytes an element
  whatever the model's precision -- torch has no bfloat16 complex and S4D computes it in full
  precision);
* ``history``: its inputs, ``seq_len x d_model``;
* otherwise (``none``: no decoding state, e.g. a bidirectional mixer): None.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from xformer_bench.attention.linear import LinearAttention
from xformer_bench.attention.local import LocalAttention
from xformer_bench.attention.multi_head import MultiHeadAttention
from xformer_bench.attention.performer import PerformerAttention
from xformer_bench.core.context import ForwardContext
from xformer_bench.core.decode_cache import DecodeCache
from xformer_bench.position import Position

KERNEL_STATES: dict[type, Callable[[Any, MultiHeadAttention, int], int]] = {
    LocalAttention: lambda k, m, t: 2 * min(t, k.window) * m.n_kv_heads * m.head_dim,
    LinearAttention: lambda k, m, t: m.n_heads * m.head_dim * (m.head_dim + 1),
    PerformerAttention: lambda k, m, t: m.n_heads * k.n_features * (m.head_dim + 1),
}
"""Elements of state per sequence of the kernels whose state is not every key and value:
``(kernel, mixer, seq_len) -> elements``."""


def _element_bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _tensor_bytes(value: Any, real_bytes: int) -> int:
    """Bytes of the tensors in a (nested) dict, list or tuple, views counted as their size: a
    real floating tensor at ``real_bytes`` an element, any other at its own element size."""
    if isinstance(value, torch.Tensor):
        real = value.is_floating_point()
        return value.numel() * (real_bytes if real else value.element_size())
    if isinstance(value, dict):
        return sum(_tensor_bytes(v, real_bytes) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v, real_bytes) for v in value)
    return 0


@torch.no_grad()
def measured_state_bytes(mixer: nn.Module, d_model: int,
                         dtype: torch.dtype = torch.float32) -> int:
    """Bytes a recurrent mixer's cache slot holds after decoding one position of one sequence
    (zeros in): real floating tensors at ``dtype``'s width, others at their own."""
    cache = DecodeCache()
    cache.begin_step(1)
    was_training = mixer.training
    mixer.eval()
    try:
        parameter = next(mixer.parameters(), None)
        device = parameter.device if parameter is not None else torch.device("cpu")
        mixer(torch.zeros(1, 1, d_model, device=device),
              ForwardContext(Position(), causal=True, cache=cache))
    finally:
        mixer.train(was_training)
    return sum(_tensor_bytes(slot, _element_bytes(dtype)) for slot in cache.slots)


def mixer_state_bytes(mixer: nn.Module, seq_len: int, d_model: int, batch: int = 1,
                      dtype: torch.dtype = torch.float32) -> int | None:
    """Bytes of state ``mixer`` keeps to continue ``batch`` sequences of ``seq_len`` positions
    (see the module's docstring); None when it keeps none it could decode with."""
    own = getattr(mixer, "state_bytes", None)
    if callable(own):
        return int(own(seq_len=seq_len, batch=batch, dtype=dtype))
    size = _element_bytes(dtype) * batch
    if isinstance(mixer, MultiHeadAttention):
        kernel = KERNEL_STATES.get(type(mixer.kernel))
        elements = kernel(mixer.kernel, mixer, seq_len) if kernel is not None else \
            2 * seq_len * mixer.n_kv_heads * mixer.head_dim
        return elements * size
    state = getattr(mixer, "decode_state", "none")
    if state == "recurrent":
        return measured_state_bytes(mixer, d_model, dtype) * batch
    if state == "history":
        return seq_len * d_model * size
    return None


def layer_state_bytes(model: nn.Module, seq_len: int,
                      dtype: torch.dtype = torch.float32) -> list[int | None]:
    """:func:`mixer_state_bytes` of each block's token mixer (``model.stack.blocks``), one
    sequence of ``seq_len`` positions."""
    d_model = model.dims.d_model
    return [mixer_state_bytes(block.attention, seq_len, d_model, dtype=dtype)
            for block in model.stack.blocks]
