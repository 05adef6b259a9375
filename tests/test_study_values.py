"""Values a study gives its jobs pass the same schema as the command line's: its
``sweep:`` values before the first job trains, its ``option_settings`` whichever option a job
chose, and the evaluation keys of a stack with memory only on such a stack."""

from __future__ import annotations

import pytest

from conftest import compose_config
from xformer_bench.errors import ConfigError
from xformer_bench.preflight import command_line_error
from xformer_bench.schema import check_config

STUDY = ["-m", "experiment=narang_activations"]


@pytest.mark.parametrize("override, says", [
    ('sweep.seed="0,x"', "seed=x must be an integer"),
    ('sweep.activation="relu,nope"', "activation=nope is not an option of activation"),
    ('+sweep.attention="full,nope"', "attention=nope is not an option of attention"),
])
def test_a_bad_value_in_a_studys_sweep_is_one_line_before_anything_runs(override, says):
    error = command_line_error([*STUDY, override])
    assert error is not None and says in str(error) and "\n" not in str(error)
    assert "the study's sweep" in str(error)


def test_the_command_line_replaces_a_studys_swept_key_before_it_is_checked():
    assert command_line_error([*STUDY, 'sweep.seed="0,x"', "seed=3"]) is None


@pytest.mark.parametrize("settings, says", [
    ({"attention": {"loca": {"window": 16}}}, "loca is not an option of attention (did you "
                                              "mean local?)"),
    ({"attention": {"local": {"window": "wide"}}}, "option_settings.attention.local.window="
                                                   "wide must be a positive integer"),
    ({"attention": {"local": {"windw": 16}}}, "attention=local has no key 'windw'"),
    ({"eval": {"full": {}}}, "expected {OPTION: {KEY: VALUE}}"),
])
def test_option_settings_are_checked_whichever_option_the_job_chose(settings, says):
    config = {**compose_config("attention=full"), "option_settings": settings}
    with pytest.raises(ConfigError, match=None) as caught:
        check_config(config)
    assert says in str(caught.value)


def test_a_study_settings_string_window_is_refused_on_the_command_line_too():
    error = command_line_error(["attention=local", "+option_settings.attention.local.window=x"])
    assert error is not None and "must be a positive integer" in str(error)


@pytest.mark.parametrize("override", ["eval.warm=true", "eval.lanes=4", "eval.tgt_len=16"])
def test_memory_evaluation_keys_are_refused_on_a_stack_without_memory(override):
    error = command_line_error([override])
    assert error is not None and "is for a stack with memory" in str(error)
    assert command_line_error(["stack=recurrent", override]) is None


def test_a_memory_presets_evaluation_on_a_standard_stack_names_the_key():
    error = command_line_error(["model=transformer_xl", "stack=standard"])
    assert error is not None and str(error).startswith("eval.lanes=10 is for a stack with memory")
    assert command_line_error(["model=transformer_xl"]) is None
