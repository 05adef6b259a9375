"""Embeddings and output heads as variant families: each option's equations against an explicit
computation, the head owning its loss, the tying refusals, and a tiny run of each option."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import compose_config, run_tiny
from xformer_bench.embedding.adaptive_input import AdaptiveInput
from xformer_bench.embedding.factorized import FactorizedEmbedding
from xformer_bench.embedding.lookup import LookupEmbedding
from xformer_bench.errors import ConfigError
from xformer_bench.heads.adaptive_softmax import AdaptiveSoftmax
from xformer_bench.models.build import RETIRED, build_model, embedding_and_head
from xformer_bench.core.dims import ModelDims
from xformer_bench.models.transformer_seq2seq import EncoderDecoder
from xformer_bench.results.record import run_identity
from xformer_bench.targets import IGNORE_INDEX

V, D = 40, 16
CUTOFFS = [0.25, 0.5, 0.75]  # ids 0-9 head words, tails 10-19, 20-29, 30-39
PARTS = ({"name": "full"}, {"name": "layernorm"}, {"name": "gelu"}, {"name": "sinusoidal"},
         {"name": "dense"}, {"name": "standard"})


def _adaptive_softmax(projection: bool, tie: bool = False) -> AdaptiveSoftmax:
    torch.manual_seed(0)
    head = AdaptiveSoftmax(LookupEmbedding(V, D), D, tie, CUTOFFS, 2, projection)
    for p in head.parameters():
        torch.nn.init.normal_(p)  # away from any structure an initialisation might give
    return head


def _by_hand(head: AdaptiveSoftmax, h: torch.Tensor) -> torch.Tensor:
    """Grave et al.'s p(w | h) built cluster by cluster: (N, D) -> (N, V) probabilities."""
    outputs = ([layer.weight for layer in head.outputs] if head.outputs is not None else
               [head.table.weight[a:b] for a, b in zip(head.edges, head.edges[1:])])
    head_p = torch.softmax(h @ torch.cat([outputs[0], head.clusters.weight]).T, -1)  # (N, 10+3)
    columns = [head_p[:, :10]]
    for i in range(1, 4):
        projected = h if isinstance(head.projections[i - 1], torch.nn.Identity) else \
            h @ head.projections[i - 1].weight.T  # (N, d_i)
        columns.append(head_p[:, 9 + i, None] * torch.softmax(projected @ outputs[i].T, -1))
    return torch.cat(columns, dim=1)


@pytest.mark.parametrize("projection,tie", [(True, False), (False, False), (False, True)])
def test_adaptive_softmax_is_a_distribution_equal_to_its_clusters_by_hand(projection, tie):
    head = _adaptive_softmax(projection, tie)
    h = torch.randn(3, 5, D)
    log_p = head(h)  # (B, T, V)
    torch.testing.assert_close(log_p.exp().sum(-1), torch.ones(3, 5))
    torch.testing.assert_close(log_p.exp().flatten(0, 1), _by_hand(head, h.flatten(0, 1)))


def test_adaptive_softmax_loss_scores_only_the_target_clusters_and_equals_the_full_one():
    head = _adaptive_softmax(projection=True)
    h = torch.randn(3, 7, D)
    targets = torch.randint(0, V, (3, 7))
    targets[0, :2] = IGNORE_INDEX
    full = head(h).flatten(0, 1)  # (N, V)
    for reduction in ("mean", "sum", "none"):
        expected = F.nll_loss(full, targets.flatten(), ignore_index=IGNORE_INDEX,
                              reduction=reduction)
        got = head.loss(h, targets, ignore_index=IGNORE_INDEX, reduction=reduction)
        torch.testing.assert_close(got, expected)


def test_adaptive_softmax_parameters_follow_grave_et_al():
    sizes, n = [10, 10, 10, 10], 3
    with_projection = _adaptive_softmax(projection=True)
    widths = [D, D // 2, D // 4, D // 8]  # factor 2
    assert sum(p.numel() for p in with_projection.parameters()) == \
        D * (sizes[0] + n) + sum(D * w + w * s for w, s in zip(widths[1:], sizes[1:]))
    assert sum(p.numel() for p in _adaptive_softmax(projection=False).parameters()) == D * (V + n)
    tied = _adaptive_softmax(projection=False, tie=True)  # the table's rows: only H's tail rows
    assert {id(p) for p in tied.parameters()} - {id(tied.table.weight)} == \
        {id(tied.clusters.weight)}


def test_adaptive_input_projects_each_cluster_as_computed_by_hand():
    torch.manual_seed(0)
    emb = AdaptiveInput(V, D, CUTOFFS, factor=2)
    assert [t.embedding_dim for t in emb.clusters] == [16, 8, 4, 2]
    tokens = torch.tensor([[0, 9, 10, 25, 39]])
    expected = []
    for w in tokens[0].tolist():
        i = w // 10
        expected.append(emb.projections[i].weight @ emb.clusters[i].weight[w - 10 * i])
    torch.testing.assert_close(emb(tokens)[0], torch.stack(expected))


def test_factorized_embedding_has_v_by_e_plus_e_by_d_parameters():
    emb = FactorizedEmbedding(V, D, dim=4)
    assert sum(p.numel() for p in emb.parameters()) == V * 4 + 4 * D
    assert emb(torch.zeros(2, 3, dtype=torch.long)).shape == (2, 3, D)


def test_the_default_head_loss_is_todays_cross_entropy_exactly():
    config = compose_config("data.seq_len=16", "model.d_model=32", "model.n_heads=2",
                            "model.d_ff=64", "model.n_layers=1")
    torch.manual_seed(0)
    model = build_model(config, vocab_size=256)
    tokens = torch.randint(0, 256, (2, 17), generator=torch.Generator().manual_seed(0))
    targets = tokens[:, 1:].clone()
    targets[0, :3] = IGNORE_INDEX
    for reduction in ("mean", "sum"):
        today = F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1).float(), targets.flatten(),
                                ignore_index=IGNORE_INDEX, reduction=reduction)
        owned = model(tokens[:, :-1], targets, ignore_index=IGNORE_INDEX, reduction=reduction)
        assert torch.equal(owned, today)


def test_an_untied_encoder_table_adds_v_by_d_parameters(tiny_dims):
    torch.manual_seed(0)
    tied, untied = (EncoderDecoder(tiny_dims, *PARTS, pad_id=0, tie_encoder_embedding=tie)
                    for tie in (True, False))
    assert untied.num_parameters() - tied.num_parameters() == 256 * tiny_dims.d_model
    assert untied.source_embedding is not None and tied.source_embedding is None


def test_a_record_from_before_the_groups_reads_as_them_and_keeps_its_id():
    old = {"model": {"d_model": 32, "tie_embeddings": False, "embedding_dim": 8,
                     "output": "mixture_of_softmaxes", "mos_components": 3}}
    assert embedding_and_head(old) == (
        {"name": "factorized", "dim": 8},
        {"name": "mixture_of_softmaxes", "tie": False, "components": 3})
    new = compose_config()
    before = {**new, "model": {**new["model"], **RETIRED}}  # as the default config was
    for group in ("embedding", "head"):
        del before[group]
    assert run_identity(new, {}) == run_identity(before, {})


@pytest.mark.parametrize("overrides", [
    ("embedding=factorized", "embedding.dim=8"),
    ("embedding=adaptive_input", "head=adaptive_softmax", "head.tie=true"),
    ("modification=adaptive_softmax_no_projection",),
], ids=lambda o: " ".join(o))
def test_a_tiny_run_of_each_option_finishes(tmp_path, overrides):
    record = run_tiny(tmp_path, *overrides, "trainer.max_steps=4")
    assert record["status"] == "finished", record["error"]
    assert record["final"]["val/bpb"] < 9


def test_a_tied_head_the_embedding_cannot_serve_is_one_error_line_before_training(tmp_path):
    with pytest.raises(ConfigError) as refused:  # the CLI prints it as "error: <message>"
        run_tiny(tmp_path, "embedding=adaptive_input")
    message = str(refused.value)
    assert "\n" not in message and not (tmp_path / "results").exists()
    assert message.startswith("head=softmax head.tie=true shares one V x E input table")
    assert "choose another head or embedding, or set head.tie=false" in message
