"""Attention through a feature map, the computation shared by the linearised kernels
(``linear``, ``performer``): with features phi of the queries and keys,

    out_i = phi(q_i)^T sum_j phi(k_j) v_j^T  /  (phi(q_i)^T sum_j phi(k_j) + eps)

(Katharopoulos et al. 2020, "Transformers are RNNs", eq. 5), over every key when
bidirectional and over keys j <= i when causal (eq. 8-9: the prefix sums S_i = sum_{j<=i}
phi(k_j) v_j^T and z_i = sum_{j<=i} phi(k_j)).  Nothing of size T x T, and never the prefix
state of every position at once: the causal case walks ``chunk`` positions at a time, carrying
the running state S (F, Dv) and normaliser z (F) between chunks -- the RNN of the paper's
section 3.4 -- and is exact within a chunk through a small (chunk x chunk) masked product.
Memory is O(T (F + Dv)) for the features plus one (F, Dv) state per chunk kept for backward.

**Key scales** (for exponential features, FAVOR+): a key may come as a bounded feature f_j
and a log-scale c_j, its feature being f_j exp(c_j).  The sums are then kept relative to the
running maximum M of the scales seen so far (rescaled when it grows, as online softmax does),
and query i is served relative to M_i = max_{j<=i} c_j: every factor is exp(<= 0), so nothing
overflows, and the result depends on keys <= i only -- unlike a maximum over the whole
sequence, which would let a future key change the past's rounding or flush it to zero.  The
scales carry no gradient (they cancel exactly between numerator and denominator).

The sums are accumulated in float32 with autocast off (a bf16 running state would lose the
early positions), and the result is returned in the dtype of ``v``.

``eps`` is added to the normaliser in the units of the features given (with key scales:
relative to the running maximum).  A padded key (``key_padding_mask``) has zero features: it
adds nothing to either sum; a query with no unpadded key outputs 0.  Queries are the last T
of the S key positions; the S - T earlier keys (memory) start the causal state.
"""

from __future__ import annotations

import torch

NEG = torch.finfo(torch.float32).min  # the log-scale of a key that is not there


def full_precision(x: torch.Tensor) -> torch.autocast:
    """A context with autocast off on ``x``'s device: feature maps and sums in float32."""
    return torch.autocast(x.device.type, enabled=False)


def feature_attention(
    phi_q: torch.Tensor,  # (B, H, T, F), non-negative
    phi_k: torch.Tensor,  # (B, H, S, F), non-negative
    v: torch.Tensor,  # (B, H, S, Dv)
    *,
    causal: bool,
    chunk: int,
    eps: float = 1e-6,
    key_log_scale: torch.Tensor | None = None,  # (B, H, S): key j's feature is phi_k_j exp(c_j)
    key_padding_mask: torch.Tensor | None = None,  # (B, S) bool, True = padding
) -> torch.Tensor:  # (B, H, T, Dv)
    wide = torch.promote_types(torch.promote_types(phi_q.dtype, v.dtype), torch.float32)
    with full_precision(v):
        out = _attend(phi_q.to(wide), phi_k.to(wide), v.to(wide), causal, chunk, eps,
                      key_log_scale, key_padding_mask)
    return out.to(v.dtype)


def _attend(phi_q, phi_k, v, causal, chunk, eps, key_log_scale, key_padding_mask):
    if key_padding_mask is not None:
        pad = key_padding_mask[:, None, :]  # (B, 1, S)
        phi_k = phi_k.masked_fill(pad[..., None], 0.0)  # (B, H, S, F)
        if key_log_scale is not None:
            key_log_scale = key_log_scale.masked_fill(pad, NEG)  # (B, H, S)
    if key_log_scale is not None:
        key_log_scale = key_log_scale.detach().float()
    if not causal:
        return _global(phi_q, phi_k, v, eps, key_log_scale)
    return _chunked_prefix(phi_q, phi_k, v, chunk, eps, key_log_scale)


def _state(phi_k, v, log_scale):
    """Sums of ``phi_k`` (B, H, L, F) against ``v`` (B, H, L, Dv), relative to the largest of
    ``log_scale`` (B, H, L) or None: state (B, H, F, Dv), normaliser (B, H, F), top (B, H)."""
    top = None
    if log_scale is not None:
        top = log_scale.amax(-1) if log_scale.shape[-1] else log_scale.new_full(
            log_scale.shape[:-1], NEG)  # (B, H)
        phi_k = phi_k * (log_scale - top[..., None]).exp()[..., None].to(phi_k.dtype)
    return phi_k.transpose(-1, -2) @ v, phi_k.sum(-2), top


def _global(phi_q, phi_k, v, eps, log_scale):
    kv, z, _ = _state(phi_k, v, log_scale)  # (B, H, F, Dv), (B, H, F)
    num = phi_q @ kv  # (B, H, T, Dv)
    den = phi_q @ z[..., None]  # (B, H, T, 1)
    return num / (den + eps)


def _chunked_prefix(phi_q, phi_k, v, chunk, eps, log_scale):
    t, s = phi_q.shape[-2], phi_k.shape[-2]
    sizes = [s - t] + [min(chunk, t - start) for start in range(0, t, chunk)]
    # split, not slicing: its backward is one concatenation, not a full-size gradient per chunk
    keys, values = phi_k.split(sizes, dim=-2), v.split(sizes, dim=-2)  # memory, then chunks
    scales = [None] * len(sizes) if log_scale is None else log_scale.split(sizes, dim=-1)
    kv, z, top = _state(keys[0], values[0], scales[0])  # the memory starts the state
    lower = torch.ones(chunk, chunk, dtype=torch.bool, device=phi_q.device).tril()  # j <= i
    outputs = []
    for qc, kc, vc, cc in zip(phi_q.split(chunk, dim=-2), keys[1:], values[1:], scales[1:]):
        n = qc.shape[-2]
        if cc is None:
            num, den, kv, z = _plain_chunk(qc, kc, vc, kv, z, lower[:n, :n])
        else:
            num, den, kv, z, top = _scaled_chunk(qc, kc, vc, cc, kv, z, top, lower[:n, :n])
        outputs.append(num / (den + eps))
    return torch.cat(outputs, dim=-2)  # (B, H, T, Dv)


def _plain_chunk(qc, kc, vc, kv, z, lower):
    """One chunk of n queries (B, H, n, F) and their keys and values, given the state of the
    keys before it: numerator (B, H, n, Dv), normaliser (B, H, n, 1), the state after it."""
    scores = (qc @ kc.transpose(-1, -2)).masked_fill(~lower, 0.0)  # (B, H, n, n)
    num = scores @ vc + qc @ kv  # (B, H, n, Dv)
    den = scores.sum(-1, keepdim=True) + qc @ z[..., None]  # (B, H, n, 1)
    return num, den, kv + kc.transpose(-1, -2) @ vc, z + kc.sum(-2)


def _scaled_chunk(qc, kc, vc, cc, kv, z, top, lower):
    """:func:`_plain_chunk` for keys with log-scales ``cc`` (B, H, n), the state being kept
    relative to ``top`` (B, H), the largest scale before the chunk."""
    run = torch.maximum(cc.cummax(-1).values, top[..., None])  # (B, H, n): M_i
    kc = kc * (cc - run).exp()[..., None].to(kc.dtype)  # f_j exp(c_j - M_j) <= f_j
    gap = run[..., None, :] - run[..., :, None]  # (B, H, n, n): M_j - M_i, <= 0 where j <= i
    decay = gap.masked_fill(~lower, float("-inf")).exp().to(qc.dtype)  # 0 where j > i
    scores = (qc @ kc.transpose(-1, -2)) * decay  # (B, H, n, n): f_j exp(c_j - M_i)
    carried = (top[..., None] - run).exp()[..., None].to(qc.dtype)  # (B, H, n, 1)
    num = scores @ vc + (qc @ kv) * carried  # (B, H, n, Dv)
    den = scores.sum(-1, keepdim=True) + (qc @ z[..., None]) * carried  # (B, H, n, 1)
    end = run[..., -1]  # (B, H): the new running maximum
    shrink = (top - end).exp().to(kv.dtype)  # (B, H)
    kc = kc * (run - end[..., None]).exp()[..., None].to(kc.dtype)  # f_j exp(c_j - end)
    kv = kv * shrink[..., None, None] + kc.transpose(-1, -2) @ vc  # (B, H, F, Dv)
    return num, den, kv, z * shrink[..., None] + kc.sum(-2), end
