"""Per-axis learned positions: Reformer's axial embeddings and the Sparse Transformer's
factorized ones."""

from __future__ import annotations

import pytest
import torch

from xformer_bench.errors import ConfigError
from xformer_bench.core.dims import ModelDims
from xformer_bench.position._axes import coordinates, default_grid
from xformer_bench.position.axial import AxialPosition
from xformer_bench.position.factorized import FactorizedPosition

DIMS = ModelDims(d_model=12, n_heads=2, n_layers=1, d_ff=16, seq_len=20, vocab_size=8)


def test_coordinates_are_row_major():
    rows, cols, channels = coordinates(24, (2, 4, 3), "x", torch.device("cpu"))
    for i in range(24):
        assert (rows[i], cols[i], channels[i]) == (i // 12, i // 3 % 4, i % 3)


def test_default_grid_is_near_square_and_covers_the_sequence():
    for t in (1, 20, 128, 2048, 3072):
        n1, n2 = default_grid(t)
        assert n1 * n2 >= t and abs(n1 - n2) <= 1 + n2 // 10


def test_axial_concatenates_one_table_per_axis():
    position = AxialPosition(DIMS, shape=[4, 5], dims_per_axis=[4, 8])
    assert sum(p.numel() for p in position.parameters()) == 4 * 4 + 5 * 8  # not 20 x 12
    added = position.embed(torch.zeros(1, 20, 12))[0]
    first, second = position.tables
    for i in range(20):
        torch.testing.assert_close(added[i], torch.cat([first[i // 5], second[i % 5]]))


def test_factorized_sums_full_width_tables():
    position = FactorizedPosition(DIMS, shape=[2, 4, 3])
    added = position.embed(torch.zeros(1, 20, 12))[0]
    a, b, c = position.tables
    for i in range(20):
        torch.testing.assert_close(added[i], a[i // 12] + b[i // 3 % 4] + c[i % 3])


@pytest.mark.parametrize("make", [lambda: AxialPosition(DIMS, shape=[3, 5]),
                                  lambda: FactorizedPosition(DIMS, shape=[3, 5])])
def test_an_input_longer_than_the_grid_is_one_config_error(make):
    with pytest.raises(ConfigError, match=r"covers 15 positions.*set position.shape"):
        make().embed(torch.zeros(1, 16, 12))


def test_axial_widths_must_sum_to_the_model_width():
    with pytest.raises(ConfigError, match="dims_per_axis=\\[4, 4\\].*model.d_model=12"):
        AxialPosition(DIMS, shape=[4, 5], dims_per_axis=[4, 4])
    assert [t.shape[1] for t in AxialPosition(DIMS, shape=[2, 2, 5]).tables] == [4, 4, 4]
