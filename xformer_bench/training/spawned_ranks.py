"""DDP ranks that Lightning starts as subprocesses run the parent's job, not the CLI again.

Lightning's subprocess launcher re-executes the command line (``xbench ...``) for each extra
local rank.  Through Hydra that would compose a new config, make a new run directory and,
under ``-m``, start the whole sweep again.  Instead the parent puts its job (resolved config,
choices, overrides, run directory) in an environment variable that the children inherit, and
``xbench`` started with ``LOCAL_RANK`` > 0 and that variable runs exactly that job.

Lightning also leaves the parent marked as one rank of a running group (``LOCAL_RANK``,
``MASTER_PORT``... and an open process group); the next job of a sweep in the same process
would then join the finished group instead of launching its own ranks, so both are undone
when the job ends.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ENV_VAR = "XBENCH_SPAWNED_JOB"
LAUNCH_VARS = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE", ENV_VAR)


@contextmanager
def shared_with_spawned_ranks(config: dict[str, Any], choices: dict[str, str],
                              overrides: list[str], run_dir: Path) -> Iterator[None]:
    """While the job runs, any rank Lightning spawns inherits it; afterwards, no trace."""
    import torch.distributed as dist

    saved = {name: os.environ.get(name) for name in LAUNCH_VARS}
    group_existed = dist.is_available() and dist.is_initialized()
    os.environ[ENV_VAR] = json.dumps({"config": config, "choices": choices,
                                      "overrides": overrides, "run_dir": str(run_dir)})
    try:
        yield
    finally:
        if dist.is_available() and dist.is_initialized() and not group_existed:
            dist.destroy_process_group()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def spawned_job() -> dict[str, Any] | None:
    """The parent's job when this process is a rank Lightning spawned, else None."""
    if ENV_VAR not in os.environ or int(os.environ.get("LOCAL_RANK", "0")) == 0:
        return None
    job = json.loads(os.environ[ENV_VAR])
    job["run_dir"] = Path(job["run_dir"])
    return job


def run_spawned_rank(job: dict[str, Any]) -> None:
    """This rank's share of the parent's job.  A stop on a signal is rank 0's to record and
    report (every rank stops at the same step: :mod:`.preemption`); here it ends quietly with
    status 0 -- Lightning's child observer SIGKILLs rank 0 when a child exits non-zero, which
    could cut its record short."""
    from xformer_bench.run import execute
    from xformer_bench.training.preemption import RunInterrupted

    try:
        execute(**job)
    except RunInterrupted:
        pass
