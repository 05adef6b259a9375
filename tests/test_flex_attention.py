"""The FlexAttention path of the sparse patterns (:mod:`xformer_bench.attention._ops.flex`) against
their hand-written kernels, per pattern, causal and bidirectional where provided:

(a) the mask_mod's dense mask is exactly the set of pairs the hand-written kernel attends
    (one-hot values probe: with V = I, out = the attention weights, nonzero where attended);
(b) flex forward (eager on CPU, forced by ``FORCE``) equals the hand-written forward, fp32;
(c) on CUDA, compiled flex forward and backward (grads of q, k, v) equal the hand-written
    ones, fp32 tightly and bf16 within a declared looser tolerance.

Sizes: BOUNDARY_KWARGS at BOUNDARY_SEQ_LEN, queries the last T of S keys where the option takes
longer keys, other modes of the factorised patterns, and T = 256 (two of flex's 128-blocks)
with windows and blocks that straddle the block edges.  A mask_mod one pair off is shown to
fail both checks (:func:`test_one_pair_off_fails_both_checks`).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from references import BOUNDARY_KWARGS, BOUNDARY_SEQ_LEN
from xformer_bench.attention._ops import flex as _flex
from xformer_bench.attention._ops.flex import dense_mask, flex_forward
from xformer_bench.core.dims import ModelDims
from xformer_bench.registry import ATTENTION

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")

PATTERNS = ("local", "block_local", "dilated", "strided", "fixed", "longformer", "bigbird")
LONG = 256  # two 128-blocks of the block mask
LONG_KWARGS = {  # windows and blocks whose edges fall inside flex's blocks
    "local": {"window": 40},
    "block_local": {"block": 48, "memory": 24},
    "dilated": {"window": 16, "dilation": 3},
    "strided": {"stride": 48},
    "fixed": {"stride": 48, "summary": 8},
    "longformer": {"window": 40, "n_global": 3, "dilation": 2},
    "bigbird": {"block": 24, "window_blocks": 3, "global_blocks": 1, "random_blocks": 2},
}


@dataclass(frozen=True)
class Case:
    name: str
    kwargs: dict
    t: int
    s: int
    causal: bool
    layer: int = 1  # an odd layer: interleaved modes and BigBird's draw not at their default
    heads: int = 2

    def kernel(self):
        dims = ModelDims(d_model=8 * self.heads, n_heads=self.heads, n_layers=2, d_ff=64,
                         seq_len=self.s, vocab_size=256)
        return ATTENTION.get(self.name)(dims, **self.kwargs)

    def __str__(self):
        extra = ",".join(f"{k}={v}" for k, v in self.kwargs.items())
        return f"{self.name}[{extra}]-T{self.t}-S{self.s}-{'causal' if self.causal else 'bidir'}"


def _cases() -> list[Case]:
    cases = []
    for name in PATTERNS:
        for causal in (True, False):
            n = BOUNDARY_SEQ_LEN
            cases.append(Case(name, BOUNDARY_KWARGS[name], n, n, causal))
            cases.append(Case(name, LONG_KWARGS[name], LONG, LONG, causal))
            if name != "bigbird":  # more keys than queries: the queries the last T
                cases.append(Case(name, BOUNDARY_KWARGS[name], 7, n, causal, layer=0))
    for name in ("strided", "fixed"):
        for mode, layer in (("interleaved", 0), ("interleaved", 1), ("multihead", 0)):
            cases.append(Case(name, {**BOUNDARY_KWARGS[name], "mode": mode}, BOUNDARY_SEQ_LEN,
                              BOUNDARY_SEQ_LEN, True, layer=layer, heads=3))
    cases.append(Case("strided", {**BOUNDARY_KWARGS["strided"], "mode": "multihead"},
                      BOUNDARY_SEQ_LEN, BOUNDARY_SEQ_LEN, False, heads=3))
    cases.append(Case("fixed", {"stride": "auto", "summary": 2}, 30, 30, False))
    return cases


CASES = _cases()


def qkv(case: Case, head_dim: int = 8, seed: int = 0, device="cpu", dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, case.heads, n, head_dim, generator=g).to(device, dtype)
            for n in (case.t, case.s, case.s)]


def hand_written(kernel, q, k, v, case: Case, monkeypatch) -> torch.Tensor:
    monkeypatch.setattr(_flex, "FORCE", False)
    return kernel(q, k, v, causal=case.causal, layer=case.layer)


def attended_pairs(case: Case, monkeypatch) -> torch.Tensor:
    """(H, T, S) bool: the pairs the hand-written kernel weighs, from values V = I (out = P)."""
    q, k, _ = (0.5 * x[:1] for x in qkv(case, head_dim=case.s))  # values as wide as keys
    eye = torch.eye(case.s).expand(1, case.heads, case.s, case.s)
    with torch.no_grad():
        weights = hand_written(case.kernel(), q, k, eye, case, monkeypatch)  # (1, H, T, S)
    return weights[0] != 0


def flex_pattern(case: Case):
    return case.kernel().flex_pattern(case.t, case.s, case.causal, case.layer, case.heads)


def check_same_pairs(pattern, case: Case, monkeypatch) -> None:
    expected = attended_pairs(case, monkeypatch)
    got = dense_mask(pattern, case.t, case.s, case.causal, case.heads)
    wrong = (got != expected).nonzero().tolist()
    assert not wrong, f"{case}: (head, query, key) pairs that differ: {wrong[:8]}"


def check_same_forward(pattern, case: Case, monkeypatch) -> None:
    q, k, v = qkv(case)
    expected = hand_written(case.kernel(), q, k, v, case, monkeypatch)
    got = flex_forward(q, k, v, pattern, causal=case.causal)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5, msg=lambda m: f"{case}: {m}")


@pytest.mark.parametrize("case", CASES, ids=str)
def test_mask_mod_is_the_attended_pairs(case, monkeypatch):
    check_same_pairs(flex_pattern(case), case, monkeypatch)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_flex_forward_equals_hand_written_on_cpu(case, monkeypatch):
    check_same_forward(flex_pattern(case), case, monkeypatch)


def test_dispatch_goes_through_flex_when_forced(monkeypatch):
    """The kernel's own forward takes the flex path when forced (and not with a bias, padding,
    or gradients on CPU): the call reaches flex_forward."""
    case = CASES[0]
    kernel, (q, k, v) = case.kernel(), qkv(case)
    calls = []
    monkeypatch.setattr(_flex, "flex_forward", lambda *a, **kw: calls.append(a) or a[0])
    monkeypatch.setattr(_flex, "FORCE", True)
    kernel(q, k, v, causal=True)
    kernel(q, k, v, causal=True, key_padding_mask=torch.zeros(2, case.s, dtype=torch.bool))
    kernel(q.requires_grad_(), k, v, causal=True)
    assert len(calls) == 1
    monkeypatch.setattr(_flex, "FORCE", None)
    monkeypatch.setenv("XBENCH_FLEX", "0")
    assert not _flex.use_flex(q.detach(), k, None, None)
    monkeypatch.setenv("XBENCH_FLEX", "1")
    assert _flex.use_flex(q.detach(), k, None, None)
    monkeypatch.delenv("XBENCH_FLEX")
    assert _flex.use_flex(q.detach(), k, None, None) == torch.cuda.is_available()


@dataclass(frozen=True)
class OnePairOff:
    """A planted violation: the pattern with one (query, key) pair flipped."""

    pattern: object
    query: int
    key: int
    heads: int = 0

    def mask_mod(self, t, s, causal, device):
        inner = self.pattern.mask_mod(t, s, causal, device)
        return lambda b, h, q, k: inner(b, h, q, k) ^ ((q == self.query) & (k == self.key))


@pytest.mark.parametrize("key", [5, 6])  # just outside local's window of 5, and just inside
def test_one_pair_off_fails_both_checks(key, monkeypatch):
    case = Case("local", {"window": 5}, BOUNDARY_SEQ_LEN, BOUNDARY_SEQ_LEN, True)
    planted = OnePairOff(flex_pattern(case), query=10, key=key)
    with pytest.raises(AssertionError, match=r"\[0, 10, %d\]" % key):
        check_same_pairs(planted, case, monkeypatch)
    with pytest.raises(AssertionError):
        check_same_forward(planted, case, monkeypatch)


CUDA_CASES = [c for c in CASES if c.t == LONG]
TOLERANCE = {torch.float32: 2e-4, torch.bfloat16: 3e-2}
"""Max abs error allowed, flex against hand-written (inputs ~N(0, 1)): fp32 close to exact;
bf16 at a few of its units in the last place (8 bits of mantissa), both sides rounding."""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="flex compiles for CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", CUDA_CASES, ids=str)
def test_flex_forward_and_backward_equal_hand_written_on_cuda(case, dtype, monkeypatch):
    kernel = case.kernel().cuda()
    inputs = qkv(case, head_dim=64, device="cuda", dtype=dtype)
    results = []
    for force in (True, False):
        q, k, v = (x.clone().requires_grad_() for x in inputs)
        monkeypatch.setattr(_flex, "FORCE", force)
        out = kernel(q, k, v, causal=case.causal, layer=case.layer)
        out.backward(torch.ones_like(out) / out.numel() ** 0.5)
        results.append((out, q.grad, k.grad, v.grad))
    for what, got, expected in zip(("out", "dq", "dk", "dv"), *results):
        error = (got.float() - expected.float()).abs().max().item()
        assert error <= TOLERANCE[dtype], f"{case} {dtype} {what}: max error {error:.2e}"
