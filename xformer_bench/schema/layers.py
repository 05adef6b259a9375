"""The groups of the block's other parts and of the vocabulary's ends: ``norm``, ``activation``,
``position``, ``ffn``, ``stack``, ``embedding`` and ``head`` -- each option's own keys."""

from __future__ import annotations

from xformer_bench.schema.group import NAMED, Group
from xformer_bench.schema.keys import Bool, Choice, Float, Int, Seq

EPS = {"eps": Float("added for numerical stability", 0, open_lo=True)}
NORM = Group("norm", common=NAMED, options={
    "adanorm": {"scale": Float("C, the output scale", 0, open_lo=True),
                "k": Float("k of the (1 - k y) gradient scaling", 0), **EPS},
    "fixup": {},
    "layernorm": EPS,
    "powernorm": {"running_decay": Float("a: the running quadratic mean's decay", 0, 1,
                                         open_hi=True), **EPS},
    "rezero": {},
    "rezero_layernorm": EPS,
    "rezero_rmsnorm": EPS,
    "rmsnorm": EPS,
    "scalenorm": EPS,
})

GATED = {
    "d_ff_scale": Float("the hidden width as a fraction of model.d_ff; 2/3: parameter-matched",
                        0, open_lo=True),
    "bias": Bool("biases in the gated layer's projections"),
}
ACTIVATION = Group("activation", common=NAMED, options={
    **dict.fromkeys(("elu", "gelu", "relu", "selu", "sigmoid", "softplus", "squared_relu",
                     "swish"), {}),
    **dict.fromkeys(("geglu", "glu", "liglu", "reglu", "swiglu"), GATED),
})

INIT_STD = {"init_std": Float("the tables' initial standard deviation", 0, open_lo=True)}
GRID = Seq("the grid (n_1, n_2, ...) laid over the positions", item=Int("", 1),
           null="a near-square 2-D grid for data.seq_len")
BASE = Float("the sinusoids' base wavelength", 0, open_lo=True)
SHARED = Bool("one table shared by every layer")
POSITION = Group("position", common=NAMED, options={
    "alibi": {},
    "axial": {"shape": GRID,
              "dims_per_axis": Seq("width of each axis' table, summing to model.d_model",
                                   item=Int("", 1), null="an equal split"), **INIT_STD},
    "factorized": {"shape": GRID, **INIT_STD},
    "learned": {"max_len": Int("rows of the table, at least data.seq_len", 1,
                               null="data.seq_len")},
    "none": {},
    "relative": {"clip_distance": Int("k: distances beyond it share the edge embedding", 1),
                 "shared_across_layers": SHARED},
    "rotary": {"base": BASE},
    "sinusoidal": {},
    "t5": {"num_buckets": Int("relative-distance buckets", 1),
           "max_distance": Int("distances beyond it share the last bucket", 1),
           "bidirectional": Bool("buckets for keys after the query too"),
           "shared_across_layers": SHARED},
    "xl_relative": {"shared_biases": Bool("u, v shared by all layers"), "base": BASE,
                    "bias_init_std": Float("u, v's initial standard deviation", 0,
                                           open_lo=True)},
})

EXPERTS = {
    "num_experts": Int("feed-forward experts, each of the chosen activation", 1),
    "capacity_factor": Float("training: slots per expert, as a multiple of an even share", 0,
                             open_lo=True),
    "aux_loss_weight": Float("the load-balancing loss's weight", 0),
}
FFN = Group("ffn", common=NAMED, options={
    "dense": {},
    "moe": EXPERTS,
    "none": {},
    "product_key_memory": {
        "num_keys": Int("sub-keys per half: num_keys ** 2 memory slots", 1),
        "heads": Int("query heads, each with its own sub-keys", 1),
        "topk": Int("slots read per head, at most ffn.num_keys", 1),
        "key_dim": Int("query / full key width, even", 2),
    },
    "switch": EXPERTS,
})

MEMORY = {
    "mem_len": Int("states remembered per layer in training", 0, null="data.seq_len"),
    "eval_mem_len": Int("states remembered per layer in evaluation", 0, null="stack.mem_len"),
}
STACK = Group("stack", common=NAMED, options={
    "compressive": {
        **MEMORY,
        "cmem_len": Int("compressed slots per layer", 0, null="stack.mem_len"),
        "eval_cmem_len": Int("compressed slots per layer in evaluation", 0,
                             null="stack.cmem_len"),
        "compression_rate": Int("c: old states per compressed slot", 1),
        "compression": Choice("the compression function",
                              ("conv", "mean_pool", "max_pool", "most_used")),
        "reconstruction_weight": Float("the attention-reconstruction loss's weight", 0),
    },
    "conditional": {
        "target_fraction": Float("layers meant to run per token on average", 0, 1),
        "budget_weight": Float("the budget loss's weight", 0),
        "gate_bias_init": Float("b of every gate at start"),
    },
    "evolved": {},
    "funnel": {
        "factor": Int("k, the shortening factor", 1),
        "layers": Seq("[n_pre, n_short, n_post] summing to model.n_layers", item=Int("", 0),
                      length=3, null="model.n_layers / 4 at each end"),
        "pooling": Choice("how positions are shortened", ("linear", "mean")),
        "upsampling": Choice("how they are lengthened back", ("repeat", "linear")),
    },
    "recurrent": MEMORY,
    "reversible": {"ffn_chunks": Int("the feed-forward runs on this many pieces of the "
                                     "sequence (1: no chunking)", 1)},
    "standard": {},
    "universal": {
        "max_depth": Int("most steps of the one block", 1, null="2 model.n_layers"),
        "threshold": Float("halt once the summed halting probability exceeds it", 0, 1,
                           open_lo=True),
        "ponder_cost": Float("tau: the ponder cost's weight", 0),
        "halting_bias_init": Float("b of the halting unit at start"),
    },
})

CLUSTERS = {
    "cutoffs": Seq("where clusters 1, 2, ... start, as increasing fractions of the vocabulary",
                   item=Float("", 0, 1, open_lo=True, open_hi=True)),
    "factor": Int("k: cluster i is model.d_model / k^i wide", 1),
}
EMBEDDING = Group("embedding", common=NAMED, options={
    "adaptive_input": CLUSTERS,
    "factorized": {"dim": Int("E, the table's width below model.d_model", 1)},
    "lookup": {},
})

TIE = {"tie": Bool("share the input table(s) as the output matrix")}
HEAD = Group("head", common=NAMED, options={
    "adaptive_softmax": {**CLUSTERS, "projection": Bool("false: every tail at width D"),
                         **TIE},
    "mixture_of_softmaxes": {**TIE, "components": Int("K softmaxes mixed", 1)},
    "softmax": TIE,
})
