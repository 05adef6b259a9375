"""The README stays true: its variant table has a row for every option of every group, with
the option's table label."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from xformer_bench.config import CONF_DIR, PLUMBING_GROUPS, choice_groups

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()
OPTIONS = [(g, p) for g in choice_groups() if g not in PLUMBING_GROUPS or g == "data"
           for p in sorted((CONF_DIR / g).glob("*.yaml"))]


@pytest.mark.parametrize("group,path", OPTIONS, ids=[f"{g}={p.stem}" for g, p in OPTIONS])
def test_every_option_has_a_readme_row_with_its_label(group, path):
    row = re.search(rf"^\| {group} \| {path.stem} \| ([^|]+) \|", README, re.M)
    assert row, f"README's variant table has no row for {group}={path.stem}"
    label = OmegaConf.load(path).get("label")
    if label is not None:  # model presets keep theirs under model:
        assert row.group(1).strip() == label
