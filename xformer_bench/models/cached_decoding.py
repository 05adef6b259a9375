"""Which causal LMs can decode incrementally with a :class:`~xformer_bench.core.decode_cache.DecodeCache`,
and in words why the others cannot (they are decoded by recomputing the window,
:mod:`xformer_bench.sample`).

The model allows it when its stack applies its blocks one after another (``stack=standard``;
Transformer-XL memory, adaptive depth and funnels apply them otherwise), its position scheme can
embed and rotate at an offset, and every block's token mixer declares a decode state other than
``none`` (``TokenMixer.decode_state``, :data:`~xformer_bench.core.decode_cache.DECODE_STATES`).
Multi-head attention keeps keys and values when its kernel attends causally over more keys than
queries and lays its pattern out by absolute position (``AttentionKernel.decodes_by_position``:
axial attention lays its grid over the queries it is given, so it does not):
``tests/test_cached_decode.py`` checks every admitted option against the forward pass.
"""

from __future__ import annotations

from torch import nn


def cache_blocker(model: nn.Module) -> str | None:
    """Why ``model`` (a TransformerLM) cannot decode with a cache, in words naming the option;
    None when it can."""
    from xformer_bench.attention.multi_head import MultiHeadAttention
    from xformer_bench.stacks.standard import StandardStack

    if type(model.stack) is not StandardStack:
        return f"{type(model.stack).__name__} applies its blocks otherwise (stack=standard caches)"
    if not model.position.decodes_with_cache():
        return f"position {type(model.position).__name__} cannot rotate at an offset"
    for block in model.stack.blocks:
        mixer = block.attention
        if getattr(mixer, "decode_state", "none") != "none":
            continue
        if isinstance(mixer, MultiHeadAttention) and type(mixer) is MultiHeadAttention:
            return (f"attention kernel {type(mixer.kernel).__name__} does not attend causally "
                    "over cached keys")
        return f"token mixer {type(mixer).__name__} has no cacheable keys or state"
    return None
