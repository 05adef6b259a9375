"""The model of a run, from the composed config and what its data declares."""

from __future__ import annotations

from typing import Any

from xformer_bench.models.dims import ModelDims
from xformer_bench.models.transformer_classifier import TransformerClassifier, encoder_length
from xformer_bench.models.transformer_lm import TransformerLM
from xformer_bench.models.transformer_seq2seq import EncoderDecoder

BODY_KEYS = ("norm_placement", "share_blocks", "residual", "residual_attention", "checkpointing")
"""The model keys every assembly's body takes."""


def _dims(config: dict[str, Any], seq_len: int, vocab_size: int) -> ModelDims:
    m = config["model"]
    return ModelDims(d_model=m["d_model"], n_heads=m["n_heads"], n_layers=m["n_layers"],
                     d_ff=m["d_ff"], seq_len=seq_len, vocab_size=vocab_size,
                     dropout=m["dropout"])


def _parts(config: dict[str, Any]) -> tuple[dict, ...]:
    return tuple(config[g] for g in ("attention", "norm", "activation", "position", "ffn",
                                     "stack"))


def build_model(config: dict[str, Any], vocab_size: int) -> TransformerLM:
    m = config["model"]
    return TransformerLM(
        _dims(config, config["data"]["seq_len"], vocab_size), *_parts(config),
        tie_embeddings=m["tie_embeddings"], embedding_dim=m["embedding_dim"], output=m["output"],
        mos_components=m["mos_components"], **{k: m[k] for k in BODY_KEYS},
    )


def build_classifier(config: dict[str, Any], datamodule) -> TransformerClassifier:
    """The encoder classifier over the inputs ``datamodule`` declares (see
    :mod:`xformer_bench.data`: ``input_kind``, ``num_classes``, ``vocab_size`` / ``pad_id`` or
    ``image_shape``)."""
    m = config["model"]
    kind = datamodule.input_kind
    image_shape = tuple(datamodule.image_shape) if kind == "image" else None
    length = encoder_length(kind, config["data"]["seq_len"], image_shape, m["patch_size"],
                            m["pool"])
    return TransformerClassifier(
        _dims(config, length, getattr(datamodule, "vocab_size", 0) if kind == "tokens" else 0),
        *_parts(config), num_classes=datamodule.num_classes, input_kind=kind,
        image_shape=image_shape, patch_size=m["patch_size"],
        pad_id=getattr(datamodule, "pad_id", None), pool=m["pool"],
        embedding_dim=m["embedding_dim"], **{k: m[k] for k in BODY_KEYS},
    )


def build_seq2seq(config: dict[str, Any], datamodule) -> EncoderDecoder:
    """The encoder-decoder over the data's shared vocabulary (``vocab_size``, ``pad_id``)."""
    m = config["model"]
    return EncoderDecoder(
        _dims(config, config["data"]["seq_len"], datamodule.vocab_size), *_parts(config),
        pad_id=datamodule.pad_id, tie_embeddings=m["tie_embeddings"],
        embedding_dim=m["embedding_dim"], **{k: m[k] for k in BODY_KEYS},
    )
