"""Peak memory of one run, even when a sweep runs many in one process.

On CUDA, ``torch.cuda.max_memory_allocated`` after its statistics are reset at the start of
the run (kind ``cuda_max_allocated``).  On Linux CPU, the process's peak resident set size
(``VmHWM``) after resetting it at the start of the run by writing 5 to ``/proc/self/clear_refs``
(Linux >= 4.0; kind ``cpu_peak_rss``): the interpreter, libraries and data it holds are
included, so differences between rows are the model's.  Elsewhere, ``ru_maxrss``, the
process's peak since it started (kind ``cpu_max_rss``): in a sweep that is the highest of the
runs so far, which tables do not show as a run's memory
(:data:`xformer_bench.results.record.PER_RUN_MEMORY`).
"""

from __future__ import annotations

import re
import resource
from pathlib import Path

import torch

_STATUS, _CLEAR_REFS = Path("/proc/self/status"), Path("/proc/self/clear_refs")


def _cuda() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_initialized()


class RunPeakMemory:
    """``start()`` at the beginning of a run, ``read()`` at its end: (MiB, kind)."""

    def __init__(self) -> None:
        self.rss_reset = False

    def start(self) -> None:
        if _cuda():
            torch.cuda.reset_peak_memory_stats()
        try:
            _CLEAR_REFS.write_text("5")
            self.rss_reset = True
        except OSError:  # not Linux, or not allowed: read() falls back to ru_maxrss
            self.rss_reset = False

    def read(self) -> tuple[float, str]:
        if _cuda():
            return torch.cuda.max_memory_allocated() / 2**20, "cuda_max_allocated"
        match = None
        if self.rss_reset:
            try:
                match = re.search(r"VmHWM:\s+(\d+) kB", _STATUS.read_text())
            except OSError:
                pass
        if match:
            return int(match.group(1)) / 1024, "cpu_peak_rss"
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "cpu_max_rss"
