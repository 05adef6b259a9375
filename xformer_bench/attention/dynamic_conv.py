"""Dynamic convolution (Wu, Fan, Baevski, Dauphin & Auli 2019, "Pay Less Attention with
Lightweight and Dynamic Convolutions", ICLR), section 4 and Figure 2c: a lightweight
convolution whose kernel is predicted at every position from that position alone,

    G = GLU(X W^I),                          W^I: d x 2d (with bias), G: T x d,
    K_i = softmax_j((W^Q G_i) viewed as H x k),     W^Q: Hk x d (no bias),
    O_{i,c} = sum_{j=0}^{k-1} K_{i, h(c), j} G_{i + j - left, c},
    Y = O W^O,                               W^O: d x d  (the layer named ``out``),

with H = ``model.n_heads`` heads of d/H contiguous channels (h(c) = floor(c H / d)).  The kernel
depends on the current position only, not on the whole context: the cost is linear in T.  The
query of W^Q is the convolution's input G (the GLU output), as in fairseq's reference code.
DropConnect on the normalised kernels (``weight_dropout``; the paper trains with 0.1, the
default here is 0.0).  W^Q takes the model's initialisation like every linear layer.

Computed without any T x T tensor, nor a (B, T, d, k) one: positions in blocks of
L = max(k, 32), each block's kernels laid out as a banded (L, L + k - 1) matrix times its
L + k - 1 inputs, one batched matmul; O(T (L + k) d) time, O(T d + T H (L + k)) memory
(``sub_quadratic``).  Shared core: :mod:`xformer_bench.attention._ops.conv`.

Causal: output i reads G_{i-k+1} .. G_i (left padding, the paper's decoder).  Bidirectional: a
centred kernel, which needs an odd k (an even width declares causal use only; a bidirectional
forward with one is a one-line error naming the key).  Widths: ``kernel_size`` (default 31) at
every layer, or ``kernel_sizes`` by layer (the paper's 3, 7, 15, 31, ...; deeper layers keep the
last); with a list, W^Q has rows for the widest kernel at every layer and a narrower layer uses
the rows of its taps (the others count as parameters but get no gradient).

Padding: a key padding mask zeroes the padded positions of G, so they add nothing to the others
(and a padded position's own kernel is predicted from zeros).  Any length works.  No queries,
keys or token pairs: no rotary, no additive position bias.
"""

from __future__ import annotations

from xformer_bench.attention._ops.conv import ConvMixer
from xformer_bench.registry import ATTENTION


@ATTENTION.register("dynamic_conv")
class DynamicConvolution(ConvMixer):
    kind = "dynamic"
    option = "dynamic_conv"
