"""The model of a run, from the composed config."""

from __future__ import annotations

from typing import Any

from xformer_bench.models.dims import ModelDims
from xformer_bench.models.transformer_lm import TransformerLM


def build_model(config: dict[str, Any], vocab_size: int) -> TransformerLM:
    m = config["model"]
    dims = ModelDims(d_model=m["d_model"], n_heads=m["n_heads"], n_layers=m["n_layers"],
                     d_ff=m["d_ff"], seq_len=config["data"]["seq_len"], vocab_size=vocab_size,
                     dropout=m["dropout"])
    return TransformerLM(
        dims, config["attention"], config["norm"], config["activation"], config["position"],
        ffn=config["ffn"], stack=config["stack"], norm_placement=m["norm_placement"],
        tie_embeddings=m["tie_embeddings"], embedding_dim=m["embedding_dim"], output=m["output"],
        mos_components=m["mos_components"], share_blocks=m["share_blocks"],
        residual=m["residual"], residual_attention=m["residual_attention"],
        checkpointing=m["checkpointing"],
    )
