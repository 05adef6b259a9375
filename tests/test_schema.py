"""The configuration's schema and ``conf/`` cannot drift apart: every key a YAML
writes is declared, every declaration is written by a YAML, every option of every group has an
entry, the values the YAMLs ship are in range, the choice sets are the code's, every study
composes to a config the schema accepts, and the check runs before torch is imported."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import compose_config
from xformer_bench.config import CONF_DIR, choice_groups
from xformer_bench.schema import GROUPS, check_config, coverage
from xformer_bench.schema.data import GIVES
from xformer_bench.schema.model import INPUTS
from xformer_bench.schema.shapes import ANY, KINDS


def test_no_key_in_conf_lacks_a_declaration():
    written = coverage.written_keys()
    assert len(written) > 500  # every YAML of conf/ was read
    assert coverage.undeclared() == []  # "file: key" of each key without a schema: zero


def test_every_declaration_is_a_key_some_yaml_writes():
    assert coverage.unwritten() == []
    assert sum(1 for _ in coverage.declared_paths()) > 300


def test_every_option_of_every_group_is_declared():
    assert set(choice_groups()) <= set(GROUPS)
    for name, group in GROUPS.items():
        stems = {p.stem for p in (CONF_DIR / name).glob("*.yaml")}
        assert set(group.options) == (stems if group.named else set()), name
    assert set(INPUTS) == {p.stem for p in (CONF_DIR / "model").glob("*.yaml")}
    assert set(GIVES) == {p.stem for p in (CONF_DIR / "data").glob("*.yaml")}
    assert all(wants == ANY or set(wants) <= set(KINDS) for wants in INPUTS.values())
    assert all(set(gives) <= set(KINDS) for gives in GIVES.values())


def test_the_values_conf_ships_are_in_range():
    assert coverage.refused_values() == []


def test_choice_sets_are_the_codes():
    """A choice declared for the preflight (no torch there) is the set the code accepts."""
    from xformer_bench import attention
    from xformer_bench.data import imagenet
    from xformer_bench.schema import attention as declared_attention
    from xformer_bench.schema import data, layers, top, training
    from xformer_bench.stacks._compression import COMPRESSIONS
    from xformer_bench.tasks.schedule import DECAYS
    from xformer_bench.training.wandb_logger import MODES

    assert declared_attention.FAMILIES == tuple(attention.FAMILIES)
    assert top.DECAYS == DECAYS and training.WANDB_MODES == MODES
    assert layers.STACK.options["compressive"]["compression"].choices == COMPRESSIONS
    imagenet_keys = data.DATA.options["imagenet"]
    assert imagenet_keys["mode"].choices == imagenet.MODES
    assert imagenet_keys["resize"].choices == imagenet.RESIZES


@pytest.mark.parametrize("study", sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml")))
def test_every_study_composes_to_a_config_the_schema_accepts(study):
    check_config(compose_config(f"experiment={study}"))


def test_the_check_runs_before_torch_is_imported_and_fast():
    """Fast in CPU time (``process_time``), which other processes on the machine do not slow."""
    code = ("import sys, time; from xformer_bench.preflight import command_line_error as c; "
            "c(['seed=1']); t = time.process_time(); e = c(['trainer.val_checks=0']); "
            "print(time.process_time() - t, 'torch' in sys.modules, e)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout.split(maxsplit=2)
    assert float(out[0]) < 0.5 and out[1] == "False"
    assert out[2].startswith("trainer.val_checks=0 must be a positive integer")
