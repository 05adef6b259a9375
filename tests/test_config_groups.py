"""Config groups are named in one place (the folders of conf/): a new group reaches the
record's choices, the run id and the table without being listed anywhere else."""

from __future__ import annotations

import shutil

import xformer_bench.config as config_module
from conftest import run_tiny
from xformer_bench.config import CONF_DIR, choice_groups
from xformer_bench.results.report import make_tables


def test_the_groups_are_the_conf_folders():
    assert choice_groups() == ("model", "attention", "norm", "activation", "position", "ffn",
                               "embedding", "head", "modification", "stack", "data", "trainer",
                               "logger")


def test_a_new_group_reaches_the_record_the_run_id_and_the_table(tmp_path, monkeypatch):
    conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, conf)
    (conf / "tokenizer").mkdir()
    for name in ("standard", "fancy"):
        (conf / "tokenizer" / f"{name}.yaml").write_text(f"name: {name}\nlabel: {name.title()} tokenizer\n")
    monkeypatch.setattr(config_module, "CONF_DIR", conf)  # a throw-away group, this test only
    assert "tokenizer" in choice_groups()

    records = [run_tiny(tmp_path, f"+tokenizer={name}", "experiment_name=groups")
               for name in ("standard", "fancy")]
    assert [r["choices"]["tokenizer"] for r in records] == ["standard", "fancy"]
    assert records[0]["run_id"] != records[1]["run_id"]  # same seed, different choice

    [markdown] = [p for p in make_tables(tmp_path / "results", tmp_path / "tables", plots=False)
                  if p.suffix == ".md"]
    rows = [line.split(" | ")[0][2:] for line in markdown.read_text().splitlines()
            if line.startswith("| ") and not line.startswith(("| Variant", "| :"))]
    assert sorted(rows) == ["Fancy tokenizer", "Standard tokenizer"]  # two rows, not one averaged
