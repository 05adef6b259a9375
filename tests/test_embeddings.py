"""Embedding and output variants: factorised embeddings, tying, mixture of softmaxes, sharing."""

from __future__ import annotations

import pytest
import torch

from conftest import compose_config
from xformer_bench.models.build import build_model
from xformer_bench.core.dims import ModelDims
from xformer_bench.embedding.factorized import FactorizedEmbedding
from xformer_bench.embedding.lookup import LookupEmbedding
from xformer_bench.heads.mixture_of_softmaxes import MixtureOfSoftmaxes
from xformer_bench.models.transformer_lm import TransformerLM

PARTS = ({"name": "full"}, {"name": "layernorm"}, {"name": "gelu"}, {"name": "sinusoidal"})


def _lm(dims: ModelDims, **options) -> TransformerLM:
    torch.manual_seed(0)
    return TransformerLM(dims, *PARTS, **options)


def test_factorised_embedding_has_v_by_e_plus_e_by_d_parameters():
    emb = FactorizedEmbedding(256, 64, dim=16)
    assert sum(p.numel() for p in emb.parameters()) == 256 * 16 + 16 * 64
    tokens = torch.tensor([[3, 7]])
    expected = emb.table.weight[tokens] @ emb.project.weight.T
    torch.testing.assert_close(emb(tokens), expected)


def test_tied_head_shares_the_embedding_matrix_and_untied_does_not(tiny_dims):
    tied, untied = _lm(tiny_dims), _lm(tiny_dims, head={"name": "softmax", "tie": False})
    assert tied.head.vocab.weight is tied.embedding.table.weight
    assert untied.head.vocab.weight is not untied.embedding.table.weight
    assert untied.num_parameters() - tied.num_parameters() == 256 * tiny_dims.d_model


def test_mixture_of_softmaxes_is_a_normalised_mixture_computed_by_hand():
    torch.manual_seed(0)
    emb = LookupEmbedding(11, 8)
    head = MixtureOfSoftmaxes(emb, 8, tie=True, components=3)
    h = torch.randn(2, 5, 8)
    log_p = head(h)  # (B, T, V)
    torch.testing.assert_close(log_p.exp().sum(-1), torch.ones(2, 5))
    prior = (h @ head.prior.weight.T).softmax(-1)  # (B, T, K)
    contexts = torch.tanh(h @ head.contexts.weight.T + head.contexts.bias).view(2, 5, 3, 8)
    logits = contexts @ emb.table.weight.T
    expected = (prior.unsqueeze(-1) * logits.softmax(-1)).sum(2)
    torch.testing.assert_close(log_p.exp(), expected, atol=1e-6, rtol=1e-5)


def test_block_sharing_keeps_one_block_of_parameters(tiny_dims):
    shared, separate = _lm(tiny_dims, share_blocks=True), _lm(tiny_dims)
    assert len(shared.blocks) == 1 and len(separate.blocks) == tiny_dims.n_layers
    block = sum(p.numel() for p in separate.blocks[0].parameters())
    assert separate.num_parameters() - shared.num_parameters() == block * (tiny_dims.n_layers - 1)


@pytest.mark.parametrize("preset", ["untied_embeddings", "factorized_embedding",
                                    "mixture_of_softmaxes", "shared_blocks"])
def test_embedding_presets_build_train_and_stay_causal(preset):
    config = compose_config(f"model={preset}", "data.seq_len=16", "model.d_model=32",
                            "model.n_heads=2", "model.d_ff=64", "model.n_layers=2")
    model = build_model(config, vocab_size=256)
    tokens = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    log_p = model(tokens)
    torch.nn.functional.nll_loss(log_p.flatten(0, 1), tokens.flatten()).backward()
    changed = tokens.clone()
    changed[:, 9] = (changed[:, 9] + 1) % 256
    with torch.no_grad():
        torch.testing.assert_close(model(tokens)[:, :9], model(changed)[:, :9])


def test_depth_presets_are_parameter_matched_to_vanilla():
    counts = {p: build_model(compose_config(f"model={p}"), 256).num_parameters()
              for p in ("vanilla", "deep_narrow", "shallow_wide")}
    for preset in ("deep_narrow", "shallow_wide"):
        assert abs(counts[preset] / counts["vanilla"] - 1) < 0.02, counts
