"""One process per run id: two sweeps writing the same ``results/`` never train one run twice.

Before a run starts, its process claims it: ``<results_dir>/<experiment>/.<run_id>.claim``,
created exclusively (``O_CREAT | O_EXCL``, atomic on local and NFSv3+ file systems) with the
claimant's host, pid and start time.  Another sweep reaching the same run skips it ("running in
another process") and goes on; the claim goes when the run ends, however it ends (a killed
process's claim is stale: on the same host, a claim whose pid is gone is taken over).  A claim
from another host cannot be checked from here: the skip line names its holder, since when, and
the command that clears it if that node is gone.  Records are written atomically under the run
id, so nothing is double-counted either.
"""

from __future__ import annotations

import os
import socket
from datetime import datetime, timezone
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from xformer_bench.parallel_sweep import ENVIRONMENT


def claim_path(record_path: Path) -> Path:
    return record_path.with_name(f".{record_path.stem}.claim")


def _holder(claim: Path) -> tuple[str, int, str] | None:
    """(host, pid, start time -- ``?`` in a claim written before it was recorded)."""
    try:
        host, pid, *since = claim.read_text().split()
        return host, int(pid), (since[0] if since else "?")
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


def _stale(claim: Path) -> bool:
    """A claim left by a process of this host that no longer exists (or unreadable)."""
    holder = _holder(claim)
    if holder is None:
        return True
    host, pid, _ = holder
    return host == socket.gethostname() and not _alive(pid)


def _create(claim: Path) -> bool:
    try:
        fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        started = datetime.now(timezone.utc).isoformat(timespec="seconds")
        f.write(f"{socket.gethostname()} {os.getpid()} {started}\n")
    return True


def holder_of(record_path: Path) -> str | None:
    """``host:pid`` of the live process running this run, else None."""
    claim = claim_path(record_path)
    holder = _holder(claim) if claim.exists() and not _stale(claim) else None
    return None if holder is None else f"{holder[0]}:{holder[1]}"


def _parent_of(pid: int) -> int | None:
    """The parent pid of ``pid`` (Linux's /proc), None where it cannot be read."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def held_by_sibling(record_path: Path) -> bool:
    """Whether another worker of this ``--workers`` sweep holds the run: this process is a
    worker (``XBENCH_WORKERS``) and the holder, on this host, has the same parent."""
    holder = _holder(claim_path(record_path))
    return (ENVIRONMENT in os.environ and holder is not None
            and holder[0] == socket.gethostname() and holder[1] != os.getpid()
            and _parent_of(holder[1]) == os.getppid())


def claim_line(record_path: Path) -> str:
    """Who holds this run's claim, since when, and how to clear it if that process is gone."""
    claim = claim_path(record_path)
    holder = _holder(claim)
    if holder is None:
        return f"claimed by {claim}"
    host, pid, since = holder
    where = "this host" if host == socket.gethostname() else host
    return (f"pid {pid} on {where} since {since}; if that process is gone (its node down), "
            f"clear the claim: rm {claim}")


@contextmanager
def claimed(record_path: Path) -> Iterator[bool]:
    """Yields True when this process now owns the run (released on exit), False when a live
    process elsewhere does."""
    claim = claim_path(record_path)
    created = [p for p in (claim.parent, *claim.parent.parents) if not p.exists()]
    claim.parent.mkdir(parents=True, exist_ok=True)
    owned = _create(claim)
    if not owned and _stale(claim):
        claim.unlink(missing_ok=True)
        owned = _create(claim)  # two taking over at once: one wins
    try:
        yield owned
    finally:
        if owned:
            claim.unlink(missing_ok=True)
        for folder in created:  # the folders made for the claim, if nothing else came in
            try:
                folder.rmdir()
            except OSError:
                break
