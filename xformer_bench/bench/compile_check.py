"""Which attention options ``torch.compile`` captures whole, and what compiling buys.

:func:`graph_breaks` traces one layer's forward with TorchDynamo (``torch._dynamo.explain``,
no code generated) and returns its graph count, its breaks and their first reasons: an option
that compiles as one graph can be used with ``fullgraph=True``.  :func:`speedup` times forward +
backward of the layer eager and through inductor at one shape
(:func:`~xformer_bench.bench.attention_cost.measure`, the compilation in the untimed warm-up).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from xformer_bench.bench.attention_cost import Shape, build_layer, measure
from xformer_bench.core.context import ForwardContext
from xformer_bench.position import Position


@dataclass(frozen=True)
class Breaks:
    attention: str
    graphs: int
    breaks: int
    reasons: tuple[str, ...]  # distinct first lines, sorted


def graph_breaks(name: str, length: int = 32, shape: Shape = Shape(2, 2, 16)) -> Breaks:
    """The graphs and graph breaks of one forward of ``attention=name`` (causal where it can)."""
    import torch._dynamo as dynamo

    layer = build_layer(name, length, shape, torch.device("cpu"))
    causal = "causal" in layer.provides
    ctx = ForwardContext(Position(), causal=causal, layer=1)
    x = torch.randn(shape.batch, length, shape.heads * shape.head_dim,
                    generator=torch.Generator().manual_seed(0))
    dynamo.reset()
    explained = dynamo.explain(lambda inputs: layer(inputs, ctx))(x)
    reasons = sorted({str(b.reason).strip().splitlines()[0][:100]
                      for b in explained.break_reasons})
    return Breaks(name, explained.graph_count, explained.graph_break_count, tuple(reasons))


def speedup(name: str, length: int, shape: Shape, device: torch.device,
            repeats: int = 3) -> tuple[float, float]:
    """(eager seconds, compiled seconds) of one forward + backward, fastest of ``repeats``."""
    eager = measure(name, length, replace(shape, compiled=False), device, repeats)
    compiled = measure(name, length, replace(shape, compiled=True), device, repeats)
    return eager.seconds, compiled.seconds
