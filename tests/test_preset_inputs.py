"""A model preset declares the inputs it is for: given data of another shape it is
refused before training, in one line naming the data that would fit; a shape-agnostic preset
takes every dataset.  Generated from the declarations: every preset x every dataset (and each
shape a dataset's key selects)."""

from __future__ import annotations

from typing import Any, Iterator

import pytest

from conftest import compose_config
from test_schema_bad_values import option_node
from xformer_bench import cli
from xformer_bench.errors import ConfigError
from xformer_bench.preflight import command_line_error
from xformer_bench.schema import check_config
from xformer_bench.schema.data import GIVES
from xformer_bench.schema.model import INPUTS
from xformer_bench.schema.shapes import ANY


@pytest.fixture(scope="module")
def base() -> dict[str, Any]:
    return compose_config()


def datasets(base: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(shape, data node)`` of every dataset, once per shape it can give."""
    for name, shapes in GIVES.items():
        node = option_node("data", name, base)
        for shape, condition in shapes.items():
            yield shape, node if condition is None else {**node, condition[0]: condition[1]}


def test_every_preset_takes_the_data_it_is_for_and_refuses_the_rest(base):
    refused, shapes = 0, list(datasets(base))
    for preset, wants in INPUTS.items():
        for shape, data in shapes:
            config = {**base, "model": {**base["model"], "name": preset}, "data": data}
            if wants == ANY or shape in wants:
                check_config(config)
                continue
            with pytest.raises(ConfigError) as error:
                check_config(config)
            line, refused = str(error.value), refused + 1
            assert line.startswith(f"model={preset} is for ") and "\n" not in line
            assert f"data={data['name']} gives " in line and ": choose data=" in line
    assert refused >= 20  # vit, xcit and image_transformer, each on most datasets


@pytest.mark.parametrize("arguments, fits", [
    (("model=vit", "data=text"), "choose data=imagenet data.mode=classify"),
    (("model=xcit", "data=listops"), "choose data=imagenet data.mode=classify"),
    (("model=vit", "data=cifar10_classify"), "choose data=imagenet data.mode=classify"),
    (("model=image_transformer", "data=imagenet"),
     "choose data=cifar10 or data=imagenet data.mode=pixel_lm"),
    (("model=image_transformer", "data=wmt14"), "choose data=cifar10 or data=imagenet"),
])
def test_on_the_command_line_one_line_names_the_data_that_fits(arguments, fits):
    error = command_line_error(list(arguments))
    assert error is not None and fits in str(error) and "\n" not in str(error)


def test_a_later_job_of_a_sweep_is_refused_and_the_sweep_goes_on(tmp_path, capsys):
    """``xbench -m model=vanilla,vit data=text``: the preflight composes vanilla; vit's job."""
    overrides = ["model=vit", "data=text", f"paths.results_dir={tmp_path / 'results'}"]
    config = compose_config(*overrides)
    assert cli.run_job(config, {"model": "vit"}, overrides, tmp_path / "run",
                       multirun=True) is None
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: model=vit is for images to classify")
    assert not (tmp_path / "results").exists()
