"""The engines several attention options share (windows, blocks, factorised patterns, sorting
and clustering, feature maps, convolutions, the FlexAttention path ...); each option's file
in ``attention/`` stays one concept and composes these.  The naive references the engines are
tested against live in ``tests/references.py``."""
