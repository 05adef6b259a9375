"""The model of a run, from the composed config and what its data declares."""

from __future__ import annotations

from typing import Any

from xformer_bench.errors import ConfigError
from xformer_bench.models.block_sharing import shares
from xformer_bench.models.body import DECODER, encoder_decoder_parts
from xformer_bench.models.capabilities import check_compatible
from xformer_bench.core.dims import ModelDims
from xformer_bench.models.transformer_classifier import TransformerClassifier, encoder_length
from xformer_bench.models.transformer_lm import TransformerLM
from xformer_bench.models.transformer_seq2seq import EncoderDecoder

BODY_KEYS = ("norm_placement", "share_blocks", "residual", "residual_attention", "checkpointing")
"""The model keys every assembly's body takes."""
OPTIONAL_BODY_KEYS = {"hybrid": None}
"""Body keys a preset may leave out, at the value that means "absent" (``model.hybrid``:
another token mixer at declared depths, :mod:`xformer_bench.hybrid_layout`)."""


def body_keys(m: dict[str, Any]) -> dict[str, Any]:
    """The body's keys of the model node ``m``."""
    return {**{k: m[k] for k in BODY_KEYS},
            **{k: m.get(k, default) for k, default in OPTIONAL_BODY_KEYS.items()}}


def _dims(config: dict[str, Any], seq_len: int, vocab_size: int) -> ModelDims:
    m = config["model"]
    return ModelDims(d_model=m["d_model"], n_heads=m["n_heads"], n_layers=m["n_layers"],
                     d_ff=m["d_ff"], seq_len=seq_len, vocab_size=vocab_size,
                     dropout=m["dropout"])


def _body(m: dict[str, Any], assembly: str) -> dict[str, Any]:
    """The body keys of a model with one stack; the encoder-decoder's own keys (one-sided
    sharing, transparent attention) refused in one line, as the capability check declares."""
    shares(m["share_blocks"], "encoder")  # a valid value, or one line
    check_compatible(encoder_decoder_parts(m, (assembly, frozenset())))
    return body_keys(m)


RETIRED = {"tie_embeddings": True, "embedding_dim": None, "output": "softmax",
           "mos_components": 4}
"""Model keys that became the ``embedding`` and ``head`` groups, at the value of every run that
did not set them."""


def embedding_and_head(config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``embedding`` and ``head`` nodes of ``config``; for a record's config from before
    those groups existed (``xbench-sample`` of an older run), the same choices read from its
    model keys :data:`RETIRED`."""
    if "embedding" in config and "head" in config:
        return config["embedding"], config["head"]
    m = config["model"]
    legacy = {key: m.get(key, default) for key, default in RETIRED.items()}
    dim = legacy["embedding_dim"]
    embedding = ({"name": "factorized", "dim": dim} if dim not in (None, m["d_model"])
                 else {"name": "lookup"})
    head = {"name": legacy["output"], "tie": legacy["tie_embeddings"],
            **({"components": legacy["mos_components"]}
               if legacy["output"] == "mixture_of_softmaxes" else {})}
    return embedding, head


def _parts(config: dict[str, Any]) -> tuple[dict, ...]:
    return tuple(config[g] for g in ("attention", "norm", "activation", "position", "ffn",
                                     "stack"))


def build_model(config: dict[str, Any], vocab_size: int) -> TransformerLM:
    m = config["model"]
    return TransformerLM(
        _dims(config, config["data"]["seq_len"], vocab_size), *_parts(config),
        *embedding_and_head(config), **_body(m, DECODER[0]),
    )


def _classifier_embedding(config: dict[str, Any]) -> dict[str, Any]:
    """The token inputs' embedding; a head other than the default is refused (a classifier's
    head is its class layer, not a distribution over a vocabulary)."""
    embedding, head = embedding_and_head(config)
    if head["name"] != "softmax":
        raise ConfigError(f"head={head['name']} scores a vocabulary; a classifier's output is "
                          "its class layer: drop the head choice")
    return embedding


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
        embedding=_classifier_embedding(config), **_body(m, "an encoder classifier"),
    )


def build_seq2seq(config: dict[str, Any], datamodule) -> EncoderDecoder:
    """The encoder-decoder over the data's shared vocabulary (``vocab_size``, ``pad_id``)."""
    m = config["model"]
    return EncoderDecoder(
        _dims(config, config["data"]["seq_len"], datamodule.vocab_size), *_parts(config),
        *embedding_and_head(config), pad_id=datamodule.pad_id,
        tie_encoder_embedding=m.get("tie_encoder_embedding", True),
        **body_keys(m),
        transparent_attention=bool(m.get("transparent_attention", False)),
    )
