"""Parallel text: a folder of aligned sentence files, token ids stored flat, and sentence-pair
batches for an encoder-decoder.

The folder layout is the one fairseq and Marian users keep: ``train.src train.tgt valid.src
valid.tgt test.src test.tgt``, one sentence a line, line ``i`` of a split's source file the
translation of line ``i`` of its target file (the suffixes are configurable: ``train.en`` /
``train.de``).  Lines are split on ``"\\n"`` only (a trailing ``"\\r"`` is dropped), so a
sentence holding another Unicode line separator stays one sentence and the files stay aligned.

A split's tokens are one flat int32 array plus ``n + 1`` int64 offsets (sentence ``i`` is
``ids[offsets[i]:offsets[i + 1]]``), saved as ``.npy`` and memory-mapped by later runs.

Batches (the :class:`~xformer_bench.data.example_batches.Examples` protocol): the source is
``ids + [eos]``, the target ``[bos] + ids + [eos]``, each side padded at the end with ``pad_id``
to the longest sequence of the batch (not to a fixed length); evaluation batches add the
examples' positions.  Simplification: training batches are ``batch_size`` random sentence
pairs, not Vaswani et al.'s (2017) ~25,000-token batches of pairs of similar length, so they
carry more padding per real token.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from xformer_bench.errors import MissingDataError

SPLITS = ("train", "val", "test")
FILE_STEMS = {"train": "train", "val": "valid", "test": "test"}
"""Our split names -> the file stems of the folder layout."""


def read_lines(file: Path, limit: int | None = None) -> list[str]:
    """The sentences of ``file`` (UTF-8), one per ``"\\n"``-terminated line, exactly as
    written but for a trailing ``"\\r"``; the first ``limit`` only when given."""
    text = file.read_text(encoding="utf-8")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline ending the last line ends no further sentence
    if limit is not None:
        lines = lines[:limit]
    return [line[:-1] if line.endswith("\r") else line for line in lines]


class ParallelFolder:
    """``DIR/{train,valid,test}.{src_suffix,tgt_suffix}``: aligned sentence files."""

    def __init__(self, folder: str | Path, src_suffix: str = "src", tgt_suffix: str = "tgt"):
        self.folder = Path(folder).expanduser()
        self.languages = (str(src_suffix), str(tgt_suffix))
        if self.languages[0] == self.languages[1]:
            raise MissingDataError(f"data.src_suffix and data.tgt_suffix are both "
                                   f"'{src_suffix}': name two different files")
        missing = [p.name for p in self.files() if not p.is_file()]
        if missing:
            raise MissingDataError(
                f"data.path={folder}: missing {', '.join(missing)} in {self.folder.resolve()} "
                "(expected train/valid/test files, one sentence a line, source and target "
                "aligned; set data.src_suffix / data.tgt_suffix to match their extensions)")

    def file(self, split: str, language: str) -> Path:
        return self.folder / f"{FILE_STEMS[split]}.{language}"

    def files(self) -> list[Path]:
        return [self.file(s, lang) for s in SPLITS for lang in self.languages]

    def identity(self) -> str:
        """Names what was read: the folder and each file's name, size and modification time
        (sorted, so that swapping the suffixes names the same data)."""
        stats = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in self.files())
        return json.dumps({"folder": str(self.folder.resolve()), "files": stats})

    def read(self, split: str, limit: int | None = None) -> dict[str, list[str]]:
        """``{language: sentences}`` of ``split`` (its first ``limit`` pairs when given);
        files of different lengths are one error line naming both counts."""
        out = {lang: read_lines(self.file(split, lang)) for lang in self.languages}
        (a, lines_a), (b, lines_b) = out.items()
        if len(lines_a) != len(lines_b):
            raise MissingDataError(
                f"data.path={self.folder}: {self.file(split, a).name} has {len(lines_a):,} lines "
                f"but {self.file(split, b).name} has {len(lines_b):,}: the source and target "
                "files of a split must be aligned, one sentence a line")
        return {lang: lines if limit is None else lines[:limit] for lang, lines in out.items()}


@dataclass
class TokenIds:
    """The token ids of ``len(offsets) - 1`` sentences, stored flat."""

    ids: np.ndarray      # (total,) int32
    offsets: np.ndarray  # (n + 1,) int64, offsets[0] == 0

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def row(self, i: int) -> np.ndarray:
        return self.ids[self.offsets[i]:self.offsets[i + 1]]


def _save_array(path: Path, array: np.ndarray) -> None:
    with open(path, "wb") as f:
        np.save(f, array)


class TokenStore:
    """A folder of tokenised splits: ``<split>.<language>.ids.npy`` / ``.offsets.npy`` and, for
    the evaluation splits, the raw sentences ``<split>.<language>.json`` (the references).
    Written whole into a temporary folder, then renamed: a folder that exists is complete."""

    def __init__(self, folder: Path):
        self.folder = folder

    def exists(self) -> bool:
        return (self.folder / "meta.json").is_file()

    def write(self, tokens: dict[tuple[str, str], TokenIds],
              sentences: dict[tuple[str, str], list[str]], meta: dict) -> None:
        partial = self.folder.with_name(f"{self.folder.name}.part-{uuid.uuid4().hex[:8]}")
        partial.mkdir(parents=True)
        try:
            for (split, lang), t in tokens.items():
                _save_array(partial / f"{split}.{lang}.ids.npy", t.ids.astype(np.int32))
                _save_array(partial / f"{split}.{lang}.offsets.npy", t.offsets.astype(np.int64))
            for (split, lang), lines in sentences.items():
                (partial / f"{split}.{lang}.json").write_text(json.dumps(lines, ensure_ascii=False),
                                                              encoding="utf-8")
            (partial / "meta.json").write_text(json.dumps(meta, indent=1))
            try:
                os.rename(partial, self.folder)
            except OSError:  # another run finished the same folder first: keep theirs
                if not self.exists():
                    raise
        finally:
            shutil.rmtree(partial, ignore_errors=True)

    def tokens(self, split: str, lang: str) -> TokenIds:
        """A split's ids, memory-mapped (offsets in memory)."""
        file = self.folder / f"{split}.{lang}.ids.npy"
        try:
            ids = np.load(file, mmap_mode="r")
        except ValueError:  # an empty array cannot be memory-mapped
            ids = np.load(file)
        return TokenIds(ids, np.load(self.folder / f"{split}.{lang}.offsets.npy"))

    def sentences(self, split: str, lang: str) -> list[str]:
        return json.loads((self.folder / f"{split}.{lang}.json").read_text(encoding="utf-8"))

    def meta(self) -> dict:
        return json.loads((self.folder / "meta.json").read_text())


class ParallelExamples:
    """Sentence pairs as batches ``(source (B, S), target (B, T))`` int64, plus ``index (B,)``
    when ``with_index`` (evaluation).  ``rows`` (optional) maps example ``i`` to sentence
    ``rows[i]`` (the training pairs kept); ``max_len`` truncates each side's ids before
    ``eos`` is added (None: no cap)."""

    def __init__(self, source: TokenIds, target: TokenIds, *, pad_id: int, bos_id: int,
                 eos_id: int, rows: np.ndarray | None = None, max_len: int | None = None,
                 with_index: bool = False):
        if len(source) != len(target):
            raise ValueError(f"{len(source)} source sentences but {len(target)} targets")
        self.source, self.target, self.rows = source, target, rows
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id
        self.max_len, self.with_index = max_len, with_index

    def __len__(self) -> int:
        return len(self.source) if self.rows is None else len(self.rows)

    def _padded(self, rows: list[np.ndarray]) -> torch.Tensor:
        out = np.full((len(rows), max(len(r) for r in rows)), self.pad_id, dtype=np.int64)
        for i, r in enumerate(rows):
            out[i, :len(r)] = r
        return torch.from_numpy(out)

    def batch(self, indices: np.ndarray, rng: np.random.Generator | None = None
              ) -> tuple[torch.Tensor, ...]:
        sentences = np.asarray(indices) if self.rows is None else self.rows[indices]
        cap = self.max_len
        bos, eos = np.array([self.bos_id]), np.array([self.eos_id])
        source = [np.concatenate([self.source.row(i)[:cap], eos]) for i in sentences]
        target = [np.concatenate([bos, self.target.row(i)[:cap], eos]) for i in sentences]
        out = (self._padded(source), self._padded(target))
        if self.with_index:
            out += (torch.as_tensor(np.asarray(indices), dtype=torch.int64),)
        return out
