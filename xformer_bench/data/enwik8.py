"""enwik8 (Hutter Prize): the first 10^8 bytes of an English Wikipedia XML dump, split
90M / 5M / 5M by position as in Al-Rfou et al. 2019, Transformer-XL and the Sparse
Transformer.  Looked for under the data directory, else downloaded, then memory-mapped."""

from __future__ import annotations

import shutil
import socket
import zipfile
import zlib
from pathlib import Path

import numpy as np

from xformer_bench.data.byte_windows import ByteLMDataModule
from xformer_bench.data.download import download, offline
from xformer_bench.errors import MissingDataError
from xformer_bench.registry import DATA

URL = "http://mattmahoney.net/dc/enwik8.zip"
HF_REPO = "LTCB/enwik8"
TOTAL_BYTES = 100_000_000
SPLIT_BYTES = {"train": 90_000_000, "val": 5_000_000, "test": 5_000_000}


def standard_splits(data: np.ndarray, source: Path | str = "enwik8") -> dict[str, np.ndarray]:
    """The 90M / 5M / 5M splits of ``data`` (read from ``source``, named by the error)."""
    if len(data) != TOTAL_BYTES:
        raise MissingDataError(
            f"enwik8 must be {TOTAL_BYTES:,} bytes but {source} has {len(data):,}: delete it "
            f"(and the enwik8.zip it came from) and place the original enwik8.zip ({URL})"
        )
    out, start = {}, 0
    for split, n in SPLIT_BYTES.items():
        out[split] = data[start:start + n]
        start += n
    return out


def _extract(archive: Path, destination: Path) -> Path:
    """``archive``'s member ``enwik8`` written to ``destination`` (whole, or not at all)."""
    partial = destination.with_name("enwik8.part")
    try:
        with zipfile.ZipFile(archive) as z:
            member = next((n for n in z.namelist() if Path(n).name == "enwik8"), None)
            if member is None:
                raise MissingDataError(f"{archive} holds no file named enwik8: delete it and "
                                       f"place the original enwik8.zip ({URL})")
            with z.open(member) as src, open(partial, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 22)
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as error:
        partial.unlink(missing_ok=True)
        reason = f"{type(error).__name__}: {error}".splitlines()[0][:120]
        raise MissingDataError(f"{archive} is not a readable zip ({reason}): delete it and "
                               f"place the original enwik8.zip ({URL})") from None
    partial.replace(destination)
    return destination


def _from_hub(destination: Path) -> Path:
    # datasets retries an unreachable hub for ~20 s: probe it first so offline fails fast.
    socket.create_connection(("huggingface.co", 443), timeout=3).close()
    import datasets  # imported here: slow, and only needed when the zip is unreachable

    text = datasets.load_dataset(HF_REPO, "enwik8-raw", split="train")[0]["text"]
    destination.write_bytes(text.encode("utf-8"))
    return destination


def locate(data_dir: Path) -> Path:
    """Path of the raw 100 MB ``enwik8`` file: found, extracted, or downloaded."""
    for folder in (data_dir, data_dir / "enwik8"):
        if (folder / "enwik8").is_file():
            return folder / "enwik8"
    raw = data_dir / "enwik8"
    if raw.is_dir():
        raw = raw / "enwik8"
    for archive in (data_dir / "enwik8.zip", data_dir / "enwik8" / "enwik8.zip"):
        if archive.is_file():
            return _extract(archive, raw)
    hint = (f"enwik8 not found: place enwik8.zip ({URL}) or the extracted enwik8 file in "
            f"{data_dir.resolve()} (set paths.data_dir=... or $XBENCH_DATA_DIR)")
    if offline():
        raise MissingDataError(hint + "; offline mode is on, so nothing was downloaded")
    data_dir.mkdir(parents=True, exist_ok=True)
    errors = []
    for fetch in (lambda: _extract(download(URL, data_dir / "enwik8.zip"), raw),
                  lambda: _from_hub(raw)):
        try:
            return fetch()
        except Exception as error:  # noqa: BLE001 -- every failure falls through to the hint
            errors.append(f"{type(error).__name__}: {error}".splitlines()[0][:120])
    raise MissingDataError(f"{hint}; download failed ({'; '.join(errors)})")


@DATA.register("enwik8")
def build(*, seed: int, data_dir: str, seq_len: int, batch_size: int, **loader) -> ByteLMDataModule:
    path = locate(Path(data_dir))
    empty = path.stat().st_size == 0  # cannot be memory-mapped; standard_splits names it
    data = np.zeros(0, dtype=np.uint8) if empty else np.memmap(path, dtype=np.uint8, mode="r")
    return ByteLMDataModule(standard_splits(data, path), seq_len, batch_size, seed, **loader)
