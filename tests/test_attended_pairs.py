"""The attended-pairs probe (xformer_bench.models.attended_pairs): exact fractions of the allowed
(query, key) pairs for known patterns, a kernel that lies about its window caught at 100 %,
mixers without token-pair weights reported as such, and the study refusal of a sub-quadratic
row that is full attention at the study's length."""

from __future__ import annotations

import pytest
import torch

from test_attention_zoo import mixer
from xformer_bench.attention import AttentionKernel
from xformer_bench.errors import ConfigError
from xformer_bench.models.attended_pairs import attention_coverage, refuse_dense
from xformer_bench.registry import DESCRIPTIVE_KEYS

T = 20


def coverage(layer, seq_len=T, causal=True, layers=(0, 1)):
    return attention_coverage(layer, seq_len, layers, causal=causal)


def test_a_local_window_attends_exactly_its_band():
    keys = [min(i + 1, 5) for i in range(T)]  # the previous 5, self included
    got = coverage(mixer("local", seq_len=T, window=5))
    assert got["attended_fraction"] == pytest.approx(sum(keys) / (T * (T + 1) / 2), abs=1e-12)
    assert got["keys_per_query_mean"] == pytest.approx(sum(keys) / T)
    assert got["keys_per_query_max"] == 5 and got["layers_probed"] == [0, 1]
    both = [min(i, 2) + min(T - 1 - i, 2) + 1 for i in range(T)]  # 2 each side
    got = coverage(mixer("local", seq_len=T, window=5), causal=False)
    assert got["attended_fraction"] == pytest.approx(sum(both) / T ** 2, abs=1e-12)


def test_block_local_attends_its_block_and_memory():
    block, memory = 4, 4
    keys = [i - max(0, i // block * block - memory) + 1 for i in range(T)]
    got = coverage(mixer("block_local", seq_len=T, block=block, memory=memory))
    assert got["attended_fraction"] == pytest.approx(sum(keys) / (T * (T + 1) / 2), abs=1e-12)
    assert got["keys_per_query_max"] == block + memory


@pytest.mark.parametrize("name", ["full", "linear", "persistent_memory"])
def test_dense_options_attend_every_pair(name):
    # linear: positive feature maps weigh every key; persistent memory: its own values are a
    # term the probe's values do not carry (subtracted), the sequence's keys all attended
    for causal in (True, False):
        got = coverage(mixer(name, seq_len=T), causal=causal)
        assert got["attended_fraction"] == 1.0
        assert got["keys_per_query_max"] == T


class ClaimsAWindow(AttentionKernel):
    """Declares a 5-key window and sub-quadratic cost; computes every pair at odd layers."""

    sub_quadratic = True
    window = 5

    def forward(self, q, k, v, *, causal, bias=None, key_padding_mask=None, layer=0):
        t = q.shape[-2]
        i = torch.arange(t)
        allowed = (i[None] <= i[:, None]) if causal else torch.ones(t, t, dtype=torch.bool)
        if layer % 2 == 0:
            allowed = allowed & ((i[:, None] - i[None]).abs() < self.window)
        scores = (q @ k.transpose(-1, -2)).masked_fill(~allowed, float("-inf"))
        return scores.softmax(-1) @ v  # (B, H, T, Dh)


def test_a_kernel_that_secretly_attends_all_pairs_is_reported_at_100_percent():
    got = attention_coverage(ClaimsAWindow(), T, [0, 1], causal=True, n_heads=2, head_dim=8)
    band = sum(min(i + 1, 5) for i in range(T)) / (T * (T + 1) / 2)
    assert got["per_layer"] == pytest.approx([band, 1.0], abs=1e-12)
    got = attention_coverage(ClaimsAWindow(), T, [1, 3], causal=True, n_heads=2, head_dim=8)
    assert got["attended_fraction"] == 1.0


class MixesFeatures(AttentionKernel):
    """Channel attention (XCiT-like): each token's value is mixed within itself only."""

    def forward(self, q, k, v, *, causal, bias=None, key_padding_mask=None, layer=0):
        mix = (q.transpose(-1, -2) @ k).softmax(-1)  # (B, H, Dh, Dh)
        return v @ mix.transpose(-1, -2)


def test_an_output_that_is_no_weighting_of_values_by_pair_reports_no_fraction():
    got = attention_coverage(MixesFeatures(), T, [0], causal=False, n_heads=2, head_dim=8)
    assert got["attended_fraction"] is None and "not a weighting" in got["not_probed"]


def test_mixers_without_queries_and_keys_report_reach_or_nothing():
    conv = coverage(mixer("lightweight_conv", seq_len=T, kernel_size=7))
    assert conv["attended_fraction"] is None and conv["reach"] == 7
    fnet = coverage(mixer("fnet", seq_len=T), causal=False)
    assert fnet["attended_fraction"] is None and fnet["reach"] is None and fnet["not_probed"]


def test_the_probe_leaves_random_state_and_training_mode_alone():
    layer = mixer("bigbird", seq_len=64, block=8).train()
    state = torch.get_rng_state()
    first = coverage(layer, seq_len=64)
    assert torch.equal(torch.get_rng_state(), state) and layer.training
    assert coverage(layer, seq_len=64) == first  # random blocks drawn per (seed, layer)


def test_a_long_run_is_not_probed_and_says_why():
    got = coverage(mixer("full", seq_len=16), seq_len=10_000)
    assert got["attended_fraction"] is None and "8192" in got["not_probed"]


# ------------------------------------------------------------------ the study refusal

LOCAL = {"name": "local", "label": "Local attention", "window": 8}


def refuse(spec=LOCAL, seq_len=8, **kwargs):
    """The refusal of ``spec`` at ``seq_len`` (causal) in a study, by default attention_zoo."""
    settings = {k: v for k, v in spec.items() if k not in DESCRIPTIVE_KEYS}
    layer = mixer(spec["name"], seq_len, **settings)
    kwargs = {"study": "attention_zoo", "controls": None, **kwargs}
    refuse_dense(coverage(layer, seq_len=seq_len), spec, layer, length=f"data.seq_len={seq_len}",
                 **kwargs)


def test_a_study_refuses_a_sub_quadratic_row_that_is_full_attention_and_names_the_fix():
    with pytest.raises(ConfigError) as error:
        refuse(controls={"attention": ["block_local"]})
    message = str(error.value)
    assert message.startswith("attention=local attends 100 % of the causal pairs at "
                              "data.seq_len=8 (window 8) (12 % at T=128): it is full attention "
                              "here"), message
    assert "attention.window" in message
    assert "controls: {attention: [block_local, local]}" in message


@pytest.mark.parametrize("kwargs", [
    {"controls": {"attention": ["local"]}},  # a declared control
    {"study": None},  # outside a study: recorded, never refused
])
def test_controls_and_single_runs_are_not_refused(kwargs):
    refuse(**kwargs)


def test_sparse_rows_and_dense_by_design_options_are_not_refused():
    refuse(seq_len=32)  # window 8 of 32 keys
    refuse({"name": "linear", "label": "Linear"})  # every pair at any length: not a pattern
    refuse({"name": "full", "label": "Full"})  # claims no sub-quadratic cost


def test_the_table_shows_the_attended_share_when_records_carry_it(tmp_path):
    """One tiny study run per option: local at a window that covers the sequence is 100 %,
    a window of 4 over 32 positions is sparse; the table's Attended % column shows both."""
    from conftest import run_tiny
    from xformer_bench.results.aggregate import build_table
    from xformer_bench.results.collect import collect
    from xformer_bench.results.variants import group_variants

    for window in (64, 4):
        run_tiny(tmp_path, "attention=local", f"attention.window={window}",
                 "trainer.max_steps=1", "experiment_name=coverage")
    variants = group_variants(collect(tmp_path / "results").of("coverage"))
    table = build_table("coverage", variants)
    j = [c.key for c in table.columns].index("attended")
    shares = sorted(row.cells[j].mean for row in table.rows)
    assert shares[-1] == 100.0 and shares[0] < 30.0


def test_the_caption_names_the_controls_that_are_full_attention_at_the_study_length():
    from xformer_bench.results.columns import _controls_caption

    def run(name, fraction):
        return {"config": {"attention": {"name": name},
                           "controls": {"attention": ["local", "bigbird"]}},
                "attention_coverage": {"attended_fraction": fraction}}

    records = [run("full", 1.0), run("local", 1.0), run("bigbird", 0.75), run("lsh", 0.99)]
    assert _controls_caption(records, []) == (
        "Attended %: local attend at least 95 % of the pairs at this length -- full attention "
        "here, declared controls of the study: their rows compare quality, not efficiency.")
    assert _controls_caption(records[2:], []) == ""  # sparse here, or not declared: nothing
