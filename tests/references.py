"""Explicit references every equivalence test compares against: written for clarity, not speed.

* :func:`masked_softmax_attention` -- softmax attention over a materialised (T, S) score matrix
  restricted to the allowed (query, key) pairs; the queries are the last T of the S key
  positions (the house's convention, so cached keys come first); a query with no allowed key
  gives 0.  Any sparse pattern is this with its mask.
* :func:`query_key_positions`, :func:`causal_mask`, :func:`band_mask` -- the masks built from
  absolute positions.
* :func:`kernel_attention` -- linear (kernelised) attention over a materialised weight matrix
  phi(q) phi(k)^T, with the same masks and conventions; :func:`kernel_attention_recurrence` --
  the causal form as the recurrence it is: a running sum of phi(k) v^T and of phi(k), one
  position at a time.
* :func:`decode_step_by_step` -- a language model's log-probabilities decoded one token at a
  time through its key/value cache, for comparison with one forward pass.
* :data:`BOUNDARY_KWARGS` -- per attention option, settings that put its window, block, chunk
  or cluster edges a few positions apart, so leak and decoding tests cross every one of them
  at :data:`BOUNDARY_SEQ_LEN`.
"""

from __future__ import annotations

import math

import torch


def query_key_positions(t: int, s: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Query positions (T, 1) and key positions (1, S): the queries are the last T of S."""
    return torch.arange(s - t, s)[:, None], torch.arange(s)[None, :]


def causal_mask(t: int, s: int) -> torch.Tensor:
    """(T, S) bool: key j is allowed for query i when j <= i's position."""
    p, j = query_key_positions(t, s)
    return j <= p


def band_mask(t: int, s: int, before: int, after: int = 0, dilation: int = 1) -> torch.Tensor:
    """(T, S) bool: keys within ``before`` steps back and ``after`` steps ahead (in units of
    ``dilation`` positions, on the query's residue class)."""
    p, j = query_key_positions(t, s)
    return (((p - j) % dilation == 0) & (j >= p - before * dilation)
            & (j <= p + after * dilation))


def masked_softmax_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                             allowed: torch.Tensor | None = None, *, causal: bool = False,
                             bias: torch.Tensor | None = None,
                             padding: torch.Tensor | None = None,
                             scale: float | None = None) -> torch.Tensor:
    """softmax(q k^T * scale + bias, over the allowed keys) v: q (B, H, T, Dh), k and v
    (B, H, S, Dh); ``allowed`` broadcastable to (B, H, T, S) bool (None: every pair);
    ``causal`` also masks keys after the query; ``padding`` (B, S) bool marks keys no query may
    see; ``bias`` is added to the scores.  A query with no allowed key gives 0.  ``scale``
    defaults to 1/sqrt(Dh)."""
    t, s = q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = q @ k.transpose(-1, -2) * scale  # (B, H, T, S)
    if bias is not None:
        scores = scores + bias
    mask = torch.ones(t, s, dtype=torch.bool) if allowed is None else allowed.bool()
    if causal:
        mask = mask & causal_mask(t, s)
    if padding is not None:
        mask = mask & ~padding[:, None, None, :]
    mask = mask.expand_as(scores)
    some = mask.any(-1, keepdim=True)
    weights = torch.where(mask, scores, float("-inf"))
    weights = torch.where(some, weights, 0.0).softmax(-1) * some  # (B, H, T, S)
    return weights @ v


def kernel_attention_recurrence(phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor,
                                eps: float = 1e-6) -> torch.Tensor:
    """Causal linear attention (Katharopoulos et al. 2020, eq. 9) as a recurrence over time:
    S_i = S_{i-1} + phi(k_i) v_i^T, z_i = z_{i-1} + phi(k_i), out_i = phi(q_i) S_i /
    (phi(q_i) z_i + eps).  phi_q (B, H, T, F), phi_k (B, H, T, F), v (B, H, T, Dv)."""
    b, h, t, f = phi_q.shape
    state = phi_q.new_zeros(b, h, f, v.shape[-1])  # (B, H, F, Dv)
    normaliser = phi_q.new_zeros(b, h, f)  # (B, H, F)
    out = []
    for i in range(t):
        state = state + phi_k[:, :, i, :, None] * v[:, :, i, None, :]
        normaliser = normaliser + phi_k[:, :, i]
        numerator = torch.einsum("bhf,bhfd->bhd", phi_q[:, :, i], state)
        denominator = torch.einsum("bhf,bhf->bh", phi_q[:, :, i], normaliser)[..., None]
        out.append(numerator / (denominator + eps))
    return torch.stack(out, dim=2)  # (B, H, T, Dv)


@torch.no_grad()
def decode_step_by_step(model: torch.nn.Module, tokens: torch.Tensor,
                        prefix: int = 1) -> torch.Tensor:
    """Log-probabilities (B, T, V) of a TransformerLM fed ``tokens`` (B, T) through its key/value
    cache: the first ``prefix`` tokens in one step, then one token per step."""
    from xformer_bench.core.decode_cache import DecodeCache

    cache = DecodeCache()
    steps = [model.decode(tokens[:, :prefix], cache)]
    for i in range(prefix, tokens.shape[1]):
        steps.append(model.decode(tokens[:, i:i + 1], cache))
    return torch.cat(steps, dim=1)


def kernel_attention(phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor,
                     allowed: torch.Tensor | None = None, *, causal: bool = False,
                     padding: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    """Linear (kernelised) attention over a materialised (T, S) weight matrix, the masks as in
    :func:`masked_softmax_attention`: W = phi(q) phi(k)^T over the allowed pairs,
    out_i = sum_j W_ij v_j / (sum_j W_ij + eps).  phi_q (B, H, T, F), phi_k (B, H, S, F),
    v (B, H, S, Dv); the queries are the last T of the S key positions; a query with no allowed
    key gives 0.  Causal with T = S, it is :func:`kernel_attention_recurrence`."""
    t, s = phi_q.shape[-2], phi_k.shape[-2]
    weights = phi_q @ phi_k.transpose(-1, -2)  # (B, H, T, S)
    mask = torch.ones(t, s, dtype=torch.bool) if allowed is None else allowed.bool()
    if causal:
        mask = mask & causal_mask(t, s)
    if padding is not None:
        mask = mask & ~padding[:, None, None, :]
    weights = weights * mask
    some = mask.expand_as(weights).any(-1, keepdim=True)
    out = (weights @ v) / (weights.sum(-1, keepdim=True) + eps)
    return torch.where(some, out, 0.0)


# ----------------------------------------------------- small boundaries

BOUNDARY_KEYS = frozenset({
    "window", "local_window", "block", "memory", "global_blocks", "n_global", "stride",
    "summary", "rows", "cols", "chunk_size", "n_buckets", "n_clusters", "n_landmarks",
    "conv_kernel", "compression", "kernel_size", "max_span", "ramp"})
"""YAML keys of the attention group that place a boundary (a window's edge, a block's, a
chunk's, a cluster's, a kernel's reach): an option with any of them has a BOUNDARY_KWARGS
entry, so that tests cross its boundaries at a short length."""

BOUNDARY_SEQ_LEN = 20
"""The length the BOUNDARY_KWARGS entries are sized for: 4 to 7 of their boundaries."""

BOUNDARY_KWARGS: dict[str, dict] = {
    "adaptive_span": {"max_span": 16, "ramp": 2, "init_span": 3.0},  # reach 5, a band
    "axial": {"cols": 4},
    "bigbird": {"block": 3, "window_blocks": 3, "global_blocks": 1, "random_blocks": 1},
    "block_local": {"block": 4, "memory": 4},
    "clustered": {"n_clusters": 3, "topk": 4},
    "deltanet": {"chunk_size": 4},
    "dilated": {"window": 4, "dilation": 2},
    "dynamic_conv": {"kernel_size": 3},
    "fixed": {"stride": 4, "summary": 2},
    "gated_deltanet": {"chunk_size": 4},
    "gaussian_prior": {"window": 5},
    "gla": {"chunk_size": 4},
    "lightweight_conv": {"kernel_size": 3},
    "linear": {"chunk_size": 4},
    "local": {"window": 5},
    "longformer": {"window": 5, "n_global": 1},
    "lsh": {"chunk_size": 4, "n_hashes": 2, "n_buckets": 4},
    "lsra": {"kernel_size": 3},
    "mamba2": {"chunk_size": 4},
    "memory_compressed": {"compression": 3},
    "nystromformer": {"n_landmarks": 4, "conv_kernel": 3},
    "performer": {"chunk_size": 4, "n_features": 16},
    "retnet": {"chunk_size": 4},
    "routing": {"n_clusters": 3, "window": 4, "local_window": 4},
    "sinkhorn": {"block": 4},
    "s4d": {"chunk_size": 4},
    "hyena": {"chunk_size": 4},
    "strided": {"stride": 4},
}
"""attention name -> YAML keys that put its boundaries a few positions apart (window 4-5,
block 3-4, stride 4, chunk 4, 3 clusters, kernel width 3), for BOUNDARY_SEQ_LEN positions."""

BF16_DEFAULT_TOLERANCE = (0.03, 0.08)
"""Relative L2 error under bf16 autocast against float32, (output, worst gradient), for an option
without an entry in BF16_TOLERANCE: bf16 keeps 8 significant bits (0.4 % a rounding), and a
two-layer model compounds a few of them."""

BF16_TOLERANCE: dict[str, tuple[float, float, str]] = {
    "attention=lsh": (0.45, 0.7, "hashing is discontinuous: a bf16 projection moves q.R across a "
                      "bucket boundary and the query attends another set of keys"),
    "ffn=moe": (0.03, 0.45, "top-2 routing with a capacity: a token near a tie of the float32 "
                "router's scores (computed from bf16 activations) goes to another expert"),
    "ffn=product_key_memory": (0.03, 0.3, "top-k key selection: a key near the k-th score is "
                               "swapped for another, and its value row gets the gradient"),
    "stack=evolved": (0.03, 0.15, "the ReLU after the decoder's separable 11x1 convolution: a "
                      "bf16-rounded pre-activation near 0 switches a unit on or off, and the "
                      "convolution's weights get another gradient (measured 0.091 on it)"),
}
"""``group=option`` -> (output, gradient) relative error allowed under bf16, and why it is looser
than BF16_DEFAULT_TOLERANCE."""


def bf16_tolerance(key: str) -> tuple[float, float]:
    return BF16_TOLERANCE.get(key, BF16_DEFAULT_TOLERANCE)[:2]

DECLARED_HOST_SYNCS: dict[str, dict[str, str]] = {
    "attention=adaptive_span": {
        "xformer_bench/attention/adaptive_span.py:reach":
            "the band's width is the learned reach ceil(max z) + R (Sukhbaatar et al. 2019's "
            "saving: compute follows the spans), a shape read from the device once per layer "
            "and step; a fixed width of max_span would drop the saving, a width refreshed every "
            "N steps would need a margin the spans can outgrow",
    },
    "attention=clustered": {
        "xformer_bench/attention/_ops/clustering.py:chunk_by_cluster":
            "the chunk count G is the largest sum over clusters of ceil(size / w) of the "
            "step's k-means clusters, a shape read once per layer and step; the static bound "
            "N / w + C would pad up to ~1.3x the chunks with empty ones",
    },
    "attention=routing": {
        "xformer_bench/attention/_ops/clustering.py:chunk_by_cluster":
            "routing heads: the chunk count G follows the sizes of the step's online k-means "
            "clusters (one read per layer and step; the local heads' count comes from the "
            "shapes); the static bound T / w + S / window + C would pad with empty chunks",
    },
    "stack=universal": {
        "xformer_bench/stacks/universal.py:forward":
            "ACT's early exit (Graves 2016; Dehghani et al. 2019): the loop over depth stops "
            "once every position has halted, read once per step of depth; without it every "
            "step would run max_depth applications, the saving ACT exists for",
    },
    "training": {
        "xformer_bench/tasks/optimization.py:check_finite":
            "the divergence check reads the loss every step on a CPU only (nothing to wait "
            "for); on a GPU Task.check_finite runs it every trainer.log_every_n_steps steps",
    },
    "training:log_step": {
        "lightning/fabric/utilities/apply_func.py:to_item":
            "a logger writes numbers: Lightning converts the logged values on the steps it "
            "writes, every trainer.log_every_n_steps steps (10 by default), not every step",
    },
    "training:progress_bar": {
        "lightning/fabric/utilities/apply_func.py:to_item":
            "a shown progress bar prints the step's loss, converted by Lightning at every "
            "batch end; studies and benchmarks run with trainer.progress_bar=false, where the "
            "metrics are not logged for the bar (xformer_bench.training.log_steps)",
    },
}
"""case -> {``"path:function"`` of the call that makes the host wait for the device: why it must
stay}, for tests/test_host_sync.py.  A case is ``attention=<option>`` (its causal model and
bidirectional layer), ``<group>=<option>`` for the other parts (stack, ffn, norm, position,
activation: the default model with it), ``model=vanilla`` (the default model), or the training path:
``training`` (every step), ``training:log_step`` (only the steps a logger writes),
``training:progress_bar`` (every step while a progress bar is shown).  ``path:function`` is the
innermost ``xformer_bench`` frame, or the library's where no package frame made the call."""

COMPILE_BREAKS: dict[str, str] = {
    "adaptive_span": "the band's width is the learned span read on the host (Tensor.item): the "
                     "method's saving is a data-dependent shape",
    "axial": "the factorised layout is built once per length from index tensors, and whether "
             "every query has a key is read on the host (cached; traced anew by each compile)",
    "bigbird": "the random key blocks are drawn from a torch.Generator made in the forward "
               "(one stream per seed and layer)",
    "clustered": "k-means clusters of data-dependent sizes: the chunk count is read on the host",
    "routing": "k-means clusters of data-dependent sizes (as clustered)",
}
"""attention option -> why TorchDynamo cannot capture its layer's forward as one graph; every
other option compiles with ``fullgraph=True`` (tests/test_compile.py)."""
