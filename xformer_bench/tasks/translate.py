"""Translation (Vaswani et al. 2017 on WMT'14): label-smoothed cross-entropy with teacher
forcing (``optim.label_smoothing``, the paper's 0.1, section 5.4), and BLEU with sacreBLEU
(Post 2018) on detokenised output against the raw references, its signature in the record.

Evaluation decodes every sentence of the split: validation greedily
(:mod:`~xformer_bench.models.greedy_search`), test with beam search (``eval.beam``, the paper's 4, and the GNMT length penalty
``eval.length_penalty`` = 0.6; at most ``eval.max_extra_len`` = 50 tokens beyond the source
length, section 6.1, and within the model's ``data.seq_len`` positions).  Both also log the
mean per-token cross-entropy of the references (``val/loss``, no smoothing).  Validations
before the last score that loss alone (``eval.val_bleu: last``, the default; ``every``, ``never``):
decoding is sequential, and BLEU at every validation made WMT's default run 30 % validation
(``results/bench/validation.md``); the last validation and the test decode and score BLEU.  The decoder
continues each hypothesis from a key/value cache (one new position a step, the cache reordered
with the beam) when its stack, position and self-attention allow
(:func:`~xformer_bench.models.cached_decoding.cache_blocker`); otherwise it recomputes every
prefix whole -- the same translations, slower (the record's ``decoding.cache`` says which).
"""

from __future__ import annotations

import lightning as L
import torch
from sacrebleu.metrics import BLEU as SacreBLEU

from xformer_bench.metric_spec import MetricSpec
from xformer_bench.models.beam_search import beam_search
from xformer_bench.models.greedy_search import greedy_search
from xformer_bench.core.decode_cache import DecodeCache
from xformer_bench.models.build import build_seq2seq
from xformer_bench.models.cached_decoding import cache_blocker
from xformer_bench.tasks import TASK
from xformer_bench.tasks.base import Task
from xformer_bench.training.validation_schedule import validation_steps

BLEU = MetricSpec("bleu", "BLEU", higher_is_better=True, digits=2)


def gather_objects(items: list) -> list:
    """``items`` of every rank, concatenated (this rank's alone outside distributed runs)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return items
    gathered: list[list] = [None] * torch.distributed.get_world_size()  # type: ignore[list-item]
    torch.distributed.all_gather_object(gathered, items)
    return [item for part in gathered for item in part]


class TranslationTask(Task):
    unit = "tokens"
    metrics = (BLEU,)

    def __init__(self, model: torch.nn.Module, datamodule, optim: dict, max_steps: int,
                 eval_options: dict, last_validation: int = 0):
        super().__init__(model, optim, max_steps)
        self.last_validation = last_validation  # the optimizer step of the last validation
        self.val_bleu = eval_options.get("val_bleu", "last")
        self.label_smoothing = float(optim.get("label_smoothing", 0.0))
        self.ids = {k: getattr(datamodule, f"{k}_id") for k in ("pad", "bos", "eos")}
        self.detokenise, self.references = datamodule.decode, datamodule.references
        self.beam = {"val": 1, "test": int(eval_options.get("beam", 4))}
        self.length_penalty = float(eval_options.get("length_penalty", 0.6))
        self.max_extra_len = int(eval_options.get("max_extra_len", 50))
        self.hypotheses: list[tuple[int, str]] = []
        self.cached = cache_blocker(model) is None
        self.signature: str | None = None

    def _nats(self, batch, **loss) -> torch.Tensor:
        """The output head's cross-entropy of the references, teacher-forced (options
        ``loss``: the reduction, label smoothing)."""
        source, target = batch[0], batch[1]  # (B, S), (B, T + 1)
        return self.model(source, target[:, :-1], target[:, 1:], ignore_index=self.ids["pad"],
                          **loss)

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        return self.training_loss(self._nats(batch, label_smoothing=self.label_smoothing))

    def translate(self, source: torch.Tensor, beam: int) -> list[list[int]]:
        """Token ids of the best translation of each row of ``source`` (B, S): the decoder
        continues each hypothesis from a decode cache where ``cache_blocker`` allows (one
        new position a step), else recomputes every prefix whole."""
        encoded, padding = self.model.encode(source)
        lengths = (source != self.ids["pad"]).sum(dim=1)  # (B,)
        cache = DecodeCache() if self.cached else None

        def next_log_probs(prefixes: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
            rows_padding = None if padding is None else padding[rows]
            new = prefixes if cache is None or cache.length == 0 else prefixes[:, -1:]
            return self.model.decode(new, encoded[rows], rows_padding,
                                     cache=cache)[:, -1].float()

        limits = (lengths + self.max_extra_len).clamp(max=self.model.dims.seq_len - 1)  # positions
        reorder = None if cache is None else cache.reorder
        if beam == 1:  # the same tokens as beam_search at beam 1, vectorised
            return greedy_search(next_log_probs, len(source), bos_id=self.ids["bos"],
                                 eos_id=self.ids["eos"], max_len=limits, device=source.device,
                                 reorder=reorder)
        return beam_search(next_log_probs, len(source), bos_id=self.ids["bos"],
                           eos_id=self.ids["eos"], beam=beam, max_len=limits,
                           length_penalty=self.length_penalty, device=source.device,
                           reorder=reorder)

    def decodes(self, split: str) -> bool:
        """Whether this evaluation translates and scores BLEU: the test, and the validations
        ``eval.val_bleu`` names (the last, every one, or none)."""
        if split == "test" or self.val_bleu == "every":
            return True
        return self.val_bleu == "last" and self.trainer.global_step >= self.last_validation

    def _eval_step(self, batch, split: str) -> None:
        source, target, index = batch
        self.eval_nats.update(self._nats(batch, reduction="sum"))
        self.eval_count.update((target[:, 1:] != self.ids["pad"]).sum())
        if not self.decodes(split):
            return
        for i, ids in zip(index.tolist(), self.translate(source, self.beam[split])):
            self.hypotheses.append((i, self.detokenise(ids)))

    def _eval_end(self, split: str) -> None:
        self._split_loss(split)
        if not self.decodes(split):
            return
        found = dict(gather_objects(self.hypotheses))
        self.hypotheses = []
        references = self.references(split)
        order = sorted(found)
        bleu = SacreBLEU()
        score = bleu.corpus_score([found[i] for i in order], [[references[i] for i in order]])
        self.signature = str(bleu.get_signature())
        self.log(BLEU.key(split), float(score.score), prog_bar=split == "val", sync_dist=False)

    def record_fields(self) -> dict:
        """What the run record adds: sacreBLEU's signature and the decoding protocol."""
        return {"bleu_signature": self.signature,
                "decoding": {"val": {"last": "greedy, the last validation", "every": "greedy",
                                     "never": "none"}[self.val_bleu],
                             "test": f"beam {self.beam['test']}",
                             "length_penalty": self.length_penalty, "cache": self.cached,
                             "max_extra_len": self.max_extra_len}}


@TASK.register("translate")
def build(config: dict, datamodule: L.LightningDataModule) -> TranslationTask:
    """The encoder-decoder the config describes over the data's shared vocabulary."""
    trainer = config["trainer"]
    last = validation_steps(trainer["max_steps"], trainer["val_checks"])[-1]
    return TranslationTask(build_seq2seq(config, datamodule), datamodule, config["optim"],
                           max_steps=trainer["max_steps"], eval_options=config.get("eval") or {},
                           last_validation=last)
