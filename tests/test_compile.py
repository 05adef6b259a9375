"""torch.compile: which attention options TorchDynamo captures as one graph (``fullgraph=True``)
-- every option but the declared ones (:data:`references.COMPILE_BREAKS`, each with its reason,
which its module's docstring also gives) -- and a planted host read is caught as a break."""

from __future__ import annotations

import pytest
import torch

from references import COMPILE_BREAKS
from test_attention_zoo import OPTIONS
from xformer_bench.attention import AttentionKernel
from xformer_bench.bench import compile_check


FAST = ("full", "local", "performer", "gla", "adaptive_span")
"""One per kind (dense, banded, kernelised, recurrent, a declared break) in ``make test``; every
option in ``make test-full`` (compiling each takes 10-50 s on 2 cores)."""


@pytest.mark.parametrize("name", [n if n in FAST else pytest.param(n, marks=pytest.mark.slow)
                                  for n in OPTIONS])
def test_an_option_compiles_whole_unless_it_declares_why_not(name):
    found = compile_check.graph_breaks(name)
    assert (found.breaks > 0) == (name in COMPILE_BREAKS), (name, found.reasons)


def test_a_planted_host_read_is_a_graph_break(monkeypatch):
    forward = AttentionKernel.__call__

    def reads_the_host(self, q, *args, **kwargs):
        if q.sum() > 0:  # data-dependent Python control flow: the break the check is for
            q = q * 1.0
        return forward(self, q, *args, **kwargs)

    monkeypatch.setattr(AttentionKernel, "__call__", reads_the_host)
    found = compile_check.graph_breaks("full")
    assert found.breaks > 0


def test_declared_breaks_name_real_options():
    assert set(COMPILE_BREAKS) <= set(OPTIONS)
    assert all(len(reason) > 20 for reason in COMPILE_BREAKS.values())
