"""Lightweight convolution (Wu, Fan, Baevski, Dauphin & Auli 2019, "Pay Less Attention with
Lightweight and Dynamic Convolutions", ICLR), section 3 and Figure 2b: self-attention replaced
by a depth-wise convolution whose kernel is shared by groups of channels and softmax-normalised
over its width,

    G = GLU(X W^I),                          W^I: d x 2d (with bias), G: T x d,
    O_{i,c} = sum_{j=0}^{k-1} softmax(W_{h(c), :})_j G_{i + j - left, c},   W: H x k,
    Y = O W^O,                               W^O: d x d  (the layer named ``out``),

with H = ``model.n_heads`` heads of d/H contiguous channels (h(c) = floor(c H / d), the paper's
ceil(cH/d)), so the convolution has H k parameters where a plain depth-wise one has d k.
DropConnect on the normalised kernel (``weight_dropout``; the paper trains with 0.1, the default
here is 0.0).  The kernel logits start Xavier-uniform as in fairseq's reference code; the linear
layers take the model's initialisation.  Shared core: :mod:`xformer_bench.attention._ops.conv`.

Causal: output i reads G_{i-k+1} .. G_i (left padding, the paper's decoder).  Bidirectional:
the kernel is centred, i-(k-1)/2 .. i+(k-1)/2, which needs an odd k: an even width declares
causal use only, and a bidirectional forward with one is a one-line error naming the key.

Widths: the paper's models grow the kernel with depth (3, 7, 15, then 31 for the remaining
layers); here ``kernel_size`` (default 31) serves every layer, or ``kernel_sizes`` lists them by
layer (``ctx.layer``; deeper layers keep the last).  With a list, every layer's kernel is sized
for the widest width and a narrower layer uses the taps nearest its position (unused taps still
count as parameters).  H = ``model.n_heads`` (the paper uses 16 for its big models).

Padding: a key padding mask zeroes the padded positions of G, so they add nothing to the others.
Any length works.  O(T k d) time and memory (``sub_quadratic``).  There are no queries, keys or
token pairs: no rotary, no additive position bias.  The paper's encoder-decoder attention and
its block (which keeps the feed-forward sublayer) are the Block's concern here.
"""

from __future__ import annotations

from xformer_bench.attention._ops.conv import ConvMixer
from xformer_bench.registry import ATTENTION


@ATTENTION.register("lightweight_conv")
class LightweightConvolution(ConvMixer):
    kind = "lightweight"
    option = "lightweight_conv"
