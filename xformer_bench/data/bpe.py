"""A joint byte-pair-encoding vocabulary for source and target (Sennrich et al. 2016, "Neural
Machine Translation of Rare Words with Subword Units"), as Vaswani et al. (2017) used for
WMT'14 English-German: one vocabulary of about 37,000 tokens shared by both languages, learnt
on the training side of both.

Built with HF ``tokenizers``: byte-level BPE (GPT-2's pre-tokeniser: words, numbers and
punctuation runs, each with its leading space, over the 256 byte symbols), so no text is ever
out of vocabulary and ``<unk>`` is never produced; a normaliser prepends one space to every
sentence (so that a sentence's first word is tokenised like every other word) and decoding
removes exactly that space: ``decode(encode(s)) == s`` for every string -- accents,
punctuation, repeated spaces, tabs and emoji included.  Special tokens: ``<pad>`` = 0,
``<s>`` (bos) = 1, ``</s>`` (eos) = 2, ``<unk>`` = 3; their spellings in the text are
ordinary text (``encode_special_tokens``), never the special ids.

Simplifications, named: Sennrich et al. and Vaswani et al. learnt BPE on Moses-tokenised
(and, for the paper's reported BLEU, compound-split) text with ``subword-nmt``; here the raw
sentences go in untouched (no Moses tokenisation, truecasing or Unicode normalisation), which
is what makes the detokenisation exact.  ``vocab_size`` is an upper bound: a tiny corpus may
yield fewer tokens (the datamodule reports the real size).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np
from tqdm import tqdm

from xformer_bench.data.parallel_text import TokenIds

SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>")
PAD_ID, BOS_ID, EOS_ID, UNK_ID = range(4)
ENCODE_CHUNK = 10_000
"""Sentences handed to the Rust tokeniser at a time (progress and memory granularity)."""


def _empty_tokenizer():
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.normalizer = normalizers.Prepend(" ")
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def train(sentences: Iterable[str], vocab_size: int, total: int | None = None,
          progress: bool = True):
    """A byte-level BPE tokenizer of at most ``vocab_size`` tokens learnt on ``sentences``."""
    from tokenizers import pre_tokenizers, trainers

    tokenizer = _empty_tokenizer()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=progress)
    counted = tqdm(sentences, total=total, desc="BPE: reading sentences", unit=" sentences",
                   disable=not progress, mininterval=1.0)
    tokenizer.train_from_iterator(counted, trainer=trainer, length=total)
    return tokenizer


def _atomic_save(tokenizer, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.part-{uuid.uuid4().hex[:8]}")
    tokenizer.save(str(partial))
    os.replace(partial, path)


class JointBPE:
    """One tokenizer for both languages: ``encode`` sentences to :class:`TokenIds`, ``decode``
    a model's output ids back to text."""

    pad_id, bos_id, eos_id, unk_id = PAD_ID, BOS_ID, EOS_ID, UNK_ID

    def __init__(self, tokenizer, path: Path | None = None):
        for expected, token in enumerate(SPECIAL_TOKENS):
            if tokenizer.token_to_id(token) != expected:
                raise ValueError(f"{path or 'tokenizer'}: {token} must be id {expected}")
        tokenizer.encode_special_tokens = True  # "<s>" in a sentence is text, not bos
        self.tokenizer, self.path = tokenizer, path

    @classmethod
    def load_or_train(cls, path: Path, sentences: Callable[[], tuple[Iterable[str], int]],
                      vocab_size: int, progress: bool = True) -> "JointBPE":
        """The tokenizer saved at ``path``, else one trained on ``sentences()`` (an iterable
        and its length, asked for only when training) and saved there atomically."""
        from tokenizers import Tokenizer

        if path.is_file():
            return cls(Tokenizer.from_file(str(path)), path)
        corpus, total = sentences()
        tokenizer = train(corpus, vocab_size, total, progress=progress)
        _atomic_save(tokenizer, path)
        return cls(tokenizer, path)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def encode(self, sentences: Sequence[str], desc: str = "BPE: tokenising",
               progress: bool = True) -> TokenIds:
        """Token ids (no bos / eos) of each sentence, in order."""
        lengths = np.zeros(len(sentences), dtype=np.int64)
        parts: list[np.ndarray] = []
        with tqdm(total=len(sentences), desc=desc, unit=" sentences", disable=not progress,
                  mininterval=1.0) as bar:
            for start in range(0, len(sentences), ENCODE_CHUNK):
                chunk = list(sentences[start:start + ENCODE_CHUNK])
                for j, encoding in enumerate(self.tokenizer.encode_batch(chunk,
                                                                         add_special_tokens=False)):
                    lengths[start + j] = len(encoding.ids)
                    parts.append(np.asarray(encoding.ids, dtype=np.int32))
                bar.update(len(chunk))
        offsets = np.zeros(len(sentences) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        ids = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)
        return TokenIds(ids.astype(np.int32, copy=False), offsets)

    def encode_one(self, sentence: str) -> list[int]:
        return self.tokenizer.encode(sentence, add_special_tokens=False).ids

    def decode(self, ids: Iterable[int]) -> str:
        """The text of ``ids``: everything from the first ``eos`` on is cut, ``bos`` and
        ``pad`` are dropped, and the space the normaliser prepended is removed."""
        kept = []
        for token in ids:
            token = int(token)
            if token == self.eos_id:
                break
            if token not in (self.bos_id, self.pad_id):
                kept.append(token)
        text = self.tokenizer.decode(kept, skip_special_tokens=True)
        return text[1:] if text.startswith(" ") else text
