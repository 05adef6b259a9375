"""WMT'14 English-German (Bojar et al. 2014) as Vaswani et al. (2017, section 5.1) trained
on it: about 4.5 million sentence pairs, a joint source+target BPE vocabulary
(:mod:`xformer_bench.data.bpe`; the paper's ~37,000 tokens), newstest2013 for validation and
newstest2014 (3,003 sentences) for the reported test BLEU.  Task ``translate``: see
:mod:`xformer_bench.data` for the contract and :mod:`xformer_bench.data.parallel_text` for the
batches.

Where the sentences come from, first found wins:

1. ``data.path=DIR`` -- your own aligned files ``DIR/{train,valid,test}.{src,tgt}`` (suffixes
   ``data.src_suffix`` / ``data.tgt_suffix``, e.g. ``en`` / ``de``); ``src_lang`` /
   ``tgt_lang`` are then the suffixes.
2. ``${data_dir}/wmt14/<config>/`` (``<config>`` = ``de-en`` for either direction): a
   ``datasets`` ``save_to_disk`` folder, or the HF parquet shards ``train-*.parquet``,
   ``validation-*.parquet``, ``test-*.parquet`` (a ``translation`` struct column
   ``{"de": ..., "en": ...}``), e.g. from ``huggingface-cli download wmt/wmt14 --repo-type
   dataset --include 'de-en/*' --local-dir ${data_dir}/wmt14``.
3. Online: ``datasets.load_dataset("wmt/wmt14", "de-en")`` (its test split is newstest2014,
   validation newstest2013), saved there with ``save_to_disk``.  The hub is probed with a 3 s
   connect first; offline, a missing data set is one :class:`MissingDataError` line.

``direction`` (``en-de``) picks the source and target language of the HF data.  The BPE
tokenizer is cached as ``${data_dir}/wmt14/bpe-<key>.json`` and the tokenised splits (and the
raw evaluation sentences) in ``${data_dir}/wmt14/tokens-<key>/``, ``<key>`` hashing the data's
identity (files, sizes), ``vocab_size`` and ``subset``: later runs read neither the text nor
the tokenizer's trainer.

Simplifications, named (the paper's setting: ``data.subset=null data.vocab_size=37000``, and
batches of ~25,000 tokens -- here ``batch_size`` sentence pairs):

- ``subset`` (200,000) keeps the first N training pairs (in the data's order, not sampled),
  so that BPE training, tokenisation and an epoch fit a CPU; ``null`` keeps all 4.5M.
- ``vocab_size`` 8,000 (the paper: 37,000 shared), byte-level BPE on raw text (see bpe.py).
- Training pairs with more than ``max_source_len`` / ``max_target_len`` BPE tokens (before
  eos / bos) are dropped (``dropped_train_pairs`` counts them, logged); evaluation keeps every
  sentence, truncating only those over ``max_eval_len`` tokens (a warning; BLEU is still
  computed against every raw reference).
- Batches are random pairs padded to the batch's longest sequence, not length-sorted.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import socket
import uuid
from pathlib import Path

import numpy as np

from xformer_bench.data.bpe import JointBPE
from xformer_bench.data.download import offline
from xformer_bench.data.example_batches import ExampleDataModule
from xformer_bench.data.parallel_text import SPLITS, ParallelExamples, ParallelFolder, TokenStore
from xformer_bench.errors import ConfigError, MissingDataError
from xformer_bench.registry import DATA

log = logging.getLogger(__name__)

HF_DATASET = "wmt/wmt14"
HF_SPLITS = {"train": "train", "val": "validation", "test": "test"}
CACHE_VERSION = 1
"""Part of the cache key: raise it when the tokenizer or the token files change meaning."""


def _file_stats(files: list[Path], root: Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(root)), p.stat().st_size) for p in files)


def _texts(table, languages: tuple[str, ...], where: Path) -> dict[str, list[str]]:
    """``{language: sentences}`` of an arrow table's ``translation`` struct column."""
    import pyarrow as pa

    kind = table.schema.field("translation").type if "translation" in table.column_names else None
    struct = kind is not None and pa.types.is_struct(kind)
    names = {kind.field(i).name for i in range(kind.num_fields)} if struct else set()
    if not set(languages) <= names:
        raise MissingDataError(f"{where}: expected a 'translation' column of "
                               f"{{{', '.join(languages)}}} sentences, found columns "
                               f"{table.column_names} ({kind})")
    out: dict[str, list[str]] = {lang: [] for lang in languages}
    for chunk in table.column("translation").chunks:
        for lang in languages:
            out[lang].extend(s or "" for s in chunk.field(lang).to_pylist())
    return out


class ParquetShards:
    """HF layout: ``<folder>/<split>-*.parquet`` (or ``<folder>/<split>/*.parquet``)."""

    def __init__(self, folder: Path, languages: tuple[str, str]):
        self.folder, self.languages = folder, languages
        self.shards = {s: sorted([*folder.glob(f"{h}-*.parquet"), *folder.glob(f"{h}/*.parquet")])
                       for s, h in HF_SPLITS.items()}

    def present(self) -> bool:
        found = [s for s, files in self.shards.items() if files]
        if found and len(found) < len(SPLITS):
            missing = [HF_SPLITS[s] for s in SPLITS if s not in found]
            patterns = ", ".join(f"{m}-*.parquet" for m in missing)
            raise MissingDataError(f"{self.folder} holds parquet shards but none for "
                                   f"{', '.join(missing)} ({patterns})")
        return bool(found)

    def identity(self) -> str:
        files = [f for s in SPLITS for f in self.shards[s]]
        return json.dumps({"parquet": _file_stats(files, self.folder)})

    def read(self, split: str, limit: int | None = None) -> dict[str, list[str]]:
        import pyarrow as pa
        import pyarrow.parquet as pq

        out: dict[str, list[str]] = {lang: [] for lang in self.languages}
        for shard in self.shards[split]:
            for batch in pq.ParquetFile(shard).iter_batches(batch_size=1 << 16):
                if limit is not None and len(out[self.languages[0]]) >= limit:
                    break  # subset: the rest of the shards is never read
                texts = _texts(pa.Table.from_batches([batch]), self.languages, shard)
                for lang in self.languages:
                    out[lang].extend(texts[lang])
        return {lang: lines[:limit] for lang, lines in out.items()}


class SavedDataset:
    """A ``datasets`` ``save_to_disk`` folder holding train / validation / test."""

    def __init__(self, folder: Path, languages: tuple[str, str]):
        self.folder, self.languages = folder, languages

    def present(self) -> bool:
        return (self.folder / "dataset_dict.json").is_file()

    def identity(self) -> str:
        files = [p for p in self.folder.rglob("*") if p.is_file()]
        return json.dumps({"saved": _file_stats(files, self.folder)})

    def read(self, split: str, limit: int | None = None) -> dict[str, list[str]]:
        import datasets

        dataset = datasets.load_from_disk(str(self.folder))[HF_SPLITS[split]]
        n = len(dataset) if limit is None else min(limit, len(dataset))
        return _texts(dataset.with_format("arrow")[0:n], self.languages, self.folder)


def _download(folder: Path, config: str) -> None:
    # datasets retries an unreachable hub for ~20 s: probe it first so offline fails fast.
    socket.create_connection(("huggingface.co", 443), timeout=3).close()
    import datasets  # imported here: slow, and only needed to download

    dataset = datasets.load_dataset(HF_DATASET, config)
    partial = folder.with_name(f"{folder.name}.part-{uuid.uuid4().hex[:8]}")
    try:
        dataset.save_to_disk(str(partial))
        partial.rename(folder)
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def hf_config(direction: str) -> tuple[tuple[str, str], str]:
    """``("en", "de"), "de-en"`` for ``en-de``: the languages in order and the WMT'14 config
    (every WMT'14 config pairs a language with English, English second)."""
    languages = tuple(str(direction).split("-"))
    if len(languages) != 2 or "en" not in languages or languages[0] == languages[1]:
        raise ConfigError(f"data.direction={direction}: expected source-target with English on "
                          "one side, e.g. en-de or de-en")
    other = languages[0] if languages[1] == "en" else languages[1]
    return languages, f"{other}-en"  # type: ignore[return-value]


def locate(data_dir: Path, direction: str, path: str | None, src_suffix: str, tgt_suffix: str):
    """The source of the sentences (``languages``, ``identity()``, ``read(split, limit)``)."""
    if path:
        return ParallelFolder(path, src_suffix, tgt_suffix)
    languages, config = hf_config(direction)
    folder = data_dir / "wmt14" / config
    for source in (SavedDataset(folder, languages), ParquetShards(folder, languages)):
        if source.present():
            return source
    hint = (f"WMT'14 {config} not found: place parallel text in DIR (train.src/train.tgt/"
            "valid.src/valid.tgt/test.src/test.tgt, one sentence a line) and pass "
            f"data.path=DIR, or parquet shards of {HF_DATASET} {config} (train-*.parquet, "
            f"validation-*.parquet, test-*.parquet) in {folder.resolve()}")
    if offline():
        raise MissingDataError(hint + "; offline mode is on, so nothing was downloaded")
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        _download(folder, config)
    except Exception as error:  # noqa: BLE001 -- every failure ends in the hint
        reason = f"{type(error).__name__}: {error}".splitlines()[0][:160]
        raise MissingDataError(f"{hint}; download failed ({reason})") from None
    return SavedDataset(folder, languages)


def cache_key(identity: str, vocab_size: int, subset: int | None) -> str:
    spec = {"source": identity, "vocab_size": vocab_size, "subset": subset,
            "version": CACHE_VERSION}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


class TranslationDataModule(ExampleDataModule):
    """Sentence pairs over a joint BPE vocabulary (task ``translate``, unit ``tokens``)."""

    task = "translate"
    unit = "tokens"

    def __init__(self, splits, bpe: JointBPE, store: TokenStore, src_lang: str, tgt_lang: str,
                 **loader):
        super().__init__(splits, **loader)
        self.bpe, self.store = bpe, store
        self.src_lang, self.tgt_lang = src_lang, tgt_lang
        self.vocab_size = bpe.vocab_size
        self.pad_id, self.bos_id, self.eos_id = bpe.pad_id, bpe.bos_id, bpe.eos_id
        self.dropped_train_pairs = 0
        self.truncated_eval: dict[str, int] = {}
        self._references: dict[str, list[str]] = {}

    def encode(self, sentence: str) -> list[int]:
        """BPE ids of one sentence (no bos / eos)."""
        return self.bpe.encode_one(sentence)

    def decode(self, ids) -> str:
        """Detokenised text of ``ids`` (cut at the first eos; bos and pad dropped)."""
        return self.bpe.decode(ids.tolist() if hasattr(ids, "tolist") else ids)

    def references(self, split: str) -> list[str]:
        """The raw target sentences of ``val`` or ``test``, as read, in example order."""
        if split not in ("val", "test"):
            raise KeyError(f"references of the evaluation splits only (val, test), not {split!r}")
        if split not in self._references:
            self._references[split] = self.store.sentences(split, self.tgt_lang)
        return self._references[split]


def _tokenise(source, store: TokenStore, bpe_path: Path, vocab_size: int,
              subset: int | None) -> JointBPE:
    """The tokenizer, and the token store filled: both from their caches when there."""
    raw: dict[str, dict[str, list[str]]] = {}

    def text(split: str) -> dict[str, list[str]]:
        if split not in raw:
            raw[split] = source.read(split, subset if split == "train" else None)
        return raw[split]

    def corpus():
        train = text("train")
        return (s for lang in source.languages for s in train[lang]), \
            sum(len(v) for v in train.values())

    bpe = JointBPE.load_or_train(bpe_path, corpus, vocab_size)
    if not store.exists():
        tokens, sentences = {}, {}
        for split in SPLITS:
            for lang, lines in text(split).items():
                tokens[split, lang] = bpe.encode(lines, desc=f"BPE: tokenising {split}.{lang}")
                if split != "train":
                    sentences[split, lang] = lines
        counts = {s: len(tokens[s, source.languages[0]]) for s in SPLITS}
        store.write(tokens, sentences, {"identity": source.identity(), "bpe": bpe_path.name,
                                        "sentences": counts})
    return bpe


@DATA.register("wmt14")
def build(*, seed: int, data_dir: str, batch_size: int, seq_len: int = 256,
          path: str | None = None, src_suffix: str = "src", tgt_suffix: str = "tgt",
          direction: str = "en-de", subset: int | None = 200_000, vocab_size: int = 8000,
          max_source_len: int = 128, max_target_len: int = 128, max_eval_len: int | None = None,
          **loader) -> TranslationDataModule:
    max_eval_len = seq_len - 1 if max_eval_len is None else max_eval_len
    longest = max(max_source_len, max_target_len, max_eval_len)
    if longest + 1 > seq_len:
        raise ConfigError(f"data.seq_len={seq_len} is the model's longest sequence: sources and "
                          f"targets take up to max(max_source_len, max_target_len, max_eval_len)"
                          f" + 1 = {longest + 1} positions; raise data.seq_len or lower them")
    if subset is not None and subset < 1:
        raise ConfigError(f"data.subset={subset}: a number of training pairs >= 1, or null for all")
    source = locate(Path(data_dir), direction, path, src_suffix, tgt_suffix)
    src_lang, tgt_lang = source.languages
    root = Path(data_dir) / "wmt14"
    key = cache_key(source.identity(), int(vocab_size), subset)
    store = TokenStore(root / f"tokens-{key}")
    bpe = _tokenise(source, store, root / f"bpe-{key}.json", int(vocab_size), subset)

    ids = dict(pad_id=bpe.pad_id, bos_id=bpe.bos_id, eos_id=bpe.eos_id)
    src, tgt = store.tokens("train", src_lang), store.tokens("train", tgt_lang)
    keep = np.flatnonzero((src.lengths() <= max_source_len) & (tgt.lengths() <= max_target_len))
    dropped = len(src) - len(keep)
    if len(keep) == 0:
        raise ConfigError(f"all {len(src):,} training pairs are longer than data.max_source_len="
                          f"{max_source_len} / data.max_target_len={max_target_len} tokens: "
                          "raise them")
    splits = {"train": ParallelExamples(src, tgt, rows=keep, **ids)}
    truncated = {}
    for split in ("val", "test"):
        src, tgt = store.tokens(split, src_lang), store.tokens(split, tgt_lang)
        too_long = (src.lengths() > max_eval_len) | (tgt.lengths() > max_eval_len)
        truncated[split] = int(too_long.sum())
        if truncated[split]:
            log.warning("wmt14: %d %s sentence pairs have more than max_eval_len=%d tokens and "
                        "are truncated to it", truncated[split], split, max_eval_len)
        splits[split] = ParallelExamples(src, tgt, max_len=max_eval_len, with_index=True, **ids)

    datamodule = TranslationDataModule(splits, bpe, store, src_lang, tgt_lang,
                                       batch_size=batch_size, seed=seed, **loader)
    datamodule.dropped_train_pairs = dropped
    datamodule.truncated_eval = truncated
    log.info("wmt14 %s->%s: %d training pairs (%d longer than %d / %d tokens dropped), %d val, "
             "%d test; vocabulary %d (%s)", src_lang, tgt_lang, len(keep),
             datamodule.dropped_train_pairs, max_source_len, max_target_len,
             len(splits["val"]), len(splits["test"]), bpe.vocab_size, bpe.path)
    return datamodule
