"""How ``xbench -m experiment=<study>`` runs a study's ablation ladders
(:mod:`xformer_bench.ladder`): as Hydra sweeps one after another, each an ordinary xbench
command line (printed first).  A study whose rows are a published table's (``rows_from:``)
runs one sweep per row: :mod:`xformer_bench.paper_rows`.

A study declares ``ladders:``, either a list of model presets -- the study's own sweep runs as
always, then each preset's rungs that are not already rows of it (``systems_lm``) -- or
:data:`COMMAND_LINE`: the ladder of each preset the command line names with ``model=``, whose
rungs replace that model (``xbench -m experiment=ablate model=transformer_xl seed=0,1,2``).
A rung's sweep is the command line with its ``model=`` replaced by the rung's overrides, plus

* ``++ladder={system, rung, name}``: recorded with the run, outside its identity
  (:data:`~xformer_bench.results.record.IDENTITY_EXCLUDED`): two ladders that share a rung
  (vanilla; Transformer-XL's and Compressive's +position=xl_relative) plan and run it once, a
  rung that is a row of the study is that row's run, and the table finds a rung's runs by
  their configuration, not by this tag (it names the first ladder that ran them);
* under ``match_params``, the reference pinned to the baseline's option of each group the rung
  changes: the reference is otherwise the rung's own command line with ``model=`` replaced,
  and +position=xl_relative would be matched to itself, not to vanilla (a rung's ``model.*``
  keys stay in its reference: :func:`~xformer_bench.models.param_match.reference_overrides`);
* ``hydra.sweep.subdir=ladder_<system>_<rung>/<job>``: each sweep's jobs in a folder of their own.
"""

from __future__ import annotations

from typing import Any

from xformer_bench.config import compose_config
from xformer_bench.errors import ConfigError
from xformer_bench.ladder import DEFAULT_BASELINE, Ladder, Rung, ladder
from xformer_bench.paper_rows import quoted
from xformer_bench.paper_rows import sweeps as paper_row_sweeps
from xformer_bench.preflight import MULTIRUN_FLAGS

COMMAND_LINE = "command_line"
"""``ladders: command_line``: the ladders of the presets the command line names (``model=``)."""

Sweep = tuple[str | None, list[str] | None]
"""(what it runs, for the terminal: None for the command line's own sweep; its argv: None for a
planned row not run, its title saying why).  An empty argv is ``xbench`` with no arguments: the
default run."""


def listed(value: Any) -> list[str]:
    """``"a, b"`` or ``[a, b]`` -> ``["a", "b"]``; None -> ``[]``."""
    if value is None:
        return []
    items = value.split(",") if isinstance(value, str) else value
    return [str(item).strip() for item in items]


def _given(argv: list[str], key: str) -> list[str]:
    """The values the command line gives ``key`` (``model=a,b`` -> ``[a, b]``)."""
    given = [arg.split("=", 1)[1] for arg in argv if arg.split("=", 1)[0] == key]
    return listed(given[-1]) if given else []


def _pins(chain: Ladder, rung: Rung, config: dict[str, Any]) -> list[str]:
    """Under ``match_params``, the reference's option of each group an intermediate rung changes
    set to the baseline's (the last rung is the preset: its reference is the study's)."""
    if not config.get("match_params") or rung.overrides[0] != f"model={chain.baseline}":
        return []
    steps = [r.part for r in chain.rungs[1:rung.index + 1] if r.part is not None]
    return [f"++match_params.reference.{part.name}={part.baseline_option}"
            for part in steps if part.baseline_option is not None]  # a group's part


def _tag(chain: Ladder, rung: Rung) -> str:
    tag = chain.tag(rung)
    name = quoted(str(tag["name"]))
    return f"++ladder={{system:{tag['system']},rung:{tag['rung']},name:{name}}}"


def sweeps(argv: list[str]) -> list[Sweep]:
    """The sweeps ``xbench argv`` runs, in order: ``[(None, argv)]`` unless its study declares
    ladders, or rows from a published table (``rows_from``: :mod:`xformer_bench.paper_rows`,
    one sweep per row); :class:`ConfigError` (one line) for a ladder that cannot be built."""
    studies = _given(argv, "experiment")
    if len(studies) != 1:
        return [(None, argv)]
    study = studies[0]
    config = compose_config(f"experiment={study}")
    declared = config.get("ladders")
    multirun = any(arg in MULTIRUN_FLAGS for arg in argv)
    if config.get("rows_from") and multirun:
        return paper_row_sweeps(config, argv)
    if not declared:
        return [(None, argv)]
    models = _given(argv, "model")
    if declared == COMMAND_LINE:
        if not models or not multirun:
            raise ConfigError(f"experiment={study} runs the ablation ladder of a model preset, "
                              f"several runs: xbench -m experiment={study} model=PRESET")
        systems, planned, runs = models, [], []
    elif not multirun:
        return [(None, argv)]
    else:
        rows = models or listed((config.get("sweep") or {}).get("model"))
        systems, planned, runs = listed(declared), [(f"model={m}",) for m in rows], [(None, argv)]
    common = [arg for arg in argv if arg.split("=", 1)[0] != "model"]
    baseline = str((config.get("baseline") or {}).get("model") or DEFAULT_BASELINE)
    for system in systems:
        chain = ladder(system, baseline, study)
        for rung in chain.rungs:
            if rung.overrides in planned:
                continue
            planned.append(rung.overrides)
            title = (f"ladder of {system}, rung {rung.index}/{len(chain.rungs) - 1} "
                     f"({rung.name})")
            runs.append((title, [*common, *rung.overrides, *_pins(chain, rung, config),
                                 _tag(chain, rung),
                                 f"hydra.sweep.subdir=ladder_{system}_{rung.index}/"
                                 "${hydra:job.num}"]))
    return runs
