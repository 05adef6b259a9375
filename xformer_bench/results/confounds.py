"""Confounds: what a table row changes besides what names it, against the study's baseline row.

A row of a study is named by its swept choice (``model=transformer_xl``, ``attention=local``)
or override; a confound is anything else in which its runs differ from the baseline row's
(the study's ``baseline:``), compared on the same dataset (the loss columns'):

* a group choice (``record["choices"]``) other than the row's named groups and the plumbing
  groups (data, trainer, logger): ``position=xl_relative``, ``stack=recurrent``.  A preset's
  other choices are confounds: Transformer-XL differs from vanilla in its positions too;
* a configuration key (``record["config"]`` flattened to dotted keys, as the run identity sees
  it: :func:`~xformer_bench.results.record.identity_config`) outside the nodes of the row's
  named groups and of the groups whose choice already differs, less :data:`IGNORED` (labels,
  names, seeds, paths, logging and machine plumbing).  The swept group's own node is the
  option itself and never a confound, so a swept model preset's own sizes are its own;
* what parameter matching re-solved (``match_params``), named with the value it was measured
  against -- ``d_ff 259 (baseline 512)``: RetNet's feed-forward halved to make up for its wider
  mixer; ``d_model 84 (baseline 128)``: the all-attention network narrowed to pay for its
  persistent vectors, even in a row named by its model preset (the match, not the preset, set
  it); with ``by: mixer``, ``expand_v 0.6875 (default 2)`` -- and declared by the match (so
  listed, never marked); the parameter check below says whether the match held;
* a row named by a ``modification=`` bundle (Narang et al.'s rows that combine choices) is
  named by what the bundle sets as well (:func:`bundle_effects`);
* the evaluation protocol (``record["eval_protocol"]``: streams with memory, sliding or
  non-overlapping windows); ``eval.*`` keys are then left to it;
* the parameter count, when the study matches parameters and the row misses the baseline's
  by more than the tolerance.

A study may accept some in ``allowed_differences:`` (group names, dotted keys or key
prefixes, ``eval_protocol``, ``params``): those are still listed, the others are undeclared,
mark the row (:data:`MARK`) and give one warning line each time the table is made.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from xformer_bench.config import PLUMBING_GROUPS, find_config, flatten
from xformer_bench.results.record import identity_config
from xformer_bench.results.variants import data_of

MARK = "‡"
BUNDLE = "modification"  # the group whose options bundle other groups' choices and keys
NOTE_ITEMS = 4  # items per row in the Markdown/LaTeX note (the CSV has them all)
IGNORED_ROOTS = ("seed", "experiment_name", "sweep", "hydra")
IGNORED_LEAVES = ("label", "name")
IGNORED = ("data.path", "data.num_workers", "trainer.accelerator", "trainer.devices",
           "trainer.num_nodes", "trainer.strategy", "trainer.log_every_n_steps",
           "trainer.checkpoint", "trainer.checkpoint_every", "trainer.progress_bar",
           "trainer.compile")
"""Keys that say where, on what and how visibly a run ran, not what it computed."""


@dataclass(frozen=True)
class Difference:
    name: str   # what allowed_differences names: "position", "model.d_ff", "eval_protocol"
    text: str   # "position=xl_relative", "evaluated as streams (10 lanes, ...)"
    allowed: bool = False


def ignored_key(key: str, skipped_roots: set[str]) -> bool:
    root, leaf = key.split(".")[0], key.split(".")[-1]
    return (root in skipped_roots or root in IGNORED_ROOTS or key in IGNORED
            or ("." in key and leaf in IGNORED_LEAVES))


def value_text(value: Any) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def protocol_text(protocol: Mapping[str, Any] | None, unit: str = "bytes",
                  short: bool = False) -> str:
    """``{"windows": "streams", "lanes": 10, "memory": 128, ...}`` -> 'streams (10 lanes, 128
    bytes of memory, warmed on 384 bytes)'; windows -> 'non-overlapping windows of 128 bytes'.
    ``short``: a table cell, 'streams, 10 lanes, memory 128, warm' or 'non-overlapping, 128'."""
    if not protocol:
        return ""
    kind = protocol.get("windows")
    if short and kind == "streams":
        return (f"streams, {protocol.get('lanes')} lanes, memory {protocol.get('memory')}"
                + (", warm" if protocol.get("warmup") else ""))
    if short:
        stride = f" by {protocol.get('stride')}" if kind == "sliding" else ""
        return f"{kind}, {protocol.get('seq_len')}{stride}"
    if kind == "streams":
        parts = [f"{protocol.get('lanes')} lanes", f"{protocol.get('memory')} {unit} of memory"]
        if protocol.get("warmup"):
            parts.append(f"warmed on {protocol['warmup']} {unit}")
        return f"streams ({', '.join(parts)})"
    if kind == "sliding":
        return (f"sliding windows of {protocol.get('seq_len')} {unit}, "
                f"stride {protocol.get('stride')}")
    return f"{kind} windows of {protocol.get('seq_len')} {unit}"


def _si(value: float) -> str:
    from xformer_bench.results.table import si

    return si(value)


def bundle_effects(name: str | None) -> frozenset[str]:
    """What the ``modification=<name>`` bundle sets (``conf/modification/<name>.yaml``, or a
    user config folder's): the groups its defaults override and the dotted keys it sets.  A
    row named by a bundle is named by these too: SwiGLU's ``activation=swiglu`` is its change,
    not a confound."""
    path = find_config(BUNDLE, str(name)) if name else None
    return _bundle_file_effects(path) if path is not None else frozenset()


@functools.lru_cache(maxsize=None)
def _bundle_file_effects(path: Path) -> frozenset[str]:
    node = yaml.safe_load(path.read_text()) or {}
    groups = {next(iter(entry)).split("/")[-1] for entry in node.get("defaults", [])
              if isinstance(entry, dict) and next(iter(entry)).startswith("override /")}
    keys = flatten({k: v for k, v in node.items() if k not in ("defaults", BUNDLE)})
    return frozenset(groups | set(keys))


def differences(record: dict[str, Any], base: dict[str, Any], named: Iterable[str],
                allowed: Iterable[str] = ()) -> list[Difference]:
    """What ``record`` changes from ``base`` besides its ``named`` groups and overrides (and
    what a named ``modification=`` bundle sets: :func:`bundle_effects`)."""
    named, allowed = set(named), tuple(allowed)
    if BUNDLE in named:
        named |= bundle_effects(record["choices"].get(BUNDLE)) | bundle_effects(
            base["choices"].get(BUNDLE))
    found: list[Difference] = []
    choices, base_choices = record["choices"], base["choices"]
    groups = sorted((set(choices) | set(base_choices)) - named - set(PLUMBING_GROUPS))
    changed = [g for g in groups if str(choices.get(g)) != str(base_choices.get(g))]
    found += [Difference(g, f"{g}={choices.get(g)}") for g in changed]
    protocols = record.get("eval_protocol"), base.get("eval_protocol")
    skipped = {*(n for n in named if n in choices), *changed, "logger"}
    skipped |= {"eval"} if all(protocols) else set()
    config, base_config = (flatten(identity_config(r["config"])) for r in (record, base))
    matched = record["config"].get("match_params") or {}
    re_solved = _re_solved(matched)
    for key in sorted(set(config) | set(base_config)):
        if (ignored_key(key, skipped) or key in named or key in re_solved
                or (matched and key == "model.d_ff")
                or value_text(config.get(key)) == value_text(base_config.get(key))):
            continue
        found.append(Difference(key, f"{key}={value_text(config.get(key))}"))
    if matched:
        found += _matched_widths(config, base_config, matched, skipped | named, re_solved)
    found += _parameter_gap(record, base, matched)
    if protocols[0] != protocols[1] and any(protocols):
        unit = str(record.get("eval_unit") or "bytes")
        found.append(Difference("eval_protocol", "evaluated as "
                                + (protocol_text(protocols[0], unit) or "the house default")))
    return [Difference(d.name, d.text, d.allowed or _allowed(d.name, allowed)) for d in found]


def _match_result(matched: Any) -> Mapping[str, Any]:
    result = matched.get("result") if isinstance(matched, Mapping) else None
    return result if isinstance(result, Mapping) else {}


def _re_solved(matched: Any) -> set[str]:
    """The model widths the match moved from the value the row's configuration gave them
    (``result["d_ff"]`` against ``result["d_ff_default"]``): ``{"model.d_model"}``."""
    result = _match_result(matched)
    return {f"model.{k}" for k in ("d_model", "d_ff")
            if k in result and value_text(result[k]) != value_text(result.get(f"{k}_default"))}


def _matched_widths(config: dict[str, Any], base_config: dict[str, Any], matched: Any,
                    own: set[str], re_solved: set[str]) -> list[Difference]:
    """What ``match_params`` re-solved, where it differs from the baseline row's: model.d_model
    and model.d_ff (d_ff wherever it differs, unless ``own``, the row's name, holds it and the
    match left it there: a swept preset's own sizes are its own), and the mixer's width
    (``by: mixer``) from its option's default."""
    found = []
    for key in ("model.d_model", "model.d_ff"):
        value, base_value = value_text(config.get(key)), value_text(base_config.get(key))
        named_by_row = not own.isdisjoint({"model", key})
        if value != base_value and key not in own and (
                key in re_solved or (key == "model.d_ff" and not named_by_row)):
            found.append(Difference(key, f"{key.split('.')[-1]} {value} (baseline {base_value})",
                                    allowed=True))
    result = _match_result(matched)
    key = result.get("width")
    if key and value_text(config.get(key)) != value_text(result.get("width_default")):
        found.append(Difference(key, f"{key.split('.')[-1]} {value_text(config.get(key))} "
                                     f"(default {value_text(result['width_default'])})",
                                allowed=True))
    return found


def _parameter_gap(record: dict[str, Any], base: dict[str, Any], matched: Any) -> list[Difference]:
    """The row's parameter count where it misses the study's match (``match_params``' tolerance,
    either way) or exceeds its budget (``param_budget``: at most that fraction larger than the
    baseline -- LRA's rule, Tay et al. 2021, is 0.10)."""
    params, base_params = record.get("params"), base.get("params")
    if not params or not base_params:
        return []
    gap = params / base_params - 1
    tolerance = matched.get("tolerance") if isinstance(matched, Mapping) else None
    budget = record["config"].get("param_budget")
    if tolerance is not None and abs(gap) > tolerance:
        limit = f"beyond the {tolerance:.0%} match"
    elif budget is not None and gap > budget:
        limit = f"over the study's +{budget:.0%} budget"
    else:
        return []
    return [Difference("params", f"{_si(params)} parameters ({gap:+.0%} against "
                                 f"{_si(base_params)}, {limit})")]


def _allowed(name: str, allowed: tuple[str, ...]) -> bool:
    return any(name == a or name.startswith(f"{a}.") for a in allowed)


def summary(found: list[Difference], limit: int | None = NOTE_ITEMS) -> str:
    """'also position=xl_relative, stack=recurrent; evaluated as streams (...)'."""
    settings = [d.text for d in found if d.name != "eval_protocol"]
    protocol = [d.text for d in found if d.name == "eval_protocol"]
    if limit is not None and len(settings) + len(protocol) > limit:
        keep = max(limit - len(protocol), 1)
        settings = settings[:keep] + [f"{len(settings) - keep} more"]
    parts = ([f"also {', '.join(settings)}"] if settings else []) + protocol
    return "; ".join(parts)


def undeclared(found: list[Difference]) -> list[str]:
    """The names of the differences the study does not declare, readably ('eval protocol')."""
    names = [d.name.replace("eval_protocol", "eval protocol") for d in found if not d.allowed]
    return list(dict.fromkeys(names))


def warning(experiment: str, label: str, found: list[Difference]) -> str | None:
    names = undeclared(found)
    return (f"{experiment} row {label!r} differs from the baseline in undeclared keys: "
            f"{', '.join(names)}" if names else None)


def mark(row: Any) -> str:
    """:data:`MARK` after the label of a row with an undeclared difference, else ''."""
    return MARK if undeclared(list(row.differences)) else ""


def row_differences(variant: Any, base: Any, data: str, named: Iterable[str],
                    allowed: Iterable[str] = ()) -> tuple[Difference, ...]:
    """The differences of ``variant`` from the ``base`` variant on dataset ``data`` (else on
    any dataset both ran), between a run of each (finished first)."""
    def first(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
        return min(runs, key=lambda r: r["status"] != "finished", default=None)

    for dataset in dict.fromkeys([data, *(data_of(r) for r in variant.records)]):
        record, reference = first(variant.on(dataset)), first(base.on(dataset))
        if record is not None and reference is not None:
            return tuple(differences(record, reference, named, allowed))
    return ()


def note(rows: Iterable[Any], baseline: str | None) -> str:
    """'Differences from the baseline row (Vanilla Transformer): Transformer-XL: also ...;
    ...' over the rows with ``differences``; '' when none differs."""
    listed = [row for row in rows if row.differences]
    if not listed:
        return ""
    items = "; ".join(f"{row.label}{mark(row)}: {summary(list(row.differences))}"
                      for row in listed)
    marked = any(mark(row) for row in listed)
    return (f"Differences from the baseline row ({baseline}): {items}."
            + (f" {MARK}: differs in what the study does not declare (allowed_differences)."
               if marked else ""))
