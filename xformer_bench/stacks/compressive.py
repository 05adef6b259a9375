"""The compressive stack (``stack=compressive``): the Compressive Transformer (Rae, Potapenko,
Jayakumar, Hillier & Lillicrap 2020, "Compressive Transformers for Long-Range Sequence
Modelling", ICLR, section 3 and Algorithm 1) -- Transformer-XL's segment recurrence
(:mod:`xformer_bench.stacks.recurrent`, subclassed here) with a second, coarser memory.

Per layer i, a memory m^i of the last ``mem_len`` input states (XL's) and a compressed memory
cm^i of ``cmem_len`` slots.  For a segment h^{i-1} of T states::

    h^i       = Layer^i(h^{i-1}, memory = [SG(cm^i) ; SG(m^i)])     keys [cm; m; h], queries h
    old       = the oldest states of [m^i ; h^{i-1}] beyond mem_len  (T once m^i is full)
    cm^i     <- last cmem_len of [cm^i ; SG(f_c^i(old))]              n_old / c new slots
    m^i      <- [m^i ; h^{i-1}] without old
    L_attn   += || attn(h^{i-1}, old) - attn(h^{i-1}, f_c^i(old)) ||^2    (training only)

with attn(h, M) = softmax(Q(h) K(M)^T / sqrt(Dh)) V(M) per head, Q, K, V the layer's own
projections of its attention-input-normed states, content only (no position terms, no mask:
old states all precede h), as in section 3.2.  Everything but f_c is a constant in L_attn (the
paper stops those gradients so the loss trains the compression network alone) and the memories
are detached (no gradient crosses segments), so f_c learns from L_attn only.  The model adds
``reconstruction_weight * L_attn`` to its loss through ``ctx.add_auxiliary_loss``; here the
squared norm is a mean over batch, heads, positions and head features (size-independent) and
the layers' terms are summed.  Only a compression with parameters (``conv``) has a loss; the
pooling and most-used functions have nothing to train.

Compression functions (``compression``, :mod:`xformer_bench.stacks._compression`, section 3.1):
``conv`` (kernel = stride = c, one per layer; the paper's best), ``mean_pool``, ``max_pool``
and ``most_used``.  ``most_used`` keeps the n / c old states with the highest usage; the paper
sorts by average attention, which the house's kernels do not expose, so -- a simplification --
the usage is recomputed at eviction: the content-only attention (causal, no position terms) of
the segment just processed over all its keys [cm; m; h], averaged over heads and queries, read
at the old states.  It counts only the last segment the states were attended in.

Defaults: ``mem_len: null`` is ``data.seq_len`` (as XL's); ``cmem_len: null`` is ``mem_len``
and ``compression_rate: 3``, the paper's Enwik8 choices (compressed memory as long as the
memory, c = 3); ``reconstruction_weight: 1.0`` (a choice: the loss trains only f_c, so the
weight scales only f_c's gradient); ``eval_mem_len`` / ``eval_cmem_len`` (null: the training
lengths) apply in evaluation.

Choices and simplifications:

* States leave the memory in whole groups of c: when the overflow of [m; h] is not a multiple
  of c, the remainder (< c states) stays in the memory until the next segment, so a full
  memory holds mem_len to mem_len + c - 1 states (exactly mem_len when c divides mem_len and
  T).
  With ``cmem_len: 0`` nothing is compressed and the stack is exactly ``stack=recurrent``.
* Positions: the compressed slots sit before the memory as ordinary keys, one position each
  (the relative schemes see [cm; m; h] as one sequence, a slot c states' span counted as one
  position), like the paper, which treats them as earlier positions.
* The conv keeps PyTorch's default initialisation.  In training with a trainable compression
  the stack adds a zero-weighted sum of f_c's parameters to its loss term, so every parameter
  gets a gradient each step (DDP), also in the first segments, when nothing is compressed yet.
* ``conv`` and ``most_used`` need the attention's projections (multi-head attention): another
  token mixer is refused in one line; ``mean_pool`` / ``max_pool`` take any mixer that accepts
  more keys than queries (declared by ``requires``, as ``stack=recurrent``).

Memory life cycle, streams, shared and checkpointed blocks: as ``stack=recurrent`` (both
memories are module state, not saved in checkpoints; the run record's
``eval_protocol.memory`` is ``eval_mem_len``, the ordinary memory's length).  A warmed
evaluation lane (``eval.warm``) reads ``eval_reach`` per layer, compressed span included; it
equals a single stream exactly when c divides the segment length (else the c-groups fall
elsewhere in the lane than in the stream).
``report()``: ``reconstruction_loss``, L_attn (unweighted) of the last training forward that
compressed.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn
from torch.func import functional_call

from xformer_bench.errors import ConfigError
from xformer_bench.core.context import ForwardContext
from xformer_bench.core.dims import ModelDims
from xformer_bench.registry import STACK
from xformer_bench.stacks import apply_block, recomputes
from xformer_bench.stacks._compression import build_compressor
from xformer_bench.stacks.recurrent import RecurrentStack


class _Method(nn.Module):
    """``module.method`` as a module's forward, so ``functional_call`` can swap its parameters."""

    def __init__(self, module: nn.Module, method: str):
        super().__init__()
        self.module, self.method = module, method

    def forward(self, *args):
        return getattr(self.module, self.method)(*args)


def _constant(module: nn.Module, method: str, *args: torch.Tensor):
    """``module.method(*args)`` with the module's parameters detached (gradients reach ``args``,
    never the module) and in evaluation mode (no running statistic updated a second time)."""
    was_training = module.training
    module.train(False)
    try:
        detached = {f"module.{name}": p.detach() for name, p in module.named_parameters()}
        return functional_call(_Method(module, method), detached, args)
    finally:
        module.train(was_training)


def _last(states: torch.Tensor, n: int) -> torch.Tensor:  # (B, S, D) -> (B, min(n, S), D)
    return states[:, states.shape[1] - min(n, states.shape[1]):]


@STACK.register("compressive")
class CompressiveStack(RecurrentStack):
    def __init__(self, dims: ModelDims, make_block: Callable[[], nn.Module],
                 share_blocks: bool = False, checkpointing: bool = False,
                 mem_len: int | None = None, eval_mem_len: int | None = None,
                 cmem_len: int | None = None, eval_cmem_len: int | None = None,
                 compression_rate: int = 3, compression: str = "conv",
                 reconstruction_weight: float = 1.0):
        super().__init__(dims, make_block, share_blocks, checkpointing, mem_len, eval_mem_len)
        self.cmem_len = self.mem_len if cmem_len is None else cmem_len
        self.eval_cmem_len = self.cmem_len if eval_cmem_len is None else eval_cmem_len
        if self.cmem_len < 0 or self.eval_cmem_len < 0:
            raise ConfigError(f"stack.cmem_len={cmem_len} and stack.eval_cmem_len={eval_cmem_len} "
                              "must be >= 0 (null: stack.mem_len, and cmem_len for eval_cmem_len)")
        if isinstance(compression_rate, bool) or not isinstance(compression_rate, int) \
                or compression_rate < 1:
            raise ConfigError(f"stack.compression_rate={compression_rate!r} must be an "
                              "integer >= 1")
        if reconstruction_weight < 0:
            raise ConfigError(f"stack.reconstruction_weight={reconstruction_weight} must be >= 0")
        self.rate, self.reconstruction_weight = compression_rate, reconstruction_weight
        self.compressors = nn.ModuleList(  # one f_c per parameter layer
            build_compressor(compression, compression_rate, dims.d_model) for _ in self.blocks)
        f_c, attention = self.compressors[0], self.blocks[0].attention
        reads_attention = f_c.needs_usage or (f_c.trainable and reconstruction_weight > 0)
        if reads_attention and "longer_keys" in getattr(attention, "provides", ()) \
                and not hasattr(attention, "project_keys_values"):  # else `requires` refuses it
            raise ConfigError(f"stack.compression={compression} needs the attention's query/key/"
                              "value projections (multi-head attention), which this attention "
                              "lacks: set stack.compression=mean_pool or max_pool, or choose "
                              "another attention")
        self._compressed: dict[bool, list[torch.Tensor] | None] = {True: None, False: None}
        self.last_reconstruction: torch.Tensor | None = None

    def reset_memory(self, training: bool | None = None) -> None:
        super().reset_memory(training)
        for mode in (True, False) if training is None else (training,):
            self._compressed[mode] = None

    @property
    def eval_reach(self) -> int:
        """Earlier positions one layer's evaluation memories cover: the memory (up to c - 1
        states beyond eval_mem_len) and c positions per compressed slot."""
        if not self.eval_cmem_len:
            return self.eval_mem_len
        return self.eval_mem_len + self.rate - 1 + self.eval_cmem_len * self.rate

    def compressed_memory(self) -> list[torch.Tensor] | None:
        """The current mode's compressed memory, one (B, Nc, D) tensor per layer application."""
        return self._compressed[self.training]

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:  # (B, T, D)
        memory, compressed = self.memory(), self.compressed_memory()
        if memory is not None and memory[0].shape[0] != x.shape[0]:
            memory = compressed = None  # another batch: other streams
        recompute = recomputes(self)
        inputs = []  # each layer's input states of this segment: (B, T, D) each
        for i in range(self.n_layers):
            inputs.append(x)
            layer = 0 if self.share_blocks else i
            attended = None if memory is None else torch.cat([compressed[i], memory[i]], dim=1)
            if attended is not None and attended.shape[1] == 0:
                attended = None  # nothing remembered (stack.mem_len=0, stack.cmem_len=0)
            x = apply_block(self.blocks[layer], x, ctx, layer, recompute=recompute,
                            memory=attended)  # keys [cm; m; x]: (B, Nc + M + T, D)
        self._remember(memory, compressed, inputs, ctx)
        return x

    def _remember(self, memory: list[torch.Tensor] | None, compressed: list[torch.Tensor] | None,
                  inputs: list[torch.Tensor], ctx: ForwardContext) -> None:
        """Move the states beyond the memory into the compressed memory, per layer (see the
        module's docstring); in training add the attention-reconstruction loss."""
        keep, ckeep = ((self.mem_len, self.cmem_len) if self.training
                       else (self.eval_mem_len, self.eval_cmem_len))
        trains = self.training and torch.is_grad_enabled() and self.compressors[0].trainable
        with_loss = trains and self.reconstruction_weight > 0
        new_memory, new_compressed, losses = [], [], []
        for i, h in enumerate(inputs):
            layer, h = 0 if self.share_blocks else i, h.detach()  # SG(.): (B, T, D)
            states = h if memory is None else torch.cat([memory[i], h], dim=1)  # (B, M + T, D)
            cm = h[:, :0] if compressed is None else compressed[i]  # (B, Nc, D)
            overflow = max(0, states.shape[1] - keep)
            n_old = overflow - overflow % self.rate if ckeep else overflow
            old = states[:, :n_old]  # (B, n_old, D): the oldest states, leaving the memory
            if ckeep and n_old:
                f_c = self.compressors[layer]
                usage = (self._usage(layer, cm, states, h.shape[1], ctx)[:, :n_old]
                         if f_c.needs_usage else None)  # (B, n_old)
                with torch.set_grad_enabled(with_loss):
                    new = f_c(old, usage).to(old.dtype)  # (B, n_old / c, D)
                if with_loss:
                    losses.append(self.reconstruction_loss(layer, h, old, new))
                cm = torch.cat([cm, new.detach()], dim=1)
            new_memory.append(states[:, n_old:].clone())  # (B, <= keep + c - 1, D)
            new_compressed.append(_last(cm, ckeep).clone())  # (B, <= ckeep, D)
        self._memory[self.training], self._compressed[self.training] = new_memory, new_compressed
        if trains:
            idle = sum(p.sum() for p in self.compressors.parameters()) * 0.0  # DDP: every grad
            if not losses:
                ctx.add_auxiliary_loss(idle)
                return
            total = sum(losses)  # L_attn, summed over the layers
            ctx.add_auxiliary_loss(idle + self.reconstruction_weight * total)
            self.last_reconstruction = total.detach()

    def _attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                causal: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Content-only attention of q (B, H, T, Dh) over k, v (B, H_kv, S, Dh): the output
        (B, H, T, Dh) and the weights (B, H, T, S); causal: queries are the last T keys."""
        attention = self.blocks[layer].attention
        k, v = attention.share_kv_heads(k), attention.share_kv_heads(v)  # (B, H, S, Dh)
        logits = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (B, H, T, S)
        if causal:
            t, s = q.shape[2], k.shape[2]
            later = torch.ones(t, s, dtype=torch.bool, device=q.device).triu(s - t + 1)
            logits = logits.masked_fill(later, float("-inf"))
        weights = logits.softmax(dim=-1)
        return weights @ v, weights

    def reconstruction_loss(self, layer: int, h: torch.Tensor, old: torch.Tensor,
                            new: torch.Tensor) -> torch.Tensor:
        """mean || attn(h, old) - attn(h, new) ||^2 for parameter layer ``layer``: h (B, T, D)
        its input states, old (B, n, D) the states being compressed, new (B, n / c, D) their
        compression; all raw (before the attention's input norm).  Gradients reach ``new``
        only (and through it f_c), never the block's parameters."""
        block = self.blocks[layer]
        norm, attention = block.norms["attention"]["input"], block.attention
        with torch.no_grad():
            q = _constant(attention, "project", _constant(norm, "forward", h))[0]  # (B, H, T, Dh)
            k, v = _constant(attention, "project_keys_values", _constant(norm, "forward", old))
            target = self._attend(layer, q, k, v)[0]  # (B, H, T, Dh)
        k, v = _constant(attention, "project_keys_values", _constant(norm, "forward", new))
        return (self._attend(layer, q, k, v)[0] - target).pow(2).mean()

    @torch.no_grad()
    def _usage(self, layer: int, cm: torch.Tensor, states: torch.Tensor, t: int,
               ctx: ForwardContext) -> torch.Tensor:
        """``most_used``'s usage of ``states`` = [m; h] (B, M + T, D): the mean content-only
        attention weight each received from the segment's T queries over keys [cm; m; h]."""
        block = self.blocks[layer]
        norm, attention = block.norms["attention"]["input"], block.attention
        keys = _constant(norm, "forward", torch.cat([cm, states], dim=1))  # (B, S, D)
        q = _constant(attention, "project", keys[:, -t:])[0]  # (B, H, T, Dh)
        k, v = _constant(attention, "project_keys_values", keys)
        weights = self._attend(layer, q, k, v, causal=ctx.causal)[1]  # (B, H, T, S)
        return weights.mean(dim=(1, 2))[:, cm.shape[1]:]  # (B, M + T)

    def report(self) -> dict[str, float]:
        if self.last_reconstruction is None:
            return {}
        return {"reconstruction_loss": self.last_reconstruction.item()}
