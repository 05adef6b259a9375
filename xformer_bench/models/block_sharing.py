"""Block sharing across depth (Dehghani et al. 2019, the Universal Transformer's weight
sharing; Lan et al. 2020, ALBERT's cross-layer sharing): one block's parameters serve every
layer of a stack.  ``model.share_blocks`` says which stacks share:

* ``false``   -- none (every layer has its own block);
* ``true``    -- every stack: the LM's, the classifier's, an encoder-decoder's two
  (Narang et al. 2021, Table 1 "Block sharing");
* ``encoder`` -- an encoder-decoder's encoder only (Table 1 "Encoder only block sharing");
* ``decoder`` -- its decoder only (Table 1 "Decoder only block sharing").

The one-sided values have a meaning only where there are two sides: a decoder-only LM or an
encoder classifier refuses them in one line, declared by
:func:`~xformer_bench.models.body.encoder_decoder_parts` (on one stack they would be ``true``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from xformer_bench.errors import ConfigError

SIDES: dict[Any, frozenset[str]] = {
    False: frozenset(), True: frozenset({"encoder", "decoder"}),
    "encoder": frozenset({"encoder"}), "decoder": frozenset({"decoder"}),
}
"""The stacks each value of ``model.share_blocks`` shares."""


def _sides(value: Any) -> frozenset[str]:
    if isinstance(value, str) and value.lower() in ("true", "false"):
        value = value.lower() == "true"
    if value is None:
        value = False
    if value not in SIDES or (isinstance(value, int) and not isinstance(value, bool)):
        raise ConfigError(f"model.share_blocks={value!r}; choose one of: false, true, encoder, "
                          "decoder")
    return SIDES[value]


def shares(value: Any, side: str) -> bool:
    """Whether ``model.share_blocks=value`` shares the blocks of ``side`` (encoder, decoder)."""
    return side in _sides(value)


def side_options(options: Mapping[str, Any], side: str) -> dict[str, Any]:
    """The body options of one side of an encoder-decoder: ``share_blocks`` as that side's bool."""
    return {**options, "share_blocks": shares(options.get("share_blocks", False), side)}
