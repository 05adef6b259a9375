"""The token mixer of an ``attention`` option: a kernel wrapped in multi-head attention, or a
mixer the option builds whole (see :mod:`xformer_bench.attention`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from xformer_bench.attention import AttentionKernel, TokenMixer
from xformer_bench.attention.multi_head import MultiHeadAttention
from xformer_bench.core.dims import ModelDims
from xformer_bench.registry import ATTENTION


def build_token_mixer(spec: Mapping[str, Any], dims: ModelDims) -> TokenMixer:
    built = ATTENTION.build(spec, dims=dims)
    if isinstance(built, TokenMixer):
        return built
    if isinstance(built, AttentionKernel):
        return MultiHeadAttention(dims, built)
    raise TypeError(f"attention '{spec['name']}' built a {type(built).__name__}: an attention "
                    "builder returns an AttentionKernel or a TokenMixer (xformer_bench.attention)")
