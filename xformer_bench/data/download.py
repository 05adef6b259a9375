"""Fetching files: fail fast offline, show progress online, never leave a partial file."""

from __future__ import annotations

import os
import urllib.request
from pathlib import Path

from tqdm import tqdm

OFFLINE_VARIABLES = ("XBENCH_OFFLINE", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


def offline() -> bool:
    """True when the user (or a test) said there is no network."""
    return any(os.environ.get(v, "0").lower() in ("1", "true", "yes") for v in OFFLINE_VARIABLES)


def download(url: str, destination: Path, timeout: float = 15.0) -> Path:
    """Stream ``url`` to ``destination`` atomically (``.part`` then rename)."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    partial = destination.with_name(destination.name + ".part")
    with urllib.request.urlopen(url, timeout=timeout) as response, open(partial, "wb") as out:
        total = int(response.headers.get("Content-Length") or 0) or None
        with tqdm(total=total, unit="B", unit_scale=True, desc=f"downloading {destination.name}") as bar:
            while chunk := response.read(1 << 20):
                out.write(chunk)
                bar.update(len(chunk))
    os.replace(partial, destination)
    return destination
