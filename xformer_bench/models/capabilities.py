"""Which parts go together: each part declares what it provides and what it needs of the
others, and the model checks them once, when it is built, so that an impossible combination
is one ``ConfigError`` line before training -- never a crash at the first step.

A part is a built module of a config group (the token mixer of ``attention``, the
``position`` scheme, a ``norm``, the ``ffn`` layer) or the assembly itself (``model``).
It declares, as class attributes,

* ``provides`` -- a set of tags (the attention tags are :data:`xformer_bench.attention.CAPABILITIES`);
* ``requires`` -- ``{group: tags}``, what it needs the part of ``group`` to provide
  (``position=t5`` needs ``additive_bias`` of the attention; a decoder-only LM needs ``causal``).

Two tags are read off the structure, so that no variant has to remember them:

* a part with a layer named ``out`` or ``down`` provides ``residual_output`` (Fixup zeroes it);
* a ``norm`` part whose residual gate is the identity provides ``ungated_residual``;
* a part of the block holding a persistent buffer (a running statistic, updated by training)
  needs ``unshared_blocks`` of the model: with ``model.share_blocks`` one statistic would mix
  every depth.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from torch import nn

from xformer_bench.attention import CAPABILITIES
from xformer_bench.errors import ConfigError
from xformer_bench.core.init import RESIDUAL_OUTPUTS
from xformer_bench.norm import residual_gate

TAGS = {
    **CAPABILITIES,
    "residual_output": f"a residual output layer named {' or '.join(RESIDUAL_OUTPUTS)} "
                       "(Fixup zeroes it)",
    "unshared_blocks": "a block of its own at every depth: model.share_blocks would mix every "
                       "depth into one running statistic",
    "invertible_blocks": "blocks whose residual is x + branch (not model.norm_placement=post, "
                         "not model.residual=gru_gate), so a layer can be undone by subtraction",
    "ordered_blocks": "blocks applied one after another at full length, so each can hand its "
                      "attention logits to the next",
    "encoder_decoder": "an encoder and a decoder (an encoder-decoder task: data=wmt14)",
    "pre_norm_blocks": "pre-LN blocks with plain residual adds (model.norm_placement=pre, "
                       "model.residual=add)",
    "dense_feedforward": "a dense position-wise feed-forward layer (ffn=dense)",
    "ungated_residual": "a norm without a residual gate (not ReZero, not Fixup)",
}
"""Every tag a part may provide or need, in the words of the error."""

BLOCK_GROUPS = ("attention", "norm", "ffn")
"""The groups whose parts live inside a (possibly shared) block."""


@dataclass(frozen=True)
class Part:
    group: str
    choice: str  # how the error names it: "attention=fnet", "model.share_blocks=true"
    module: object = None
    provides: frozenset[str] = frozenset()  # on top of the module's own declarations
    requires: Mapping[str, frozenset[str]] = field(default_factory=dict)


def _has_residual_output(module: object) -> bool:
    return isinstance(module, nn.Module) and any(
        name.rpartition(".")[2] in RESIDUAL_OUTPUTS for name, _ in module.named_modules())


def _keeps_running_statistics(module: object) -> bool:
    if not isinstance(module, nn.Module):
        return False
    state = module.state_dict(keep_vars=True)
    return any(name in state for name, _ in module.named_buffers())  # persistent buffers


def provided(part: Part) -> frozenset[str]:
    derived = {"residual_output"} if _has_residual_output(part.module) else set()
    if part.group == "norm" and isinstance(part.module, nn.Module) and \
            isinstance(residual_gate(part.module), nn.Identity):
        derived.add("ungated_residual")
    return frozenset(getattr(part.module, "provides", frozenset())) | part.provides | derived


def required(part: Part) -> dict[str, frozenset[str]]:
    needs: dict[str, set[str]] = {}
    for source in (getattr(part.module, "requires", {}), part.requires):
        for group, tags in source.items():
            needs.setdefault(group, set()).update(tags)
    if part.group in BLOCK_GROUPS and _keeps_running_statistics(part.module):
        needs.setdefault("model", set()).add("unshared_blocks")
    return {group: frozenset(tags) for group, tags in needs.items()}


def unmet(parts: Iterable[Part]) -> list[str]:
    """One message per unmet need, in the order of ``parts``."""
    parts = list(parts)
    by_group = {part.group: part for part in parts}
    messages = []
    for part in parts:
        for group, needs in required(part).items():
            target = by_group.get(group)
            if target is None:
                continue  # the assembly has no such part: nothing to need of it
            for tag in sorted(needs - provided(target)):
                messages.append(f"{part.choice} needs {TAGS.get(tag, tag)}, which {target.choice} "
                                f"does not provide; choose another {part.group} or {group}")
    return messages


def check_compatible(parts: Iterable[Part]) -> None:
    """``ConfigError`` with the first unmet need, else nothing."""
    messages = unmet(parts)
    if messages:
        raise ConfigError(messages[0])
