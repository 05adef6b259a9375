"""Feed-forward sublayers: dense, or sparsely routed (experts, memories).  Builders take
``dims`` and the ``activation`` config node plus the keys of their YAML.

A routed layer may set ``self.aux_loss`` (a scalar tensor) in ``forward``; the task adds it
to the training loss.  It may define ``inactive_parameters()`` (parameters one token does not
use) so that records report active as well as total parameters."""
