"""The attention kernel's sliding window with k kept first keys (StreamingLLM's sink tokens,
csrc/attention.c: keep_first as a count) against brute force: a float64 torch softmax over the
full (T, T) score matrix under the same mask, query i seeing keys i - w < j <= i and j < k.

The kernel is called through ctypes (the library and the call helpers of
tests/test_attention_variants.py). T spans several query blocks of 64 and w + k < T, so later
blocks compute the k first keys as separate columns beside their window; the backward and JVP
(which read whole probability rows) are checked against torch.autograd / torch.func.jvp.
"""
import ctypes as C

import numpy as np
import pytest

from tests.support import reference_models as rm
from tests.support.attention_ctypes import Intervention, ptr, u8p
from tests.test_attention_variants import (ZFV_ALL, ZFV_NONE, ZFV_OTHERS, Config, assert_close, c_backward,
                                           c_forward, c_jvp, c_probs, lib, t64)  # noqa: F401  (lib: fixture)

pytestmark = pytest.mark.cdriver

IV = dict(mask_first=[1, 0, 0, 0], zfv=[ZFV_NONE, ZFV_OTHERS, ZFV_ALL, ZFV_NONE], head_scale=[1.0, 0.5, 1.0, 2.0])


class KeepConfig(Config):
    """Config with keep_first = k kept first keys."""

    def __init__(self, keep, **kw):
        super().__init__(**kw)
        self.keep = keep

    def c_iv(self):
        if self.iv is None:
            return C.pointer(Intervention(None, None, None, None, self.keep)), []
        mf = np.ascontiguousarray(self.iv["mask_first"], dtype=np.uint8)
        zf = np.ascontiguousarray(self.iv["zfv"], dtype=np.uint8)
        hs = np.ascontiguousarray(self.iv["head_scale"], dtype=np.float32)
        return C.pointer(Intervention(ptr(mf, u8p), ptr(zf, u8p), ptr(hs), None, self.keep)), [mf, zf, hs]


def visible(cfg, T):
    """(H, T, T) bool, written from the definition: causal, within the window or among the first k."""
    i = np.arange(T)[:, None]
    j = np.arange(T)[None, :]
    m = (j <= i) & ((j > i - cfg.window) | (j < cfg.keep)) if cfg.window > 0 else j <= i
    m = np.broadcast_to(m, (cfg.H, T, T)).copy()
    for h in range(cfg.H):
        if cfg.iv is not None and cfg.iv["mask_first"][h]:
            m[h, 1:, 0] = False
    return m


def brute_force(torch, cfg, q, k, v):
    """Masked softmax over the full score matrix, float64; v_0 zeroed and heads scaled as asked."""
    T, H, G, hd = q.shape[0], cfg.H, cfg.G, cfg.hd
    rep = H // G
    qh = q.reshape(T, H, hd).transpose(0, 1)
    kh = k.reshape(T, G, hd).transpose(0, 1).repeat_interleave(rep, 0)
    vh = v.reshape(T, G, hd).transpose(0, 1).repeat_interleave(rep, 0)
    s = (qh @ kh.transpose(1, 2)) * float(cfg.scale)
    if cfg.softcap > 0:
        s = torch.tanh(s / cfg.softcap) * cfg.softcap
    p = torch.softmax(s.masked_fill(~torch.from_numpy(visible(cfg, T)), float("-inf")), dim=-1)
    o = p @ vh
    if cfg.iv is not None:
        for h in range(H):
            z = cfg.iv["zfv"][h]
            rows = slice(0, T) if z == ZFV_ALL else slice(1, T) if z == ZFV_OTHERS else slice(0, 0)
            o[h, rows] = o[h, rows] - p[h, rows, :1] * vh[h, :1, :]
        o = o * torch.tensor(np.asarray(cfg.iv["head_scale"], np.float64)).reshape(H, 1, 1)
    return o.transpose(0, 1).reshape(T, H * hd), p


CASES = {
    "w16_k1": dict(T=200, window=16, keep=1),
    "w16_k4": dict(T=200, window=16, keep=4),
    "w40_k4_gqa": dict(T=150, window=40, keep=4, H=4, G=1),
    "w64_k4": dict(T=300, window=64, keep=4, H=2, G=1),  # > 4 query blocks: importance over segments
    "w8_k20": dict(T=140, window=8, keep=20),            # k > w
    "w30_k4_softcap": dict(T=150, window=30, keep=4, softcap=2.0, q_gain=3.0),
    "w30_k0": dict(T=150, window=30, keep=0),
    "causal_k4": dict(T=130, keep=4),                    # no window: nothing is hidden, k changes nothing
}


@pytest.fixture(scope="module")
def torch():
    return rm.require("torch")


def make(case, with_iv):
    kw = dict(CASES[case])
    H = kw.get("H", 4)
    iv = {key: val[:H] for key, val in IV.items()} if with_iv else None
    return KeepConfig(iv=iv, seed=3, **kw)


@pytest.mark.parametrize("with_iv", [False, True], ids=["plain", "iv"])
@pytest.mark.parametrize("case", list(CASES))
def test_forward_probs_stats_vs_brute_force(lib, torch, case, with_iv):
    cfg = make(case, with_iv)
    got = c_forward(lib, cfg)
    out, p = brute_force(torch, cfg, t64(torch, cfg.q), t64(torch, cfg.k), t64(torch, cfg.v))
    p = p.numpy()
    assert_close("out", got["out"], out.numpy())
    assert_close("probs", got["probs"], p)
    assert np.all(got["probs"][~visible(cfg, cfg.T)] == 0.0), "a hidden key has nonzero probability"
    T = cfg.T
    assert_close("to_first", got["to_first"], p[:, :, 0])
    assert_close("importance", got["importance"], p.sum(axis=1) / (T - np.arange(T)))
    with np.errstate(divide="ignore", invalid="ignore"):
        ent = -np.where(p > 0, p * np.log(p), 0.0).sum(-1)
    assert_close("entropy", got["entropy"], ent)


@pytest.mark.parametrize("case", ["w16_k4", "w8_k20"])
def test_threads_and_probs_call_bitwise(lib, case):
    cfg = make(case, True)
    one, two = c_forward(lib, cfg, threads=1), c_forward(lib, cfg, threads=2)
    for name in one:
        assert np.array_equal(one[name], two[name]), f"{name} depends on the thread count"
    assert np.array_equal(c_probs(lib, cfg), one["probs"]), "sl_attention_probs differs from the forward's capture"


def test_window_ge_T_with_keep_is_causal(lib):
    full, win = make("causal_k4", False), KeepConfig(keep=4, T=130, window=500, seed=3)
    assert np.array_equal(c_forward(lib, full)["out"], c_forward(lib, win)["out"])


@pytest.mark.parametrize("case", ["w16_k4", "w30_k4_softcap"])
def test_backward_and_jvp_vs_torch(lib, torch, case):
    cfg = make(case, True)
    probs = c_forward(lib, cfg)["probs"]
    got = c_backward(lib, cfg, probs)
    tout = c_jvp(lib, cfg, probs)
    T = cfg.T
    q, k, v = (t64(torch, a).requires_grad_(True) for a in (cfg.q, cfg.k, cfg.v))
    out, _ = brute_force(torch, cfg, q, k, v)
    for b in range(cfg.B):
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), t64(torch, cfg.dout[b * T:(b + 1) * T]), retain_graph=True)
        for name, ref in (("dq", dq), ("dk", dk), ("dv", dv)):
            assert_close(f"{name}[{b}]", got[name][b * T:(b + 1) * T], ref.numpy())
        prim = tuple(t64(torch, a) for a in (cfg.q, cfg.k, cfg.v))
        tang = (t64(torch, cfg.tq[b * T:(b + 1) * T]), t64(torch, cfg.tk[b * T:(b + 1) * T]),
                t64(torch, cfg.tv[b * T:(b + 1) * T]))
        _, ref = torch.func.jvp(lambda a, b_, c: brute_force(torch, cfg, a, b_, c)[0], prim, tang)
        assert_close(f"tout[{b}]", tout[b * T:(b + 1) * T], ref.numpy())


def test_bad_keep_is_an_error(lib):
    cfg = KeepConfig(keep=-1, T=70, window=8)
    with pytest.raises(AssertionError, match="keep_first=-1"):
        c_forward(lib, cfg)
    mean = KeepConfig(keep=2, T=70, window=8, iv=dict(mask_first=[0] * 4, zfv=[3, 0, 0, 0], head_scale=[1.0] * 4))
    with pytest.raises(AssertionError, match="mean"):
        c_forward(lib, mean)
