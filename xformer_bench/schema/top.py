"""The keys of ``conf/config.yaml`` outside any group: the run's seed and name, resuming, and
the ``eval``, ``paths`` and ``optim`` nodes."""

from __future__ import annotations

from xformer_bench.schema.keys import Bool, Choice, Float, FolderName, Int, Mapping, Node, Seq, Text

DECAYS = ("cosine", "linear", "constant", "inverse_sqrt")
MATCH_BY = ("d_ff", "mixer")  # xformer_bench.models.param_match.BY (a test keeps them equal)

EVAL = Node("how validation and test evaluate", keys={
    "stride": Int("sliding evaluation windows, each scoring its last `stride` bytes", 1,
                  null="whole windows"),
    "tgt_len": Int("evaluation segment of a stack with memory", 1, null="data.seq_len"),
    "lanes": Int("evaluation lanes (rows) per rank of a stack with memory", 1,
                 null="data.eval_batch_size"),
    "warm": Bool("each evaluation lane first reads the text before it, unscored"),
    "beam": Int("translate: beam size at test", 1),
    "length_penalty": Float("translate: GNMT length penalty alpha", 0),
    "max_extra_len": Int("translate: most tokens generated beyond the source length", 0),
    "val_bleu": Choice("translate: the validations that decode and score BLEU (the test "
                       "always does)", ("last", "every", "never")),
})

PATHS = Node("where files live", computes=False, keys={
    "data_dir": Text("where datasets are looked for and downloaded"),
    "results_dir": Text("run records: <results_dir>/<experiment_name>/"),
    "checkpoint_dir": Text("resume points: <checkpoint_dir>/<experiment_name>/<run_id>/",
                           null="<results_dir>/checkpoints"),
})

OPTIM = Node("the optimiser and its schedule", keys={  # the warm-up first: a rate may follow it
    "warmup_steps": Int("steps of linear warm-up", 0, says="0 or a positive integer"),
    "lr": Float("the peak learning rate", 0, open_lo=True),
    "betas": Seq("AdamW's beta1, beta2", item=Float("", 0, 1, open_hi=True), length=2),
    "eps": Float("AdamW's epsilon", 0, open_lo=True),
    "weight_decay": Float("AdamW's decoupled weight decay of the matrices", 0),
    "decay": Choice("the learning-rate schedule after warm-up", DECAYS),
    "min_lr_ratio": Float("the final learning rate as a fraction of optim.lr", 0, 1),
    "label_smoothing": Float("translate: label-smoothed cross-entropy's epsilon", 0, 1,
                             open_hi=True),
})

TOP = {
    "seed": Int("seeds model init, data order and the synthetic corpus", 0, 2 ** 32 - 1),
    "experiment_name": FolderName("names the results/<experiment_name>/ folder"),
    "resume": Text("auto: continue from this run's own last resume point; else a .ckpt of the "
                   "same configuration", null="a fresh start", computes=False),
    "skip_completed": Bool("a run whose finished record exists is not run again",
                           computes=False),
    "match_params": Node("model.d_ff (or the mixer's own width) re-solved to the parameter "
                         "count of a reference", keys={
        "reference": Mapping("the reference's choices, {GROUP: OPTION}"),
        "tolerance": Float("the largest relative difference in parameters accepted", 0, 1,
                           open_lo=True, open_hi=True),
        "by": Choice("what is re-solved: d_ff (model.d_ff, else model.d_model) or mixer (the "
                     "attention option's own width, its class's param_width)", MATCH_BY,
                     null="d_ff"),
    }, null="no matching", computes=False),  # its result is model.d_ff (or the mixer's width),
    # which counts
    "controls": Mapping("a study's rows kept as full-attention controls, {attention: [OPTION]}",
                        null="none", computes=False),
    "eval": EVAL,
    "paths": PATHS,
    "optim": OPTIM,
}
"""``conf/config.yaml``'s own keys (its groups are declared in their own modules)."""
