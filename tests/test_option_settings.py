"""A study's settings for one option of a swept group (``option_settings``)."""

import pytest

from xformer_bench.config import compose_config
from xformer_bench.errors import ConfigError
from xformer_bench.option_settings import apply_option_settings

STUDY = "experiment=modern_mixers_mqar"


def _settled(*overrides):
    return apply_option_settings(compose_config(STUDY, *overrides), [STUDY, *overrides])


def test_the_chosen_option_takes_the_study_setting_and_the_others_are_untouched():
    assert compose_config(STUDY, "attention=local")["attention"]["window"] == 256  # its paper's
    assert _settled("attention=local")["attention"]["window"] == 16
    assert _settled("attention=lsh")["attention"]["chunk_size"] == 16
    assert _settled("attention=full")["attention"] == compose_config(STUDY)["attention"]


def test_the_command_line_wins_over_the_study():
    assert _settled("attention=local", "attention.window=32")["attention"]["window"] == 32


def test_a_setting_the_option_lacks_is_one_error_naming_its_keys():
    config = compose_config(STUDY, "attention=local")
    config["option_settings"] = {"attention": {"local": {"chunk_size": 8}}}
    with pytest.raises(ConfigError, match=r"attention=local has no key 'chunk_size'.*window"):
        apply_option_settings(config, [])
