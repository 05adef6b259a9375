"""The ``attention`` group: each token mixer's own keys (``conf/attention/<name>.yaml``).

A new option adds one entry to :data:`OPTIONS` -- ``"name": {}`` when its YAML has only
``name`` and ``label`` -- and ``tests/test_schema.py`` fails until its YAML and its entry agree.
"""

from __future__ import annotations

from xformer_bench.schema.group import NAMED, Group
from xformer_bench.schema.keys import Bool, Choice, Either, Float, Int, Seq

FAMILIES = ("dense", "fixed_pattern", "fixed_pattern+memory", "learnable_pattern", "low_rank",
            "downsampling", "kernel", "memory", "synthetic", "transposed", "attention_free",
            "convolution", "recurrent")
"""The families of :data:`xformer_bench.attention.FAMILIES` (a test keeps the two equal)."""
DROPOUT = Float("attention-probability dropout", 0, 1, open_hi=True)
PATTERN_MODES = ("interleaved", "merged", "multihead")
PATTERN_MODE = Choice("interleaved (by layer) | merged (one softmax over both) | multihead "
                      "(half the heads each)", PATTERN_MODES)
STRIDE = Either("l: the block length of the pattern; auto: about sqrt(data.seq_len)",
                (Int("", 1), Choice("", ("auto",))))
CHUNK = Int("causal prefix sums, this many positions at a time", 1)
WINDOW = Int("keys per query: the previous `window` (causal), or half each side", 1)
CONVOLUTION = {
    "kernel_size": Int("the kernel width at every layer; odd for bidirectional use", 1),
    "kernel_sizes": Seq("per-layer widths, layer l takes kernel_sizes[min(l, len - 1)]",
                        item=Int("", 1), null="attention.kernel_size everywhere"),
    "weight_dropout": Float("DropConnect on the normalised kernels", 0, 1, open_hi=True),
}
DELTA_RULE = {
    "expand_k": Float("key width / model.d_model, split over the heads", 0, open_lo=True),
    "expand_v": Float("value width / model.d_model", 0, open_lo=True),
    "conv_size": Int("width of the causal depth-wise convolutions on q, k, v", 1),
    "use_gate": Bool("an output gate SiLU(W_g x) after the output RMSNorm"),
    "norm_eps": Float("the per-head output RMSNorm's epsilon", 0, open_lo=True),
    "chunk_size": Int("positions per chunk of the WY form; the result does not depend on it", 1),
}

OPTIONS = {
    "adaptive_span": {
        "max_span": Int("S: the longest span a head can learn", 1),
        "ramp": Int("R: width of the soft mask's ramp", 1),
        "span_penalty": Float("lambda of the L1 span penalty added to the loss", 0),
        "init_span": Float("z at start, in positions, at most attention.max_span", 0),
    },
    "axial": {
        "rows": Int("rows of the layout", 1, null="from cols, or ceil(sqrt(T)) columns"),
        "cols": Int("the row width", 1, null="from rows, or ceil(sqrt(T))"),
        "mode": PATTERN_MODE,
    },
    "bigbird": {
        "block": Int("positions per block", 1),
        "window_blocks": Int("sliding blocks per query block", 1),
        "global_blocks": Int("global blocks, the first ones", 0),
        "random_blocks": Int("random key blocks per query block, fixed per layer", 0),
        "seed": Int("with the layer index, seeds the random blocks", 0),
    },
    "block_local": {
        "block": Int("query block length", 1),
        "memory": Int("earlier positions the block also attends (each side when "
                      "bidirectional)", 0),
    },
    "clustered": {
        "n_clusters": Int("query clusters per sequence and head", 1),
        "bits": Int("hash bits: random hyperplanes for the Hamming k-means", 1, 63),
        "iterations": Int("Lloyd iterations", 1),
        "improved": Bool("i-clustered: exact softmax over the centroid's top-k keys"),
        "topk": Int("keys recomputed exactly per query when improved", 1),
    },
    "deltanet": DELTA_RULE,
    "dilated": {"window": WINDOW, "dilation": Int("every dilation-th position", 1)},
    "dynamic_conv": CONVOLUTION,
    "fixed": {
        "stride": STRIDE,
        "summary": Int("c: the last c positions of every block are seen by all", 1),
        "mode": PATTERN_MODE,
    },
    "fnet": {"fft_norm": Choice("torch.fft norm: backward is the paper's unscaled transform",
                                ("backward", "ortho", "forward"))},
    "full": {"dropout": DROPOUT},
    "gaussian_prior": {
        "init_sigma": Float("initial width of each head's prior", 0, open_lo=True),
        "window": Int("only the nearest `window` keys", 1, null="every pair"),
    },
    "gated_deltanet": DELTA_RULE,
    "gla": {
        "n_heads": Int("heads", 1),
        "expand_k": Float("d_k = d_model x expand_k, split over the heads", 0, open_lo=True),
        "expand_v": Float("d_v = d_model x expand_v, split over the heads", 0, open_lo=True),
        "gate_low_rank": Int("the rank of the decay gate's projection", 1),
        "gate_temperature": Float("tau: alpha = sigmoid(.)^(1/tau)", 0, open_lo=True),
        "chunk_size": Int("positions computed in parallel, the state carried between chunks", 1),
        "eps": Float("the per-head LayerNorm's epsilon", 0, open_lo=True),
    },
    "gmlp": {"d_ffn": Int("width of the up-projection, split in even halves", 2,
                          null="6 model.d_model")},
    "grouped_query": {
        "n_kv_heads": Int("shared key/value heads, dividing model.n_heads", 1),
        "dropout": DROPOUT,
    },
    "hyena": {
        "filter_order": Int("W: width of the FFN that defines the implicit filter", 1),
        "emb_dim": Int("positional features fed to the FFN: t, then cosine and sine pairs", 3),
        "sine_freq": Float("omega of the FFN's sin(omega x) at start", 0, open_lo=True),
        "short_filter": Int("width of the causal depth-wise convolution on the projections", 1),
        "position_scale": Int("L in t = l / (L - 1): the length the filter's positions scale "
                              "to", 2, null="data.seq_len, the training length"),
        "fast_decay_pct": Float("t at which the fastest channel's window reaches decay_target",
                                0, open_lo=True),
        "slow_decay_pct": Float("t at which the slowest channel's window reaches decay_target",
                                0, open_lo=True),
        "decay_target": Float("the window's value at those t", 0, 1, open_lo=True,
                              open_hi=True),
        "dropout": Float("dropout on x1 * v before the long convolution", 0, 1, open_hi=True),
        "chunk_size": Int("the causal FFT convolution's diagonal blocks, in positions", 1),
    },
    "lightweight_conv": CONVOLUTION,
    "linear": {
        "chunk_size": CHUNK,
        "eps": Float("added to the normaliser", 0, open_lo=True),
    },
    "linformer": {
        "k": Int("projected length of keys and values", 1),
        "sharing": Choice("which projections are shared; layerwise is refused",
                          ("none", "headwise", "key_value", "layerwise")),
    },
    "local": {"window": WINDOW},
    "longformer": {
        "window": WINDOW,
        "n_global": Int("global tokens: the first n_global positions", 0),
        "dilation": Int("every dilation-th position; 1: no dilation", 1),
    },
    "lsh": {
        "chunk_size": Int("m: sorted positions per chunk", 1),
        "n_hashes": Int("hashing rounds in training", 1),
        "n_buckets": Int("hash buckets: 1 or an even number", 1,
                         null="2 data.seq_len / attention.chunk_size"),
        "eval_n_hashes": Int("hashing rounds in evaluation", 1, null="attention.n_hashes"),
    },
    "lsra": {
        **CONVOLUTION,
        "conv": Choice("the convolution branch", ("lightweight", "dynamic")),
        "dropout": DROPOUT,
    },
    "mamba2": {
        "expand": Int("d_inner = expand x d_model", 1),
        "head_dim": Int("P: channels per head, dividing d_inner", 1),
        "d_state": Int("N: the state size per channel", 1),
        "n_groups": Int("groups of B and C, dividing the heads", 1),
        "d_conv": Int("the short causal depthwise convolution's width", 1),
        "chunk_size": Int("positions computed in parallel, the state carried between chunks", 1),
        "a_init_range": Seq("A = -uniform(lo, hi) at initialisation, 0 < lo <= hi",
                            item=Float("", 0, open_lo=True), length=2),
        "dt_min": Float("the least initial dt (log-uniform draw), at most dt_max", 0,
                        open_lo=True),
        "dt_max": Float("the largest initial dt (log-uniform draw)", 0, open_lo=True),
        "dt_init_floor": Float("the least initial dt after the draw", 0, open_lo=True),
        "eps": Float("the gated RMSNorm's epsilon", 0, open_lo=True),
    },
    "memory_compressed": {"compression": Int("keys and values compressed by this stride", 1)},
    "mixer": {"token_hidden": Int("the token-mixing MLP's width (bidirectional only unless "
                                  "data.seq_len)", 1, null="data.seq_len")},
    "multi_query": {"dropout": DROPOUT},
    "nystromformer": {
        "n_landmarks": Int("segment-mean landmarks", 1),
        "pinv_iterations": Int("iterations of the Moore-Penrose pseudo-inverse", 0),
        "conv_kernel": Int("the depth-wise convolution skip on the values, odd; 0: none", 0),
    },
    "performer": {
        "n_features": Int("m random features", 1),
        "redraw_interval": Int("training calls between redraws", 1),
        "kernel": Choice("softmax: FAVOR+ positive features; relu: Performer-ReLU",
                         ("softmax", "relu")),
        "chunk_size": CHUNK,
    },
    "persistent_memory": {
        "n_persistent": Int("learned key/value pairs per head", 0),
        "dropout": DROPOUT,
    },
    "retnet": {
        "head_dim": Int("the paper's query/key width per head (256): d_model / head_dim heads",
                        2, null="the model's heads"),
        "n_heads": Either("heads, each d_model / n_heads wide (even); model: max(model.n_heads, "
                          "d_model / head_dim)", (Int("", 1), Choice("", ("model",))),
                          null="d_model / head_dim, at least 1"),
        "expand_v": Float("W_V and W_G are d_model x expand_v d_model", 0, open_lo=True),
        "chunk_size": Int("positions computed in parallel, the state carried between chunks", 1),
        "eps": Float("the per-head group norm's epsilon", 0, open_lo=True),
    },
    "routing": {
        "n_clusters": Int("k-means clusters", 1, null="ceil(data.seq_len / attention.window)"),
        "window": Int("keys per cluster block", 1),
        "local_fraction": Float("the share of heads doing local attention", 0, 1),
        "local_window": Int("local blocks: each attends to itself and the previous one", 1),
        "decay": Float("EMA decay of the k-means centroids", 0, 1, open_hi=True),
    },
    "s4d": {
        "d_state": Int("N: the state size per channel, N / 2 complex modes (even)", 2),
        "dt_min": Float("log dt ~ U[log dt_min, log dt_max] per channel", 0, open_lo=True),
        "dt_max": Float("see attention.dt_min, at least it", 0, open_lo=True),
        "dropout": Float("dropout after the GELU, one mask per channel", 0, 1, open_hi=True),
        "chunk_size": Int("the causal FFT convolution's diagonal blocks, in positions", 1),
    },
    "sinkhorn": {
        "block": Int("positions per sorted block", 1),
        "sinkhorn_iters": Int("normalisations in log space; 0: a softmax over blocks", 0),
        "temperature": Float("tau of Gumbel-Sinkhorn", 0, open_lo=True),
    },
    "strided": {"stride": STRIDE, "mode": PATTERN_MODE},
    "synthesizer": {
        "mode": Choice("how the attention weights are synthesized",
                       ("dense", "random", "factorized_dense", "factorized_random")),
        "mix_with_dot_product": Bool("mix with dot-product attention by a learned alpha"),
        "rank": Int("k of factorized_random", 1),
        "factor": Int("a of factorized_dense, a b = data.seq_len", 1,
                      null="the largest divisor <= sqrt(data.seq_len)"),
        "trainable": Bool("false: the paper's Fixed Random, in the random modes"),
    },
    "talking_heads": {},
    "weighted": {"d_ff_branch": Int("inner width of each branch's feed-forward", 1,
                                    null="model.d_ff / model.n_heads")},
    "xcit": {"dropout": DROPOUT},
}

ATTENTION = Group("attention", common={
    **NAMED, "family": Choice("the option's family of efficient attention (Tay et al. 2022)",
                              FAMILIES, computes=False)}, options=OPTIONS)
