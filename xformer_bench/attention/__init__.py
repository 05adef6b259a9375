"""Attention kernels: ``kernel(q, k, v, *, causal, bias) -> out`` over (B, H, T, Dh).

Projections live in :class:`xformer_bench.models.attention_layer.MultiHeadAttention`;
a kernel that needs parameters of its own owns them.  Builders take ``dims``
(:class:`~xformer_bench.models.dims.ModelDims`) plus the keys of their YAML.
"""
