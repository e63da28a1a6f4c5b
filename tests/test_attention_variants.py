"""The attention kernel's masks and score shaping (csrc/attention.c) at the C level: causal,
sliding-window (HF Mistral/Gemma: query i sees keys i - window < j <= i), bidirectional (BERT)
and Gemma 2's soft-capping, with grouped-query heads and the paper's interventions.

The kernel is compiled with its dependencies into a shared library and called through ctypes on
random q, k, v. References are float64 torch: softmax under the same mask and cap for the
forward, probabilities and statistics; torch.autograd for the backward (dq, dk, dv);
torch.func.jvp for the forward-mode derivative. Bitwise properties: results independent of the
thread count, the batch entry point equal to per-sequence calls, sl_attention_probs equal to the
forward's capture, a window >= T equal to plain causal attention.
"""
import ctypes as C
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.support import reference_models as rm
from tests.support.attention_ctypes import Batch, Intervention, Shape, Stats, f32p, f64p, i64p, ptr, u8p  # noqa: F401

pytestmark = pytest.mark.cdriver  # compiles csrc/ into a driver (or library) and runs it

ROOT = Path(__file__).resolve().parents[1]
CSRC = ROOT / "csrc"
SOURCES = ("attention.c", "ops.c", "sgemm.c", "quant.c", "cpu.c", "common.c")

# float32 kernel vs float64 reference: max |err| <= RTOL * max |ref| per tensor (the attention
# tests' bound; float32 rounding of O(1) scores and sums over <= 300 keys stays near 1e-6).
RTOL = 1e-5

ZFV_NONE, ZFV_OTHERS, ZFV_ALL = 0, 1, 2


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler")
    if not all((CSRC / f).exists() for f in SOURCES):
        pytest.skip("C sources not available")
    out = tmp_path_factory.mktemp("attn") / "libattn.so"
    files = [str(CSRC / f) for f in SOURCES]
    base = [cc, "-std=c11", "-O2", "-Wall", "-Wextra", "-fPIC", "-shared", f"-I{CSRC}", "-o", str(out)]
    build = subprocess.run(base + ["-fopenmp", "-DSL_HAVE_OPENMP=1"] + files + ["-lm"], capture_output=True, text=True)
    if build.returncode != 0:  # compiler without OpenMP: the pragmas are ignored
        build = subprocess.run(base + ["-DSL_HAVE_OPENMP=0", "-Wno-unknown-pragmas"] + files + ["-lm"],
                               capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    so = C.CDLL(str(out))
    for name in ("sl_attention_forward", "sl_attention_forward_batch", "sl_attention_probs", "sl_attention_backward",
                 "sl_attention_jvp"):
        getattr(so, name).restype = C.c_int
    so.sl_attn_batch_floats.restype = C.c_int64
    so.sl_last_error.restype = C.c_char_p
    return so


class Config:
    """One attention problem: shape, mask, cap, interventions and random inputs (float32)."""

    def __init__(self, T, H=4, G=2, hd=16, bidirectional=0, window=0, softcap=0.0, iv=None, q_gain=1.0, seed=0, B=2):
        self.T, self.H, self.G, self.hd, self.B = T, H, G, hd, B
        self.bidirectional, self.window, self.softcap = bidirectional, window, softcap
        self.scale = np.float32(1.0 / np.sqrt(hd))
        self.iv = iv  # None or dict(mask_first=[H], zfv=[H], head_scale=[H])
        r = np.random.default_rng(seed)
        self.q = (q_gain * r.standard_normal((T, H * hd))).astype(np.float32)
        self.k = r.standard_normal((T, G * hd)).astype(np.float32)
        self.v = r.standard_normal((T, G * hd)).astype(np.float32)
        self.dout = r.standard_normal((B * T, H * hd)).astype(np.float32)
        self.tq = r.standard_normal((B * T, H * hd)).astype(np.float32)
        self.tk = r.standard_normal((B * T, G * hd)).astype(np.float32)
        self.tv = r.standard_normal((B * T, G * hd)).astype(np.float32)

    def shape(self, T=None):
        return Shape(self.T if T is None else T, self.H, self.G, self.hd, self.scale, self.bidirectional,
                     self.window, self.softcap)

    def c_iv(self):
        if self.iv is None:
            return None, []
        mf = np.ascontiguousarray(self.iv["mask_first"], dtype=np.uint8)
        zf = np.ascontiguousarray(self.iv["zfv"], dtype=np.uint8)
        hs = np.ascontiguousarray(self.iv["head_scale"], dtype=np.float32)
        return C.pointer(Intervention(ptr(mf, u8p), ptr(zf, u8p), ptr(hs))), [mf, zf, hs]


# ----------------------------------------------------------------------------------------------
# C calls
# ----------------------------------------------------------------------------------------------

def check(lib, rc):
    assert rc == 0, lib.sl_last_error().decode()


def c_forward(lib, cfg, threads=1, q=None, k=None, v=None):
    q = cfg.q if q is None else q
    k = cfg.k if k is None else k
    v = cfg.v if v is None else v
    T, H = q.shape[0], cfg.H
    lib.sl_set_num_threads(threads)
    out = np.empty((T, H * cfg.hd), np.float32)
    probs = np.full((H, T, T), np.nan, np.float32)  # every entry must be written
    imp, tf, ent = (np.full((H, T), np.nan, np.float32) for _ in range(3))
    st = Stats(ptr(imp), ptr(tf), ptr(ent))
    iv, keep = cfg.c_iv()
    s = cfg.shape(T)
    check(lib, lib.sl_attention_forward(C.byref(s), ptr(q), C.c_int64(H * cfg.hd), ptr(k), ptr(v),
                                        C.c_int64(cfg.G * cfg.hd), ptr(out), ptr(probs), iv, C.byref(st)))
    # without any capture: the scratch path must give the same outputs
    out2 = np.empty_like(out)
    check(lib, lib.sl_attention_forward(C.byref(s), ptr(q), C.c_int64(H * cfg.hd), ptr(k), ptr(v),
                                        C.c_int64(cfg.G * cfg.hd), ptr(out2), None, iv, None))
    assert np.array_equal(out, out2, equal_nan=True), "output differs with and without captures"
    return dict(out=out, probs=probs, importance=imp, to_first=tf, entropy=ent)


def c_probs(lib, cfg, threads=1):
    lib.sl_set_num_threads(threads)
    probs = np.full((cfg.H, cfg.T, cfg.T), np.nan, np.float32)
    iv, keep = cfg.c_iv()
    s = cfg.shape()
    check(lib, lib.sl_attention_probs(C.byref(s), ptr(cfg.q), ptr(cfg.k), ptr(probs), iv))
    return probs


def c_backward(lib, cfg, probs, threads=1):
    lib.sl_set_num_threads(threads)
    B, T, H, G, hd = cfg.B, cfg.T, cfg.H, cfg.G, cfg.hd
    dq = np.full((B * T, H * hd), np.nan, np.float32)
    dk, dv = (np.full((B * T, G * hd), np.nan, np.float32) for _ in range(2))
    pk, pv = (np.full((B * T, H * hd), np.nan, np.float32) for _ in range(2))
    iv, keep = cfg.c_iv()
    s = cfg.shape()
    check(lib, lib.sl_attention_backward(C.byref(s), C.c_int64(B), ptr(cfg.q), ptr(cfg.k), ptr(cfg.v), ptr(probs),
                                         ptr(cfg.dout), ptr(dq), ptr(dk), ptr(dv), ptr(pk), ptr(pv), iv))
    return dict(dq=dq, dk=dk, dv=dv)


def c_jvp(lib, cfg, probs, threads=1):
    lib.sl_set_num_threads(threads)
    tout = np.full((cfg.B * cfg.T, cfg.H * cfg.hd), np.nan, np.float32)
    iv, keep = cfg.c_iv()
    s = cfg.shape()
    check(lib, lib.sl_attention_jvp(C.byref(s), C.c_int64(cfg.B), ptr(cfg.q), ptr(cfg.k), ptr(cfg.v), ptr(probs),
                                    ptr(cfg.tq), ptr(cfg.tk), ptr(cfg.tv), ptr(tout), iv))
    return tout


def c_forward_batch(lib, cfg, lens, T_pad, threads=1):
    """Sequences of the given lengths packed row after row (their rows are cfg's first len[b]
    rows shifted by b, so that they differ), with every capture at T_pad."""
    B, H, G, hd = len(lens), cfg.H, cfg.G, cfg.hd
    lib.sl_set_num_threads(threads)
    seqs = [(np.roll(cfg.q, -b, 0)[:n], np.roll(cfg.k, -b, 0)[:n], np.roll(cfg.v, -b, 0)[:n]) for b, n in enumerate(lens)]
    q = np.ascontiguousarray(np.concatenate([s[0] for s in seqs]))
    k = np.ascontiguousarray(np.concatenate([s[1] for s in seqs]))
    v = np.ascontiguousarray(np.concatenate([s[2] for s in seqs]))
    off = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    ln = np.asarray(lens, np.int64)
    caps = {name: [np.full(shp, np.nan, np.float32) for _ in lens]
            for name, shp in (("probs", (H, T_pad, T_pad)), ("importance", (H, T_pad)), ("to_first", (H, T_pad)),
                              ("entropy", (H, T_pad)))}
    lists = {name: (f32p * B)(*[ptr(a) for a in arrs]) for name, arrs in caps.items()}
    task_off = np.zeros(B + 1, np.int64)
    part_off = np.zeros(B, np.int64)
    bt = Batch(B, T_pad, ptr(off, i64p), ptr(ln, i64p), lists["probs"], lists["importance"], lists["to_first"],
               lists["entropy"], None, None, None, ptr(task_off, i64p), ptr(part_off, i64p))
    s = cfg.shape(0)
    sizes = (C.c_int64 * 3)()
    lib.sl_attn_batch_floats(C.byref(s), C.byref(bt), C.c_int(threads), sizes)
    vt = np.empty(sizes[0], np.float32)
    partial = np.empty(max(sizes[1] // 2, 1), np.float64)
    scratch = np.empty(sizes[2], np.float32)
    bt.vt, bt.partial, bt.scratch = ptr(vt), ptr(partial, f64p), ptr(scratch)
    out = np.full((int(off[-1]), H * hd), np.nan, np.float32)
    iv, keep = cfg.c_iv()
    check(lib, lib.sl_attention_forward_batch(C.byref(s), C.byref(bt), ptr(q), C.c_int64(H * hd), ptr(k), ptr(v),
                                              C.c_int64(G * hd), ptr(out), iv))
    return seqs, off, out, caps


# ----------------------------------------------------------------------------------------------
# float64 torch reference
# ----------------------------------------------------------------------------------------------

def allowed_keys(cfg, T):
    """(H, T, T) bool: which keys each head's queries see (mask and mask_first)."""
    i = np.arange(T)[:, None]
    j = np.arange(T)[None, :]
    if cfg.bidirectional:
        m = np.ones((T, T), bool)
    else:
        m = j <= i
        if cfg.window > 0:
            m &= j > i - cfg.window
    m = np.broadcast_to(m, (cfg.H, T, T)).copy()
    if cfg.iv is not None:
        for h in range(cfg.H):
            if cfg.iv["mask_first"][h]:
                m[h, 1:, 0] = False  # query 0 keeps key 0 in every mode
    return m


def ref_attention(torch, cfg, q, k, v):
    """q (T, H*hd), k, v (T, G*hd) float64 tensors -> out (T, H*hd), probs (H, T, T)."""
    T, H, G, hd = q.shape[0], cfg.H, cfg.G, cfg.hd
    rep = H // G
    qh = q.reshape(T, H, hd).transpose(0, 1)
    kh = k.reshape(T, G, hd).transpose(0, 1).repeat_interleave(rep, 0)
    vh = v.reshape(T, G, hd).transpose(0, 1).repeat_interleave(rep, 0)
    s = (qh @ kh.transpose(1, 2)) * float(cfg.scale)
    if cfg.softcap > 0:
        s = torch.tanh(s / cfg.softcap) * cfg.softcap
    mask = torch.from_numpy(allowed_keys(cfg, T))
    p = torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1)
    o = p @ vh
    if cfg.iv is not None:
        zeroed = torch.zeros(H, T, 1, dtype=torch.float64)  # 1 where row i reads v_0 as zero
        for h in range(H):
            if cfg.iv["zfv"][h] == ZFV_ALL:
                zeroed[h] = 1
            elif cfg.iv["zfv"][h] == ZFV_OTHERS:
                zeroed[h, 1:] = 1
        o = o - zeroed * p[:, :, :1] * vh[:, :1, :]
        o = o * torch.tensor(np.asarray(cfg.iv["head_scale"], np.float64)).reshape(H, 1, 1)
    return o.transpose(0, 1).reshape(T, H * hd), p


def ref_stats(cfg, p):
    p = p.detach().numpy()
    T = p.shape[-1]
    colsum = p.sum(axis=1)  # (H, T): every query that sees k contributes; others have 0
    importance = colsum / (T if cfg.bidirectional else (T - np.arange(T)))
    with np.errstate(divide="ignore", invalid="ignore"):
        ent = -np.where(p > 0, p * np.log(p), 0.0).sum(-1)
    return dict(importance=importance, to_first=p[:, :, 0], entropy=ent)


def t64(torch, a):
    return torch.tensor(np.asarray(a, np.float64))


def assert_close(name, got, ref, rtol=RTOL):
    ref = np.asarray(ref, np.float64)
    assert np.all(np.isfinite(got)), f"{name}: non-finite entries"
    err = np.max(np.abs(got.astype(np.float64) - ref))
    bound = rtol * max(np.max(np.abs(ref)), 1e-30)
    assert err <= bound, f"{name}: max error {err:.3g} > {bound:.3g} (max |ref| {np.max(np.abs(ref)):.3g})"


# ----------------------------------------------------------------------------------------------
# configurations
# ----------------------------------------------------------------------------------------------

IV4 = dict(mask_first=[1, 0, 0, 1], zfv=[ZFV_NONE, ZFV_OTHERS, ZFV_ALL, ZFV_OTHERS], head_scale=[1.0, 0.5, 1.0, 2.0])

CASES = {
    # T > 64 spans several query blocks; window 40 < 64 makes later blocks skip key blocks
    "causal": dict(T=150),
    "window40": dict(T=150, window=40),
    "window1": dict(T=70, window=1),
    "window_ge_T": dict(T=150, window=200),
    "bidirectional": dict(T=150, bidirectional=1),
    "bidirectional_window_ignored": dict(T=90, bidirectional=1, window=5),
    "softcap": dict(T=150, softcap=2.0, q_gain=3.0),
    "softcap_window": dict(T=150, softcap=2.0, window=50, q_gain=3.0),
    "softcap_bidirectional": dict(T=100, softcap=2.0, bidirectional=1, q_gain=3.0),
    "window_mha": dict(T=130, H=2, G=2, window=64),  # block 64.. sees keys from 1
    # > 4 query blocks: importance is summed over segments
    "window_long": dict(T=300, window=70, H=2, G=1),
    "bidirectional_long": dict(T=300, bidirectional=1, H=2, G=1),
}
IVS = {"plain": None, "iv": IV4}


def make(case, ivname, seed=0):
    kw = dict(CASES[case])
    iv = IVS[ivname]
    if iv is not None:
        H = kw.get("H", 4)
        iv = {key: val[:H] for key, val in iv.items()}
    return Config(iv=iv, seed=seed, **kw)


@pytest.fixture(scope="module")
def torch():
    return rm.require("torch")


@pytest.mark.parametrize("ivname", list(IVS))
@pytest.mark.parametrize("case", list(CASES))
def test_forward_probs_stats_vs_float64(lib, torch, case, ivname):
    cfg = make(case, ivname)
    got = c_forward(lib, cfg)
    out, p = ref_attention(torch, cfg, t64(torch, cfg.q), t64(torch, cfg.k), t64(torch, cfg.v))
    assert_close("out", got["out"], out.numpy())
    assert_close("probs", got["probs"], p.numpy())
    # masked keys are exactly zero (not merely small), and no key a query may see is dropped
    mask = allowed_keys(cfg, cfg.T)
    assert np.all(got["probs"][~mask] == 0.0)
    if cfg.bidirectional and not cfg.softcap:
        assert np.all(got["probs"][mask] > 0.0)
    st = ref_stats(cfg, p)
    for name in ("importance", "to_first", "entropy"):
        assert_close(name, got[name], st[name])
    # sl_attention_probs is bitwise the forward's capture
    assert np.array_equal(c_probs(lib, cfg), got["probs"])


@pytest.mark.parametrize("ivname", list(IVS))
@pytest.mark.parametrize("case", list(CASES))
def test_backward_vs_autograd(lib, torch, case, ivname):
    cfg = make(case, ivname)
    probs = c_probs(lib, cfg)
    got = c_backward(lib, cfg, probs)
    T = cfg.T
    for b in range(cfg.B):
        q, k, v = (t64(torch, a).requires_grad_(True) for a in (cfg.q, cfg.k, cfg.v))
        out, _ = ref_attention(torch, cfg, q, k, v)
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), t64(torch, cfg.dout[b * T:(b + 1) * T]))
        assert_close(f"dq[{b}]", got["dq"][b * T:(b + 1) * T], dq.numpy())
        assert_close(f"dk[{b}]", got["dk"][b * T:(b + 1) * T], dk.numpy())
        assert_close(f"dv[{b}]", got["dv"][b * T:(b + 1) * T], dv.numpy())


@pytest.mark.parametrize("ivname", list(IVS))
@pytest.mark.parametrize("case", list(CASES))
def test_jvp_vs_torch_func(lib, torch, case, ivname):
    cfg = make(case, ivname)
    probs = c_probs(lib, cfg)
    got = c_jvp(lib, cfg, probs)
    T = cfg.T

    def f(q, k, v):
        return ref_attention(torch, cfg, q, k, v)[0]

    prim = tuple(t64(torch, a) for a in (cfg.q, cfg.k, cfg.v))
    for b in range(cfg.B):
        tang = tuple(t64(torch, a[b * T:(b + 1) * T]) for a in (cfg.tq, cfg.tk, cfg.tv))
        _, tout = torch.func.jvp(f, prim, tang)
        assert_close(f"tout[{b}]", got[b * T:(b + 1) * T], tout.numpy())


def test_softcap_changes_results(lib, torch):
    """The cap is applied: with scores of a few units a cap of 2 moves the probabilities far
    more than rounding, and the reference without the cap is rejected."""
    cfg = make("softcap", "plain")
    got = c_forward(lib, cfg)
    nocap = Config(T=cfg.T, softcap=0.0, q_gain=3.0)
    _, p_nocap = ref_attention(torch, nocap, t64(torch, cfg.q), t64(torch, cfg.k), t64(torch, cfg.v))
    assert np.max(np.abs(got["probs"] - p_nocap.numpy())) > 0.1


@pytest.mark.parametrize("case", ["window40", "bidirectional", "softcap_window", "window_long", "bidirectional_long"])
def test_thread_count_bitwise(lib, case):
    cfg = make(case, "iv")
    one = c_forward(lib, cfg, threads=1)
    two = c_forward(lib, cfg, threads=2)
    for name in one:
        assert np.array_equal(one[name], two[name]), name
    assert np.array_equal(c_probs(lib, cfg, 1), c_probs(lib, cfg, 2))
    probs = one["probs"]
    b1, b2 = c_backward(lib, cfg, probs, 1), c_backward(lib, cfg, probs, 2)
    for name in b1:
        assert np.array_equal(b1[name], b2[name]), name
    assert np.array_equal(c_jvp(lib, cfg, probs, 1), c_jvp(lib, cfg, probs, 3))
    lib.sl_set_num_threads(0)


@pytest.mark.parametrize("ivname", list(IVS))
def test_window_at_least_T_is_causal_bitwise(lib, ivname):
    """HF masks nothing more when the window covers the sequence; the kernel then runs the plain
    causal products, bit for bit."""
    a, b = make("window_ge_T", ivname), make("causal", ivname)
    fa, fb = c_forward(lib, a), c_forward(lib, b)
    for name in fa:
        assert np.array_equal(fa[name], fb[name]), name
    ga, gb = c_backward(lib, a, fa["probs"]), c_backward(lib, b, fb["probs"])
    for name in ga:
        assert np.array_equal(ga[name], gb[name]), name
    assert np.array_equal(c_jvp(lib, a, fa["probs"]), c_jvp(lib, b, fb["probs"]))


@pytest.mark.parametrize("case", ["causal", "window40", "bidirectional", "softcap_bidirectional"])
def test_zero_first_value_others_keeps_row0_bitwise(lib, case):
    """SL_ZFV_OTHERS: row 0 of the output is bitwise the un-intervened one in every mode (with
    bidirectional attention query 0 reads all keys, v_0 included)."""
    plain = make(case, "plain")
    iv = make(case, "plain")
    iv.iv = dict(mask_first=[0] * 4, zfv=[ZFV_OTHERS] * 4, head_scale=[1.0] * 4)
    fp, fi = c_forward(lib, plain), c_forward(lib, iv)
    assert np.array_equal(fp["out"][0], fi["out"][0])
    assert np.array_equal(fp["probs"], fi["probs"])
    assert not np.array_equal(fp["out"][1:], fi["out"][1:])


@pytest.mark.parametrize("case", ["window40", "bidirectional", "softcap_window", "window_long", "bidirectional_long"])
@pytest.mark.parametrize("ivname", list(IVS))
def test_batch_ragged_bitwise_per_sequence(lib, case, ivname):
    cfg = make(case, ivname)
    T = cfg.T
    lens = [T, T // 3, 1, T - 7]
    T_pad = T + 3
    seqs, off, out, caps = c_forward_batch(lib, cfg, lens, T_pad, threads=2)
    for b, (n, (q, k, v)) in enumerate(zip(lens, seqs)):
        one = c_forward(lib, cfg, threads=1, q=np.ascontiguousarray(q), k=np.ascontiguousarray(k),
                        v=np.ascontiguousarray(v))
        assert np.array_equal(out[off[b]:off[b + 1]], one["out"]), f"out of sequence {b}"
        assert np.array_equal(caps["probs"][b][:, :n, :n], one["probs"]), f"probs of sequence {b}"
        assert np.all(caps["probs"][b][:, n:, :] == 0) and np.all(caps["probs"][b][:, :, n:] == 0)
        for name in ("importance", "to_first", "entropy"):
            assert np.array_equal(caps[name][b][:, :n], one[name]), f"{name} of sequence {b}"
            assert np.all(caps[name][b][:, n:] == 0), f"{name} padding of sequence {b}"
    lib.sl_set_num_threads(0)


def test_bad_mask_parameters_fail(lib):
    cfg = Config(T=8, H=2, G=2)
    q = np.zeros((8, 2 * 16), np.float32)
    out = np.empty_like(q)
    for window, cap in ((-1, 0.0), (0, -1.0), (0, float("nan")), (0, float("inf"))):
        s = Shape(8, 2, 2, 16, cfg.scale, 0, window, cap)
        rc = lib.sl_attention_forward(C.byref(s), ptr(q), C.c_int64(32), ptr(q), ptr(q), C.c_int64(32), ptr(out),
                                      None, None, None)
        assert rc == 1, (window, cap)
        assert b"attention" in lib.sl_last_error()


@pytest.mark.parametrize("level", [0, 1, 2], ids=["generic", "avx2", "avx512"])
def test_simd_levels_vs_float64(lib, torch, level):
    """The masks and the cap are applied around the dispatched softmax: every level agrees with
    float64 (levels the CPU lacks fall back to the best below it)."""
    lib.sl_set_simd.restype = C.c_int
    best = lib.sl_simd_best()
    try:
        lib.sl_set_simd(level)
        for case in ("softcap_window", "softcap_bidirectional"):
            cfg = make(case, "iv")
            got = c_forward(lib, cfg)
            out, p = ref_attention(torch, cfg, t64(torch, cfg.q), t64(torch, cfg.k), t64(torch, cfg.v))
            assert_close("out", got["out"], out.numpy())
            assert_close("probs", got["probs"], p.numpy())
            q, k, v = (t64(torch, a).requires_grad_(True) for a in (cfg.q, cfg.k, cfg.v))
            o, _ = ref_attention(torch, cfg, q, k, v)
            dq, dk, dv = torch.autograd.grad(o, (q, k, v), t64(torch, cfg.dout[:cfg.T]))
            g = c_backward(lib, cfg, got["probs"])
            for name, ref in (("dq", dq), ("dk", dk), ("dv", dv)):
                assert_close(name, g[name][:cfg.T], ref.numpy())
    finally:
        lib.sl_set_simd(best)
