"""The validation-share projection (xformer_bench/bench/validation_share.py) on worked numbers."""

import pytest

from xformer_bench.bench.validation_share import DOMAINS, Share


def test_the_share_counts_subsampled_intermediates_and_one_whole_final_validation():
    # 600 steps, 8 validations every 75 steps: 7 intermediate ones of 8 batches, then 306 batches
    share = Share("enwik8", seconds_per_step=0.5, seconds_per_batch=0.25, whole_split=306,
                  subsample=8, max_steps=600, val_checks=8)
    validation = (7 * 8 + 306) * 0.25
    assert share.validation_seconds(8) == pytest.approx(validation)
    assert share.share(8) == pytest.approx(validation / (validation + 600 * 0.5))
    assert share.share(None) == pytest.approx(8 * 306 * 0.25 / (8 * 306 * 0.25 + 300))
    assert share.validation_seconds(1000) == share.validation_seconds(None)  # capped at whole


def test_translation_is_timed_after_training_and_enwik8_subsamples_one_batch():
    from xformer_bench.bench.validation_share import defaults_of

    assert [d.data for d in DOMAINS if d.trained] == ["wmt14"]  # an untrained decoder never stops
    assert defaults_of("enwik8")["subsample"] == 1


def test_validations_before_the_last_may_cost_less_per_batch():
    share = Share("wmt14", seconds_per_step=0.3, seconds_per_batch=1.0, whole_split=47,
                  subsample=4, max_steps=600, val_checks=8, seconds_per_intermediate_batch=0.1)
    assert share.validation_seconds(4) == pytest.approx(7 * 4 * 0.1 + 47 * 1.0)
