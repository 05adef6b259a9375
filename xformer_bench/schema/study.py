"""The keys a study declares (``conf/experiment/*.yaml``, ``# @package _global_``) besides the
groups' keys it sets, and the two that xbench itself adds to the runs a study plans."""

from __future__ import annotations

from pathlib import Path

from xformer_bench.config import LazyOptions
from xformer_bench.schema.keys import Choice, Either, Float, Int, Mapping, Node, Seq, Text

REFERENCES = Path(__file__).resolve().parent.parent / "references"
PUBLISHED = tuple(sorted(p.stem for p in REFERENCES.glob("*.yaml")))
"""The published tables shipped in :mod:`xformer_bench.references` (a study names one)."""
PRESETS = LazyOptions("model")
"""The model presets of conf/model/ and the user's config folders, read when checked."""

STUDY = {
    "baseline": Mapping("the study's baseline row, {GROUP: OPTION}", null="none", computes=False),
    "sweep": Mapping("the study's sweep, {KEY: 'a,b,c'} (hydra.sweeper.params reads it)",
                     null="none", computes=False),
    "allowed_differences": Seq("differences from the baseline row the study accepts (groups, "
                               "dotted keys)", item=Text(""), null="none", computes=False),
    "ladders": Either("model presets whose ablation ladders the study runs too",
                      (Choice("", ("command_line",)), Seq("", item=Choice("", PRESETS))),
                      null="none", computes=False),
    "param_budget": Float("the largest fraction a row may exceed the baseline's parameters by",
                          0, open_lo=True, null="none", computes=False),
    "equal_compute": Mapping("equal compute instead of equal steps: {tokens: N} or {flops: F} "
                             "per row, each row's trainer.max_steps derived from it",
                             null="equal steps", computes=False),  # max_steps, in the id, counts
    "reference": Choice("the published table set beside the study's", PUBLISHED, null="none", computes=False),
    "table_columns": Seq("the columns of the study's LaTeX table (xbench-table --columns "
                         "overrides; default params, step_s, metric, delta, p, paper, seeds)",
                         item=Text(""), null="none", computes=False),
    "rows_from": Choice("the published table whose rows the study runs", PUBLISHED,
                        null="none", computes=False),
    "option_settings": Mapping("a study's keys for one option of a swept group, "
                               "{GROUP: {OPTION: {KEY: VALUE}}}", null="none", computes=False),
    "still_learning": Float("the baseline's improvement over its last 20 % of steps above which "
                            "the table is an early-learning comparison (metric units)", 0,
                            null="0.05", computes=False),
    "gpu_budget": Seq("the overrides that give the study its GPU budget (--dry-run prints them)",
                      item=Text(""), null="none", computes=False),
    "scaled_rows": Mapping("a published row's overrides at this scale, {LABEL: [OVERRIDE]}",
                           null="none", computes=False),
}
"""Declared in ``conf/experiment/``; outside the run's identity (``IDENTITY_EXCLUDED``)."""

PLANNED = {
    "ladder": Node("the ablation ladder rung a run was planned for", keys={
        "system": Choice("the preset the ladder climbs to", PRESETS),
        "rung": Int("the rung's index, 0 the baseline", 0),
        "name": Text("the rung's change, as the table names it"),
    }, null="none", computes=False),
    "paper_row": Text("the published row a run was planned for", null="none", computes=False),
}
"""Added by xbench to the runs it plans (``++ladder=...``, ``++paper_row=...``), not written in
any YAML."""
