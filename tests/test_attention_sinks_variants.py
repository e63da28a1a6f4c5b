"""Attention variants that need no ⟨bos⟩ sink (csrc/attention.h), at the op level and in the model.

Op level (``sinklab._core._attention`` / ``_attn_gate``, the test entries of the binding): a
learned per-head sink logit in the softmax denominator (gpt-oss), softmax-plus-one (Miller's
"off-by-one", the sink logit fixed at 0) and gated attention's sigmoid gate on the attention
output (Qiu et al. 2025, G1). References are float64 torch built from the definitions: the sink as
an extra logit column that is dropped after the softmax, torch.autograd for the backward
(including the sink's gradient), torch.func.jvp for the forward mode. Masks: causal, intra-document
``key_start`` with ``keep_first``, a sliding window; grouped-query heads (G < H). Bitwise: the
variant's forward, backward and JVP are the same for 1 and 2 threads.
"""
from __future__ import annotations

import numpy as np
import pytest

import sinklab
from sinklab import _core
from tests.support.reference_models import require

torch = require("torch")

# float32 kernel vs float64 reference: max |err| <= TOL * max |ref| per tensor (the brief's bound).
TOL = 1e-4
SOFTMAX, SINK_LOGIT, SOFTMAX1 = 0, 1, 2
VARIANTS = {"sink_logit": SINK_LOGIT, "softmax1": SOFTMAX1}
T, H, G, HD, B = 21, 4, 2, 8, 2

MASKS = {
    "causal": dict(),
    "intra_doc_keep_first": dict(key_start=np.array([0] * 7 + [7] * 9 + [16] * 5, np.int64), keep_first=1),
    "window": dict(window=5),
}


def problem(seed=0, q_gain=1.0):
    r = np.random.default_rng(seed)
    f = lambda *s: r.standard_normal(s).astype(np.float32)  # noqa: E731
    return dict(q=q_gain * f(T, H * HD), k=f(T, G * HD), v=f(T, G * HD), sinks=(0.7 * f(H)).astype(np.float32),
                dout=f(B * T, H * HD), tq=f(B * T, H * HD), tk=f(B * T, G * HD), tv=f(B * T, G * HD), ts=f(B, H))


def visible(mask):
    """(T, T) bool: which keys query i sees under the mask (as csrc/attention.h defines it)."""
    i = np.arange(T)[:, None]
    j = np.arange(T)[None, :]
    m = j <= i
    w = mask.get("window", 0)
    lo = np.maximum(i - w + 1, 0) if w else np.zeros_like(i)
    ks = mask.get("key_start")
    if ks is not None:
        lo = np.maximum(lo, ks[:, None])
    seen = m & (j >= lo)
    keep = mask.get("keep_first", 0)
    return seen | (m & (j < keep))


def ref_attention(q, k, v, s, variant, mask):
    """float64 torch: out (T, H*hd) and the key probabilities (H, T, T) of the definitions."""
    qh = q.reshape(T, H, HD).permute(1, 0, 2)
    kh = k.reshape(T, G, HD).permute(1, 0, 2).repeat_interleave(H // G, 0)
    vh = v.reshape(T, G, HD).permute(1, 0, 2).repeat_interleave(H // G, 0)
    z = qh @ kh.transpose(1, 2) / np.sqrt(HD)
    z = z.masked_fill(~torch.as_tensor(visible(mask)), float("-inf"))
    if variant != SOFTMAX:
        sink = (s if variant == SINK_LOGIT else torch.zeros(H, dtype=torch.float64))[:, None, None].expand(H, T, 1)
        p = torch.softmax(torch.cat([z, sink], -1), -1)[..., :T]  # the sink's column absorbs mass, has no value
    else:
        p = torch.softmax(z, -1)
    return (p @ vh).permute(1, 0, 2).reshape(T, H * HD), p


def t64(a, grad=False):
    return torch.tensor(np.asarray(a, np.float64), requires_grad=grad)


def rel_err(got, ref):
    ref = np.asarray(ref, np.float64)
    return float(np.max(np.abs(np.asarray(got, np.float64) - ref)) / max(np.max(np.abs(ref)), 1e-30))


def c_call(pb, variant, mask, backward=False, jvp=False):
    kw = dict(variant=variant, sinks=pb["sinks"] if variant == SINK_LOGIT else None,
              window=mask.get("window", 0), key_start=mask.get("key_start"), keep_first=mask.get("keep_first", 0))
    if backward:
        kw["dout"] = pb["dout"]
    if jvp:
        kw.update(tq=pb["tq"], tk=pb["tk"], tv=pb["tv"], tsinks=pb["ts"] if variant == SINK_LOGIT else None)
    return _core._attention(pb["q"], pb["k"], pb["v"], H, G, **kw)


@pytest.mark.parametrize("mask_name", list(MASKS))
@pytest.mark.parametrize("name", list(VARIANTS))
def test_forward_backward_jvp_match_torch(name, mask_name):
    variant, mask, pb = VARIANTS[name], MASKS[mask_name], problem()
    got = c_call(pb, variant, mask, backward=True, jvp=True)
    q, k, v, s = (t64(pb[x], True) for x in ("q", "k", "v", "sinks"))
    out, p = ref_attention(q, k, v, s, variant, mask)
    assert rel_err(got["out"], out.detach()) <= TOL
    assert rel_err(got["probs"], p.detach()) <= TOL
    # rows sum to < 1 (the sink's share is 1 - the row's sum) and hidden keys get exactly 0
    rows = got["probs"].astype(np.float64).sum(-1)
    assert np.all(rows < 1.0) and np.all(rows > 0.0)
    assert np.all(got["probs"][:, ~visible(mask)] == 0.0)
    # reverse mode: one autograd pass per cotangent direction
    for b in range(B):
        dout = t64(pb["dout"][b * T:(b + 1) * T])
        grads = torch.autograd.grad((out * dout).sum(), (q, k, v, s), retain_graph=True, allow_unused=True)
        for key, g in zip(("dq", "dk", "dv"), grads[:3]):
            assert rel_err(got[key][b * T:(b + 1) * T], g) <= TOL, (key, b)
        ds = grads[3] if variant == SINK_LOGIT else None
        if ds is not None:
            assert rel_err(got["dsinks"][b], ds) <= TOL
    # forward mode, the sink logit's tangent included
    for b in range(B):
        tang = [t64(pb[x][b * T:(b + 1) * T]) for x in ("tq", "tk", "tv")]
        if variant == SINK_LOGIT:
            fn = lambda q_, k_, v_, s_: ref_attention(q_, k_, v_, s_, variant, mask)[0]  # noqa: E731
            prim = (q.detach(), k.detach(), v.detach(), s.detach())
            tang.append(t64(pb["ts"][b]))
        else:
            fn = lambda q_, k_, v_: ref_attention(q_, k_, v_, None, variant, mask)[0]  # noqa: E731
            prim = (q.detach(), k.detach(), v.detach())
        _, ref_t = torch.func.jvp(fn, prim, tuple(tang))
        assert rel_err(got["tout"][b * T:(b + 1) * T], ref_t) <= TOL, b


def test_softmax1_gradient_is_that_of_a_zero_sink_logit():
    """softmax-plus-one is the sink logit at s_h = 0: same probabilities, and its dsinks is the
    gradient a parameter there would receive."""
    pb = problem(1)
    pb["sinks"] = np.zeros(H, np.float32)
    a = c_call(pb, SOFTMAX1, MASKS["causal"], backward=True)
    b = c_call(pb, SINK_LOGIT, MASKS["causal"], backward=True)
    for key in ("out", "probs", "dq", "dk", "dv", "dsinks"):
        assert np.array_equal(a[key], b[key]), key


def test_large_sink_and_scores_do_not_overflow():
    """Scores of ~±90 and sink logits of +-100: exp of either alone overflows float32; the max
    taken over the scores and the sink keeps every probability finite and in [0, 1]."""
    pb = problem(2, q_gain=40.0)
    pb["sinks"] = np.array([100.0, -100.0, 0.0, 60.0], np.float32)
    got = c_call(pb, SINK_LOGIT, MASKS["causal"], backward=True, jvp=True)
    for key in ("out", "probs", "dq", "dk", "dv", "dsinks", "tout"):
        assert np.all(np.isfinite(got[key])), key
    q, k, v, s = (t64(pb[x]) for x in ("q", "k", "v", "sinks"))
    out, p = ref_attention(q, k, v, s, SINK_LOGIT, MASKS["causal"])
    assert np.max(np.abs(got["probs"] - p.numpy())) <= TOL
    assert np.max(np.abs(got["probs"].sum(-1) - p.numpy().sum(-1))) <= TOL
    assert (got["probs"][0].sum(-1) < 1e-10).any()  # head 0: rows where the sink at 100 takes it all


def test_variants_are_bitwise_the_same_for_1_and_2_threads():
    pb = problem(3)
    for variant in (SINK_LOGIT, SOFTMAX1):
        for mask in MASKS.values():
            with sinklab.threads(1):
                a = c_call(pb, variant, mask, backward=True, jvp=True)
            with sinklab.threads(2):
                b = c_call(pb, variant, mask, backward=True, jvp=True)
            for key in a:
                assert np.array_equal(a[key], b[key]), (variant, key)


def test_bad_variant_inputs_raise_value_errors():
    pb = problem()
    with pytest.raises(ValueError, match="variant=7"):
        _core._attention(pb["q"], pb["k"], pb["v"], H, G, variant=7)
    with pytest.raises(ValueError, match="needs sinks"):
        _core._attention(pb["q"], pb["k"], pb["v"], H, G, variant=SINK_LOGIT)
    bad = pb["sinks"].copy()
    bad[2] = np.inf
    with pytest.raises(ValueError, match=r"sinks\[2\]"):
        _core._attention(pb["q"], pb["k"], pb["v"], H, G, variant=SINK_LOGIT, sinks=bad)
    with pytest.raises(ValueError, match="size 3"):
        _core._attention(pb["q"], pb["k"], pb["v"], H, G, variant=SINK_LOGIT, sinks=bad[:3])
    with pytest.raises(TypeError):
        _core._attention(pb["q"], pb["k"], pb["v"], H, G, variant=SINK_LOGIT, sinks=bad.astype(np.float64))


def test_gate_matches_torch():
    r = np.random.default_rng(4)
    z, g = (3 * r.standard_normal((T, H * HD))).astype(np.float32), (3 * r.standard_normal((T, H * HD))).astype(np.float32)
    dzg, tz, tg = (r.standard_normal((B * T, H * HD)).astype(np.float32) for _ in range(3))
    got = _core._attn_gate(z, g, dzg=dzg, tz=tz, tg=tg)
    zt, gt = t64(z, True), t64(g, True)
    ref = zt * torch.sigmoid(gt)
    assert rel_err(got["zg"], ref.detach()) <= TOL
    for b in range(B):
        rows = slice(b * T, (b + 1) * T)
        dz, dg = torch.autograd.grad((ref * t64(dzg[rows])).sum(), (zt, gt), retain_graph=True)
        assert rel_err(got["dz"][rows], dz) <= TOL and rel_err(got["dg"][rows], dg) <= TOL
        _, tref = torch.func.jvp(lambda a, c: a * torch.sigmoid(c), (zt.detach(), gt.detach()),
                                 (t64(tz[rows]), t64(tg[rows])))
        assert rel_err(got["tzg"][rows], tref) <= TOL
    with pytest.raises(ValueError, match="size"):
        _core._attn_gate(z, g[:, :3])
