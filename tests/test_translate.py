"""The translate task on a word-mapped 'language' whose answer is known: BLEU (sacreBLEU on
detokenised text) rises from nothing, greedy in validation, beam at test, and
the record carries sacreBLEU's signature."""

from __future__ import annotations

import lightning as L
import numpy as np
import torch

from xformer_bench.data.example_batches import ExampleDataModule
from xformer_bench.core.dims import ModelDims
from xformer_bench.models.transformer_seq2seq import EncoderDecoder
from xformer_bench.tasks.translate import TranslationTask

PAD, BOS, EOS, FIRST = 0, 1, 2, 3
WORDS = 8  # source words FIRST .. FIRST+7, target words FIRST+8 .. FIRST+15


class WordMapped:
    """Sentences of 3-6 source words; the translation maps word i to word i + WORDS."""

    def __init__(self, n: int, seed: int, with_index: bool):
        rng = np.random.default_rng(seed)
        self.sources = [rng.integers(FIRST, FIRST + WORDS, rng.integers(3, 7)).tolist()
                        for _ in range(n)]
        self.with_index = with_index

    def __len__(self) -> int:
        return len(self.sources)

    def batch(self, indices, rng=None):
        sources = [self.sources[i] + [EOS] for i in indices]
        targets = [[BOS] + [w + WORDS for w in self.sources[i]] + [EOS] for i in indices]
        pad = lambda rows: torch.tensor([r + [PAD] * (max(map(len, rows)) - len(r))  # noqa: E731
                                         for r in rows])
        batch = (pad(sources), pad(targets))
        return (*batch, torch.as_tensor(indices)) if self.with_index else batch


class WordMappedData(ExampleDataModule):
    task, unit, vocab_size = "translate", "tokens", FIRST + 2 * WORDS
    pad_id, bos_id, eos_id = PAD, BOS, EOS

    def __init__(self):
        self.eval_splits = {"val": WordMapped(24, 1, True), "test": WordMapped(24, 2, True)}
        super().__init__({"train": WordMapped(512, 0, False), **self.eval_splits},
                         batch_size=32, seed=0)

    def decode(self, ids: list[int]) -> str:
        return " ".join(f"w{i}" for i in ids if i >= FIRST)

    def references(self, split: str) -> list[str]:
        return [self.decode([w + WORDS for w in s]) for s in self.eval_splits[split].sources]


def _model_and_optim(data, width: int, layers: int, **optim) -> tuple[EncoderDecoder, dict]:
    """A seeded encoder-decoder of ``width`` and ``layers`` over ``data``'s vocabulary, and the
    optimiser options (``optim`` over the defaults here)."""
    torch.manual_seed(0)
    dims = ModelDims(d_model=width, n_heads=2, n_layers=layers, d_ff=2 * width, seq_len=16,
                     vocab_size=data.vocab_size)
    model = EncoderDecoder(dims, {"name": "full"}, {"name": "layernorm"}, {"name": "gelu"},
                           {"name": "learned"}, {"name": "dense"}, {"name": "standard"},
                           pad_id=PAD)
    return model, dict(betas=(0.9, 0.98), eps=1e-8, weight_decay=0.0, decay="cosine",
                       min_lr_ratio=0.1, label_smoothing=0.1) | optim


def test_bleu_rises_from_nothing_on_a_word_mapped_language():
    data = WordMappedData()
    model, optim = _model_and_optim(data, 32, 2, lr=3e-3, warmup_steps=10)
    task = TranslationTask(model, data, optim, max_steps=250,
                           eval_options={"beam": 3, "length_penalty": 0.6, "max_extra_len": 5})
    trainer = L.Trainer(max_steps=250, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, val_check_interval=250, accelerator="cpu",
                        inference_mode=False)  # validate before fit: states stay normal tensors
    before = trainer.validate(task, datamodule=data, verbose=False)[0]["val/bleu"]
    trainer.fit(task, datamodule=data)
    after = trainer.test(task, datamodule=data, verbose=False)[0]
    assert before < 10 and after["test/bleu"] > 60  # 86 measured
    assert task.evaluated_units["test"] == sum(len(s) + 1 for s in data.eval_splits["test"].sources)
    fields = task.record_fields()
    assert fields["bleu_signature"].startswith("nrefs:1") and fields["decoding"]["test"] == "beam 3"


def test_validations_before_the_last_score_the_loss_alone_and_the_last_decodes():
    """eval.val_bleu: last (the default) -- BLEU at the last validation and the test only;
    every -- at each validation."""
    for val_bleu, decoded in (("last", [False, True]), ("every", [True, True])):
        data = WordMappedData()
        model, optim = _model_and_optim(data, 16, 1, lr=1e-3, warmup_steps=1)
        task = TranslationTask(model, data, optim, max_steps=4, last_validation=4,
                               eval_options={"max_extra_len": 2, "val_bleu": val_bleu})
        seen = []

        class Keys(L.Callback):
            def on_validation_end(self, trainer, pl_module):
                seen.append("val/bleu" in trainer.callback_metrics)
                trainer.callback_metrics.pop("val/bleu", None)

        trainer = L.Trainer(max_steps=4, logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False,
                            num_sanity_val_steps=0, val_check_interval=2, accelerator="cpu",
                            callbacks=[Keys()])
        trainer.fit(task, datamodule=data)
        assert seen == decoded, val_bleu
        assert task.record_fields()["decoding"]["val"].startswith("greedy")
