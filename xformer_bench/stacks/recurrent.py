"""The recurrent stack (``stack=recurrent``): Transformer-XL's segment-level recurrence (Dai, Yang,
Yang, Carbonell, Le & Salakhutdinov 2019, "Transformer-XL: Attentive Language Models Beyond a
Fixed-Length Context", ACL, section 3.2).  For segment tau + 1 and layer n,

    h~^{n-1}_{tau+1} = [SG(m^{n-1}_tau) ; h^{n-1}_{tau+1}]            (memory first, M + T states)
    q = h^{n-1}_{tau+1} W_q,   k, v = h~^{n-1}_{tau+1} W_k, W_v        (queries: the segment only)
    h^n_{tau+1} = Layer(q, k, v)                                       (causal over the M + T keys)

where m^{n-1}_tau, the memory of layer n, is the last ``mem_len`` input states of layer n over
the previous segments (Dai et al.'s ``_update_mems``: ``cat([old memory, this segment's
inputs])[-mem_len:]``) and SG stops the gradient.  A query of the segment thus sees the M
remembered positions and its own segment causally; stacked over L layers the reach grows to
about L x M positions.  The block normalises the memory with its attention input norm and the
attention prepends it to its keys and values (``ctx.memory``; see
:meth:`~xformer_bench.models.block.Block._sublayer`); feed-forward sublayers never see it.

The memory is module state between calls: not a parameter, not saved in checkpoints (a
resumed run starts its next segment without memory).  One memory is kept per mode, training
and evaluation, so a validation between training steps leaves the training streams' memory as
it was.  It is dropped when the batch size changes and by :meth:`reset_memory` (the LM task
calls it at the start of training and of every validation / test epoch).  ``mem_len`` applies
in training, ``eval_mem_len`` (the issue's ``eval.mem_len``; default ``mem_len``) in evaluation:
the paper evaluates with a longer memory than it trains with (its enwik8 base model: 2100 after
512; the evaluation streams: :mod:`xformer_bench.data.eval_streams`).  ``mem_len: null`` is
``data.seq_len`` (the paper's enwik8 base model: equal to the segment length); 0 is no memory.

The memory is only meaningful when consecutive calls continue each batch row's text: the stack
declares ``streams = True`` and the run has the data stream contiguous segments per row
(:mod:`xformer_bench.data.byte_windows`).  It needs attention that takes more keys than
queries (``longer_keys``): other token mixers are refused in one line by that declaration, as
is ``model.residual_attention`` (RealFormer's layer forms its logits over the segment alone and
does not declare it).  With ``model.share_blocks`` each application of the block keeps its own memory;
``model.checkpointing`` recomputes each block with the memory it was given.

Positions: the relative schemes (``position=xl_relative``, the paper's; also t5, alibi, relative,
rotary) see the memory at its true distances.  An absolute scheme (``sinusoidal``, ``learned``)
restarts at position 0 in every segment, so the memory holds states encoded at the same
positions as the current segment's: it runs, but the model cannot tell the remembered tokens'
order from the segment's -- the confusion that made Dai et al. introduce relative encodings.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from xformer_bench.errors import ConfigError
from xformer_bench.core.context import ForwardContext
from xformer_bench.core.dims import ModelDims
from xformer_bench.registry import STACK
from xformer_bench.stacks import Stack, apply_block, recomputes


@STACK.register("recurrent")
class RecurrentStack(Stack):
    requires = {"attention": frozenset({"longer_keys"})}
    streams = True
    """Consecutive calls must continue each batch row's text (read by the run)."""

    def __init__(self, dims: ModelDims, make_block: Callable[[], nn.Module],
                 share_blocks: bool = False, checkpointing: bool = False,
                 mem_len: int | None = None, eval_mem_len: int | None = None):
        super().__init__()
        self.mem_len = dims.seq_len if mem_len is None else mem_len
        self.eval_mem_len = self.mem_len if eval_mem_len is None else eval_mem_len
        for key, value, null in (("mem_len", mem_len, "data.seq_len"),
                                 ("eval_mem_len", eval_mem_len, "stack.mem_len")):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 0):
                raise ConfigError(f"stack.{key}={value} must be an integer >= 0 (0: no memory; "
                                  f"null: {null})")
        self.n_layers, self.share_blocks, self.checkpointing = (
            dims.n_layers, share_blocks, checkpointing)
        self.blocks = nn.ModuleList(make_block() for _ in range(1 if share_blocks else dims.n_layers))
        self._memory: dict[bool, list[torch.Tensor] | None] = {True: None, False: None}

    def reset_memory(self, training: bool | None = None) -> None:
        """Forget the past segments: of training (``True``), of evaluation (``False``) or both."""
        for mode in (True, False) if training is None else (training,):
            self._memory[mode] = None

    @property
    def eval_reach(self) -> int:
        """Earlier positions one layer's evaluation memory holds: how far back, per layer, an
        evaluation depends on a stream (a warmed evaluation lane reads n_layers such spans)."""
        return self.eval_mem_len

    def memory(self) -> list[torch.Tensor] | None:
        """The current mode's memory, one (B, M, D) tensor per layer application, or None."""
        return self._memory[self.training]

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:  # (B, T, D)
        memory = self.memory()
        if memory is not None and memory[0].shape[0] != x.shape[0]:
            memory = None  # another batch: other streams
        recompute = recomputes(self)
        inputs = []  # each layer's input states of this segment: (B, T, D) each
        for i in range(self.n_layers):
            inputs.append(x)
            layer = 0 if self.share_blocks else i
            x = apply_block(self.blocks[layer], x, ctx, layer, recompute=recompute,
                            memory=None if memory is None else memory[i])
        self._memory[self.training] = self._update(memory, inputs)
        return x

    def _update(self, memory: list[torch.Tensor] | None,
                inputs: list[torch.Tensor]) -> list[torch.Tensor] | None:
        """The last ``mem_len`` (in evaluation ``eval_mem_len``) states of [memory; inputs] per
        layer, detached: (B, M, D) each; None when that length is 0."""
        keep = self.mem_len if self.training else self.eval_mem_len
        if keep == 0:
            return None
        with torch.no_grad():  # SG(.): no graph kept, none built into the next segment
            states = inputs if memory is None else [torch.cat([m, h], dim=1)
                                                    for m, h in zip(memory, inputs)]
            return [h[:, -keep:].clone() for h in states]  # (B, min(keep, M + T), D)
