"""The ``model`` group -- a preset's sizes and assembly keys, shared by every preset (vanilla
writes them all, the others change some) -- what input each preset is for, and the
``modification`` group (a bundle of other groups' choices: ``name`` and ``label`` only)."""

from __future__ import annotations

from xformer_bench.schema.group import NAMED, Group
from xformer_bench.schema.keys import Bool, Choice, Either, Float, Int, Node, OptionOf, Seq
from xformer_bench.schema.shapes import ANY

TRANSLATE, CLASSIFY = frozenset({"translate"}), frozenset({"classify"})  # :data:`.shapes.TASKS`

MODEL_KEYS = {
    **NAMED,
    "d_model": Int("the model width", 1),
    "n_layers": Int("blocks, per side of an encoder-decoder", 1),
    "n_heads": Int("attention heads, dividing model.d_model", 1),
    "d_ff": Int("the feed-forward layer's hidden width", 1),
    "dropout": Float("dropout on the residual branches and embeddings", 0, 1, open_hi=True),
    "norm_placement": Choice("pre: x+f(N(x)) | post: N(x+f(x)) | sandwich: x+N(f(N(x)))",
                             ("pre", "post", "sandwich")),
    "tie_encoder_embedding": Bool("encoder-decoder: the source reads the target's input table",
                                  read_by=TRANSLATE),
    "share_blocks": Either("one block's weights at every depth: true, or one side of an "
                           "encoder-decoder", (Bool(""), Choice("", ("encoder", "decoder")))),
    "transparent_attention": Bool("each decoder layer's cross-attention mixes every encoder "
                                  "layer", read_by=TRANSLATE),
    "residual": Choice("the residual connection: add, or GTrXL's GRU gate", ("add", "gru_gate")),
    "residual_attention": Bool("RealFormer: each layer adds the previous layer's attention "
                               "logits"),
    "checkpointing": Bool("recompute each block in the backward pass"),
    "pool": Choice("classifiers: the [CLS] vector's final state, or the mean over positions",
                   ("cls", "mean"), read_by=CLASSIFY),
    "patch_size": Int("image classifiers: P x P patches", 1, read_by=CLASSIFY),
    "hybrid": Node("another token mixer at declared depths", keys={
        "attention": OptionOf("the other mixer: an attention option", group="attention"),
        "every": Int("layers i with i % every == offset get it", 1,
                     null="model.hybrid.layers instead"),
        "offset": Int("see model.hybrid.every, below it", 0, null="every - 1"),
        "layers": Seq("the layers themselves, 0-based, instead of every", item=Int("", 0),
                      null="from every and offset"),
    }, null="every layer has the attention option"),
}

INPUTS = {
    "vit": ("image_classes",),
    "xcit": ("image_classes",),
    "image_transformer": ("pixel_lm",),
    **dict.fromkeys((
        "adaptive_span", "all_attention", "bigbird", "compressive_transformer", "deep_narrow",
        "dynamic_conv", "factorized_embedding", "fnet", "funnel", "gmlp", "gtrxl",
        "lightweight_conv", "linear_transformer", "linformer", "lite_transformer",
        "local_transformer", "longformer", "mambaformer", "mixture_of_softmaxes", "mlp_mixer",
        "nystromformer", "performer", "realformer", "reformer", "routing_transformer", "samba",
        "shallow_wide", "shared_blocks", "sinkhorn", "sparse_transformer", "synthesizer",
        "transformer_base",
        "transformer_xl", "universal_transformer", "untied_embeddings", "vanilla"), ANY),
}
"""What each preset (``conf/model/<name>.yaml``) is for (:data:`~.shapes.KINDS`), or
:data:`~.shapes.ANY`: a mechanism the task assembles for any input (a token mixer, a stack,
an embedding), so its paper's domain does not bind it."""

MODEL = Group("model", common=MODEL_KEYS, options=dict.fromkeys(INPUTS, {}))

MODIFICATION = Group("modification", common=NAMED, options=dict.fromkeys((
    "adaptive_input", "adaptive_softmax", "adaptive_softmax_no_projection",
    "evolved_transformer", "factorized_embeddings", "factorized_shared_embeddings",
    "mixture_of_softmaxes", "none", "rmsnorm", "rotary", "sharing", "sharing_decoder",
    "sharing_encoder", "sharing_factorized_embeddings", "sharing_factorized_shared_embeddings",
    "swiglu", "switch", "tied_decoder_embeddings", "tied_encoder_decoder_embeddings",
    "transparent_attention", "untied_embeddings", "weighted_transformer"), {}))
"""A bundle's own keys are its name and label; what it sets belongs to the groups it sets."""
