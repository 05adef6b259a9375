"""The run id is what a run computes: every key declared ``computes=False`` (display,
logging, checkpoint-writing, resume, output paths, study declarations) can be flipped without a
new id; one key of every other family flipped gives a new id; the shipped records keep theirs."""

from __future__ import annotations

import glob
import json
from pathlib import Path

import pytest

from xformer_bench.config import choice_groups, compose_config
from xformer_bench.results.record import run_identity
from xformer_bench.schema.identity import HASHED_AS, outside_identity
from xformer_bench.schema.validate import GROUPS, TOP_KEYS

ROOT = Path(__file__).resolve().parent.parent


def _choices(config: dict) -> dict:
    return {g: config[g]["name"] for g in choice_groups() if "name" in config.get(g, {})}


def _flipped(value):
    """Another value of the same kind."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + "_x"
    if isinstance(value, list):
        return [*value, value[-1] if value else 1]
    if isinstance(value, dict):
        return {**value, "flipped": 1}
    return 1  # None


BASE = compose_config("model=transformer_xl")  # a stack with memory: eval.* keys all count


def _id(config: dict) -> str:
    return run_identity(config, _choices(config))


def _display_paths() -> list[tuple[str, str | None]]:
    return [(top, key) for top, keys in outside_identity().items()
            for key in ([None] if keys is None else sorted(keys))]


@pytest.mark.parametrize("top, key", _display_paths())
def test_a_display_key_flipped_keeps_the_run_id(top, key):
    config = json.loads(json.dumps(BASE))
    if key is None:
        config[top] = _flipped(config.get(top))
    else:
        node = config.setdefault(top, {})
        node[key] = _flipped(node.get(key))
    assert _id(config) == _id(BASE), f"{top}.{key or ''} changed the run id"


def _computing_families() -> list[tuple[str, str]]:
    """(family, one computing key of it present in the base config)."""
    outside = outside_identity()
    families = []
    for name in [*GROUPS, *TOP_KEYS]:
        if outside.get(name, frozenset()) is None or name not in BASE:
            continue
        node = BASE[name]
        if not isinstance(node, dict):
            families.append((name, ""))
            continue
        keys = [k for k in node if k not in (outside.get(name) or ()) and k not in ("name",
                                                                                     "label")]
        if keys:
            families.append((name, keys[0]))
    return families


@pytest.mark.parametrize("family, key", _computing_families())
def test_one_computing_key_of_every_family_flipped_gives_a_new_run_id(family, key):
    config = json.loads(json.dumps(BASE))
    if key:
        config[family][key] = _flipped(config[family][key])
    else:
        config[family] = _flipped(config[family])
    assert _id(config) != _id(BASE), f"{family}.{key} did not change the run id"


def test_the_families_cover_data_model_optimisation_and_evaluation():
    families = {f for f, _ in _computing_families()}
    assert {"data", "model", "optim", "eval", "trainer", "seed", "attention"} <= families


def test_progress_bar_and_checkpoint_on_the_command_line_keep_the_id():
    plain = compose_config("experiment=smoke")
    shown = compose_config("experiment=smoke", "trainer.progress_bar=true",
                           "trainer.checkpoint=true", "trainer.log_every_n_steps=1",
                           "data.num_workers=2", "paths.results_dir=elsewhere")
    assert _id(shown) == _id(plain)
    assert _id(compose_config("experiment=smoke", "trainer.max_steps=17")) != _id(plain)


def test_pinned_keys_are_declared_outside_the_identity():
    outside = outside_identity()
    for group, keys in HASHED_AS.items():
        assert set(keys) <= set(outside[group] or ())


def test_every_shipped_record_keeps_its_run_id():
    paths = glob.glob(str(ROOT / "results" / "reference" / "*" / "records" / "**" / "*.json"),
                      recursive=True)
    records = [json.loads(Path(p).read_text()) for p in paths]
    records = [r for r in records if isinstance(r, dict) and "config" in r]
    assert len(records) > 400
    changed = [r["run_id"] for r in records
               if run_identity(r["config"], r["choices"]) != r["run_id"]]
    assert changed == []
