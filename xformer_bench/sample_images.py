"""A pixel LM draws: ``xbench-sample RUN --grid N --out samples.png`` samples N x N images
sub-pixel by sub-pixel (raster order, channels interleaved, each from the ones before it, as
the Sparse Transformer and Image Transformer do) and writes them as one PNG grid with a
one-pixel gap.  Each image starts from the beginning-of-image token, which is never sampled."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from xformer_bench.data.pixels import BOS_ID
from xformer_bench.errors import XbenchError
from xformer_bench.sample import generate


def sample_grid(model: torch.nn.Module, layout: list[int] | None, n: int, window: int,
                **sampling) -> np.ndarray:
    """(n H + n - 1, n W + n - 1, C) uint8: n x n images sampled from ``model``."""
    if not layout or len(layout) != 3:
        raise XbenchError("the run record has no image layout (height, width, channels): "
                          "re-run it with this version of xbench")
    if n < 1:
        raise XbenchError(f"--grid {n} must be at least 1")
    h, w, c = layout
    prompt = torch.full((n * n, 1), BOS_ID, dtype=torch.long,
                        device=next(model.parameters()).device)
    tokens = generate(model, prompt, h * w * c, window, exclude=BOS_ID, **sampling)
    images = tokens[:, 1:].clamp(0, 255).to(torch.uint8).cpu().numpy().reshape(n, n, h, w, c)
    canvas = np.full((n * h + n - 1, n * w + n - 1, c), 255, dtype=np.uint8)
    for i in range(n):
        for j in range(n):
            canvas[i * (h + 1):i * (h + 1) + h, j * (w + 1):j * (w + 1) + w] = images[i, j]
    return canvas


def write_png(canvas: np.ndarray, path: Path) -> Path:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(canvas if canvas.shape[2] != 1 else canvas[..., 0]).save(path)
    return path
