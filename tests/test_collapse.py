"""Collapse metrics (the paper's §3, Prop. 3.1) against an independent float64 implementation written from the
formulas, applied to residual streams captured from Hugging Face transformers (fp32 eager) on
random tiny models:

    rank-collapse residual  r = ||V - 1 mu^T||_F / ||V||_F,  mu = mean over tokens
    representational collapse  D = ||v_T - v'_{T+1}||_2  (sequence vs. same with the last token
    repeated; the reference runs the two sequences separately)
    Prop. 3.1  ||v_T - v_{T-1}||_2 <= 2 ||V - 1 mu^T||_F  (the implication with the tightest Δ),
    both sides in absolute units, term by term."""
import math

import numpy as np
import pytest

from tests.support.reference_models import BOS_ID, SPECS, hf_forward, make_hf_model, random_ids, require, save_hf

torch = require("torch")

import sinklab as sl  # noqa: E402
from sinklab.analysis.collapse import (CollapseResult, collapse_vs_length, prop31_check,  # noqa: E402
                              rank_collapse, representational_collapse)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    hf = make_hf_model(SPECS["mha"])
    d = save_hf(hf, tmp_path_factory.mktemp("mha"))
    return hf, sl.load(str(d))


def rank_loops(V, start=0):
    """||V - 1 mu^T||_F / ||V||_F term by term (V: (T, d))."""
    V = [[float(x) for x in row] for row in np.asarray(V)[start:]]
    T, d = len(V), len(V[0])
    mu = [sum(V[i][c] for i in range(T)) / T for c in range(d)]
    num = math.sqrt(sum((V[i][c] - mu[c]) ** 2 for i in range(T) for c in range(d)))
    den = math.sqrt(sum(V[i][c] ** 2 for i in range(T) for c in range(d)))
    return num / den


def prop31_loops(V, start=0):
    """(||V - 1 mu^T||_F, ||v_T - v_{T-1}||_2) term by term in float64 (V: (T, d))."""
    V = [[float(x) for x in row] for row in np.asarray(V)[start:]]
    T, d = len(V), len(V[0])
    mu = [sum(V[i][c] for i in range(T)) / T for c in range(d)]
    dev = math.sqrt(sum((V[i][c] - mu[c]) ** 2 for i in range(T) for c in range(d)))
    last = math.sqrt(sum((V[-1][c] - V[-2][c]) ** 2 for c in range(d)))
    return dev, last


def repr_ref(hf, ids):
    """D^(l) from two separate HF runs."""
    a = hf_forward(hf, np.asarray(ids, dtype=np.int64))["resid"]
    b = hf_forward(hf, np.asarray(list(ids) + [ids[-1]], dtype=np.int64))["resid"]
    T = len(ids)
    d = [math.sqrt(sum((float(x) - float(y)) ** 2 for x, y in zip(a[l, T - 1], b[l, T]))) for l in range(a.shape[0])]
    n = [math.sqrt(sum(float(x) ** 2 for x in a[l, T - 1])) for l in range(a.shape[0])]
    return np.asarray(d), np.asarray(n), float(np.abs(a).max())


def test_rank_collapse_formula_on_hf_resid(tiny):
    hf, _ = tiny
    resid = hf_forward(hf, random_ids(hf.config.vocab_size, 24, seed=3))["resid"]   # (L+1, T, d)
    got = rank_collapse(resid)
    assert got.shape == (resid.shape[0],) and got.dtype == np.float64
    for l in range(resid.shape[0]):
        assert got[l] == pytest.approx(rank_loops(resid[l]), rel=1e-12)
        assert rank_collapse(resid, start=1)[l] == pytest.approx(rank_loops(resid[l], start=1), rel=1e-12)
    # batch axes are kept
    np.testing.assert_allclose(rank_collapse(np.stack([resid, resid[:, ::-1]])), np.stack([got, got]), rtol=1e-12)


def test_rank_collapse_known_values():
    row = np.arange(1.0, 6.0)
    assert rank_collapse(np.tile(row, (7, 1))) == 0.0                   # all tokens identical
    V = np.array([[1.0, -2.0], [-1.0, 2.0]])                             # zero mean: residual 1
    assert rank_collapse(V) == pytest.approx(1.0)
    assert np.isnan(rank_collapse(np.zeros((3, 4))))
    with pytest.raises(ValueError, match="start"):
        rank_collapse(V, start=2)
    with pytest.raises(ValueError, match="shape"):
        rank_collapse(np.zeros(4))


def test_rank_collapse_sinklab_run_matches_hf(tiny):
    hf, model = tiny
    ids = random_ids(hf.config.vocab_size, 32, seed=4)
    want = np.array([rank_loops(v) for v in hf_forward(hf, ids)["resid"]])
    got = rank_collapse(model.run(ids, capture=("resid",)).resid)
    np.testing.assert_allclose(got, want, rtol=1e-5)


@pytest.mark.parametrize("T", [2, 9, 30])
def test_representational_collapse_matches_reference(tiny, T):
    hf, model = tiny
    ids = random_ids(hf.config.vocab_size, T, seed=T)
    d, n, scale = repr_ref(hf, ids)
    got = representational_collapse(model, ids)
    assert got.shape == (model.config.n_layers + 1,)
    np.testing.assert_allclose(got, d, rtol=0, atol=1e-4 * scale)
    assert got[0] == pytest.approx(0.0, abs=1e-12)       # same token, same embedding
    np.testing.assert_allclose(representational_collapse(model, ids, relative=True)[1:], (d / n)[1:],
                               rtol=0, atol=1e-4 * scale / n[1:].min())


@pytest.mark.parametrize("rank_positions", ["text", "text_after_first", "all"])
def test_collapse_vs_length_matches_reference(tiny, rank_positions):
    hf, model = tiny
    text = random_ids(hf.config.vocab_size, 40, seed=9, bos=False)
    lengths = (3, 8, 20)
    res = collapse_vs_length(model, text, lengths=lengths, bos="both", rank_positions=rank_positions,
                             progress=False)
    L1 = model.config.n_layers + 1
    assert res.lengths.tolist() == list(lengths) and res.settings == ["bos", "nobos"]
    for s in res.settings:
        assert res.rank[s].shape == res.repr_dist[s].shape == (len(lengths), L1)
        for i, T in enumerate(lengths):
            seq = ([BOS_ID] if s == "bos" else []) + [int(x) for x in text[:T]]
            resid = hf_forward(hf, np.asarray(seq))["resid"]
            off = 1 if s == "bos" else 0
            start = {"text": off, "text_after_first": off + 1, "all": 0}[rank_positions]
            want_rank = [rank_loops(resid[l], start) for l in range(L1)]
            np.testing.assert_allclose(res.rank[s][i], want_rank, rtol=1e-5)
            d, n, scale = repr_ref(hf, seq)
            np.testing.assert_allclose(res.repr_dist[s][i], d, rtol=0, atol=1e-4 * scale)
            np.testing.assert_allclose(res.last_norm[s][i], n, rtol=1e-5)
            want = np.array([prop31_loops(resid[l], start) for l in range(L1)])
            np.testing.assert_allclose(res.dev_frob[s][i], want[:, 0], rtol=1e-5)
            np.testing.assert_allclose(res.last_two[s][i], want[:, 1], rtol=0, atol=1e-4 * scale)
        p = res.prop31(s)
        assert p.holds.shape == p.slack.shape == (len(lengths), L1) and p.holds.dtype == bool
        assert np.all(p.holds) and np.nanmax(p.slack) <= 1 / math.sqrt(2) + 1e-9
        np.testing.assert_allclose(p.slack, res.last_two[s] / (2 * res.dev_frob[s]), rtol=1e-12)


def test_collapse_vs_length_errors(tiny):
    hf, model = tiny
    ctx = model.config.context_length
    long_text = random_ids(hf.config.vocab_size, ctx + 5, seed=1, bos=False)
    # BOS + T text tokens + the repeated token must fit: T = ctx - 1 does not with BOS
    with pytest.raises(ValueError, match=rf"T={ctx - 1}.*{ctx + 1} tokens exceeds the model's context length {ctx}"):
        collapse_vs_length(model, long_text, lengths=(4, ctx - 1), bos="both", progress=False)
    with pytest.raises(ValueError, match="context length"):
        collapse_vs_length(model, long_text, lengths=(ctx,), bos=False, progress=False)
    with pytest.raises(ValueError, match="context length"):
        representational_collapse(model, long_text[:ctx])
    with pytest.raises(ValueError, match="the text has 10 tokens, fewer than .* 16"):
        collapse_vs_length(model, long_text[:10], lengths=(4, 16), progress=False)
    with pytest.raises(ValueError, match=">= 3"):
        collapse_vs_length(model, long_text, lengths=(2, 4), progress=False)
    with pytest.raises(ValueError, match="rank_positions"):
        collapse_vs_length(model, long_text, lengths=(4,), rank_positions="bos", progress=False)
    with pytest.raises(ValueError, match="1-D"):
        representational_collapse(model, np.zeros((2, 3), dtype=np.int64))


def test_text_input_save_load_and_figure(tiny, tmp_path):
    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure

    from sinklab.viz.figures_mixing import collapse_figure

    _, model = tiny
    text = " the cat sat on the mat and the bat ran to the hat, then the rat sat on the cat"
    res = collapse_vs_length(model, text, lengths=(4, 8, 16), bos=True, progress=False)
    assert res.settings == ["bos"]
    np.testing.assert_array_equal(res.meta["ids"], model.tokenize(text)[:16])
    p = tmp_path / "collapse.npz"
    res.save(str(p))
    back = CollapseResult.load(str(p))
    assert back.meta == res.meta and back.settings == res.settings
    np.testing.assert_array_equal(back.rank["bos"], res.rank["bos"])
    np.testing.assert_array_equal(back.repr_rel["bos"], res.repr_rel["bos"])
    np.testing.assert_array_equal(back.prop31("bos").slack, res.prop31("bos").slack)
    np.testing.assert_array_equal(back.last_two["bos"], res.last_two["bos"])
    assert res.summary()["settings"]["bos"]["rank_collapse"][0][0] == pytest.approx(res.rank["bos"][0, 0])
    both = collapse_vs_length(model, text, lengths=(4, 8), progress=False)
    for r in (res, both):
        fig = collapse_figure(r)
        assert isinstance(fig, Figure)
        plt.close(fig)


# ------------------------------------------------------------------ Prop. 3.1
def test_prop31_check_on_random_arrays():
    rng = np.random.default_rng(0)
    R = rng.normal(size=(3, 9, 5)) * np.array([1.0, 10.0, 0.1])[:, None, None]
    p = prop31_check(R)
    assert p.dev_frob.shape == p.last_two.shape == (3,) and p.dev_frob.dtype == np.float64
    for k in range(3):
        for start in (0, 4):
            dev, last = prop31_loops(R[k], start)
            q = prop31_check(R[k], start=start)
            assert float(q.dev_frob) == pytest.approx(dev, rel=1e-12)
            assert float(q.last_two) == pytest.approx(last, rel=1e-12)
            assert bool(q.holds) == (last <= 2 * dev)
            assert float(q.slack) == pytest.approx(last / (2 * dev), rel=1e-12)
    with pytest.raises(ValueError, match="fewer than 2 tokens"):
        prop31_check(R, start=8)
    with pytest.raises(ValueError, match="shape"):
        prop31_check(np.zeros(4))


def test_prop31_constructed_cases():
    d = 4
    mu = np.array([3.0, -1.0, 2.0, 0.5])
    u = np.array([0.2, 0.1, -0.3, 0.4])
    # tight case: every row at mu except the last two at mu ± u -> slack = 2|u| / (2 sqrt(2)|u|)
    V = np.tile(mu, (6, 1))
    V[-2] -= u
    V[-1] += u
    p = prop31_check(V)
    assert float(p.dev_frob) == pytest.approx(math.sqrt(2) * np.linalg.norm(u), rel=1e-12)
    assert float(p.last_two) == pytest.approx(2 * np.linalg.norm(u), rel=1e-12)
    assert float(p.slack) == pytest.approx(1 / math.sqrt(2), rel=1e-12) and bool(p.holds)
    # last two rows equal, the spread elsewhere: left side 0, slack 0
    W = np.tile(mu, (5, 1))
    W[0] += 5 * u
    assert float(prop31_check(W).last_two) == 0 and float(prop31_check(W).slack) == 0
    # tiny residual: rows = a large common vector + 1e-8 noise; reference from the noise alone
    rng = np.random.default_rng(1)
    noise = rng.normal(size=(7, d)) * 1e-8
    X = (np.full(d, 100.0) + noise).astype(np.float64)
    q = prop31_check(X)
    dn = noise - noise.mean(axis=0)
    assert float(q.dev_frob) == pytest.approx(float(np.sqrt((dn ** 2).sum())), rel=1e-5)
    assert float(q.last_two) == pytest.approx(float(np.linalg.norm(noise[-1] - noise[-2])), rel=1e-5)
    assert float(q.dev_frob) < 1e-7 and bool(q.holds) and 0 < float(q.slack) <= 1 / math.sqrt(2)
    # identical rows: both sides 0, the implication holds, the slack is undefined
    z = prop31_check(np.tile(mu, (4, 1)))
    assert float(z.dev_frob) == 0 and float(z.last_two) == 0 and bool(z.holds) and np.isnan(z.slack)
    # a violation is reported as such (values that no matrix can produce)
    from sinklab.analysis.collapse import Prop31

    bad = Prop31(dev_frob=np.array([1.0, 1.0]), last_two=np.array([2.0, 2.5]))
    assert bad.holds.tolist() == [True, False] and bad.slack.tolist() == [1.0, 1.25]


def test_smollm2_prop31_matches_float64(smollm2_gguf):
    """Real model: both sides of Prop. 3.1 per layer against float64 NumPy on the residual
    stream of a separate run of the T-token prompt; the implication holds on every layer."""
    from sinklab.prompts import load_passages

    model = sl.load(str(smollm2_gguf), quiet=True)
    text = load_passages("sinks")[0]
    lengths = (8, 40)
    res = collapse_vs_length(model, text, lengths=lengths, bos="both", progress=False)
    ids = model.tokenize(text, bos=False)
    L1 = model.config.n_layers + 1
    for s in ("bos", "nobos"):
        for i, T in enumerate(lengths):
            seq = np.concatenate([[model.bos_id(True)], ids[:T]]) if s == "bos" else ids[:T]
            R = model.run(seq, capture=("resid",)).resid.astype(np.float64)
            V = R[:, len(seq) - T + 1:, :]                     # text tokens 1..T-1
            mu = V.mean(axis=1, keepdims=True)
            dev = np.sqrt(((V - mu) ** 2).sum(axis=(1, 2)))
            last = np.sqrt(((V[:, -1] - V[:, -2]) ** 2).sum(axis=-1))
            np.testing.assert_allclose(res.dev_frob[s][i], dev, rtol=1e-4)
            np.testing.assert_allclose(res.last_two[s][i], last, rtol=1e-4, atol=1e-4 * np.abs(R).max())
        p = res.prop31(s)
        assert p.holds.shape == (len(lengths), L1) and np.all(p.holds)
        assert np.all(p.slack[:, 1:] > 0) and np.nanmax(p.slack) <= 1 / math.sqrt(2) + 1e-9
    summ = res.summary()
    assert summ["prop31_all_hold"] is True
    assert len(summ["settings"]["bos"]["prop31"]["slack"]) == len(lengths)
    assert len(summ["settings"]["bos"]["prop31"]["holds"][0]) == L1


# ------------------------------------------------------------------ collapse trends over passage units
from sinklab.analysis.collapse import (CollapseTrend, Prop31 as _Prop31, collapse_trend,  # noqa: E402
                                       criterion_collapse, criterion_prop31, ols_slope, passage_unit_spans,
                                       passage_units)
from sinklab.analysis.status import (CONSISTENCY, CONTRADICTED, INCONCLUSIVE, NOT_TESTABLE,  # noqa: E402
                                     REPRODUCED)


def test_passage_units_disjoint_and_concatenated(tiny):
    _, model = tiny
    texts = ["the cat sat.", "a dog ran to the park and back again and again.", "the bat flew.",
             "then the rat sat on the cat.", "the end of it all, at last."]
    n = 30
    units = passage_units(model, texts, n, 2)
    spans = passage_unit_spans(model, texts, n, 2)
    assert [len(u) for u in units] == [n, n] and all(u.dtype == np.int64 for u in units)
    assert not set(spans[0]) & set(spans[1]) and spans[0][0] == 0 and spans[1][0] == spans[0][-1] + 1
    for u, span in zip(units, spans):
        want = np.concatenate([model.tokenize(texts[k] + "\n\n", bos=False) for k in span])
        assert len(want) >= n and (len(span) == 1 or len(want) - len(model.tokenize(texts[span[-1]] + "\n\n")) < n)
        np.testing.assert_array_equal(u, want[:n])
    ids = [np.arange(3, 13), np.arange(20, 40), np.arange(50, 55)]
    assert passage_unit_spans(model, ids, 12, 1) == [[0, 1]]
    with pytest.raises(ValueError, match="units never share a passage"):
        passage_units(model, ids, 15, 2)
    np.testing.assert_array_equal(passage_units(model, ids, 12, 1)[0], np.r_[np.arange(3, 13), 20, 21])
    with pytest.raises(TypeError, match="sequence of strings"):
        collapse_trend(model, "one string", lengths=(4,), n_passages=1, progress=False)


def test_collapse_trend_matches_collapse_vs_length(tiny):
    hf, model = tiny
    texts = [random_ids(hf.config.vocab_size, 25, seed=s, bos=False) for s in (11, 12, 13)]
    lengths = (4, 10, 25)
    tr = collapse_trend(model, texts, lengths=lengths, bos="both", n_passages=3, progress=False)
    L1 = model.config.n_layers + 1
    assert tr.settings == ["bos", "nobos"] and tr.n_units == 3 and tr.meta["units"] == [[0], [1], [2]]
    assert tr.depth_layers == list(range(1, L1))
    for u, text in enumerate(texts):
        ref = collapse_vs_length(model, text, lengths=lengths, bos="both", progress=False)
        for s in tr.settings:
            assert tr.rank[s].shape == (3, len(lengths), L1)
            np.testing.assert_array_equal(tr.rank[s][u], ref.rank[s])
            np.testing.assert_array_equal(tr.repr_dist[s][u], ref.repr_dist[s])
            np.testing.assert_array_equal(tr.dev_frob[s][u], ref.dev_frob[s])
    # one case straight against the HF reference (text tokens 1..T-1 with BOS)
    resid = hf_forward(hf, np.asarray([BOS_ID] + [int(x) for x in texts[1][:10]]))["resid"]
    np.testing.assert_allclose(tr.rank["bos"][1, 1], [rank_loops(resid[l], 2) for l in range(L1)], rtol=1e-5)
    assert criterion_prop31(tr.prop31("bos")).status == CONSISTENCY
    assert criterion_prop31({s: tr.prop31(s) for s in tr.settings}).numbers["cases"] == 2 * 3 * len(lengths) * L1


def synthetic_trend(depth_b, ctx_b, noise, P=12, lengths=(16, 32, 64, 128, 256), L=6, seed=0):
    """A CollapseTrend whose rank residual is 0.5 + depth_b (l - mean l) + ctx_b (log T - mean)
    + noise per (unit, T, layer), the noise of the second half of the units the mirror image of
    the first, so that the true slopes are the mean slopes exactly."""
    rng = np.random.default_rng(seed)
    Ts = np.asarray(lengths, np.int64)
    l = np.arange(L + 1, dtype=np.float64)
    x = np.log(Ts) - np.log(Ts).mean()
    e = rng.normal(size=(P // 2, len(Ts), L + 1))
    e = np.concatenate([e, -e])           # mirrored units: the noise's mean slope is exactly 0
    rank = 0.5 + depth_b * (l - l[1:].mean())[None, None, :] + ctx_b * x[None, :, None] + noise * e
    ones = np.ones_like(rank)
    return CollapseTrend(lengths=Ts, settings=["bos"], rank={"bos": rank}, repr_dist={"bos": rank * 2},
                         last_norm={"bos": 2 * ones}, dev_frob={"bos": ones}, last_two={"bos": 0.5 * ones},
                         meta={"model": "synthetic"})


def test_collapse_slopes_against_float64_numpy():
    """Synthetic residual streams (P units, T tokens, L+1 layers, d dims) whose tokens draw together
    with depth and length; the measures from rank_collapse, the slopes from np.polyfit on a
    term-by-term float64 residual."""
    rng = np.random.default_rng(5)
    P, L, d, Ts = 4, 5, 6, (8, 16, 32)
    rank = np.empty((P, len(Ts), L + 1))
    want_rank = np.empty_like(rank)
    for p in range(P):
        for i, T in enumerate(Ts):
            common = rng.normal(size=d)
            for l in range(L + 1):
                V = common + rng.normal(size=(T, d)) / (1 + l + np.log(T))     # spread falls with l, T
                rank[p, i, l] = rank_collapse(V)
                want_rank[p, i, l] = rank_loops(V)
    np.testing.assert_allclose(rank, want_rank, rtol=1e-12)
    ones = np.ones_like(rank)
    tr = CollapseTrend(lengths=np.asarray(Ts), settings=["bos"], rank={"bos": rank}, repr_dist={"bos": ones},
                       last_norm={"bos": ones}, dev_frob={"bos": ones}, last_two={"bos": ones}, meta={})
    layers = np.arange(1, L + 1)
    want_depth = np.array([[np.polyfit(layers, want_rank[p, i, 1:], 1)[0] for i in range(len(Ts))] for p in range(P)])
    np.testing.assert_allclose(tr.depth_slope(), want_depth, rtol=1e-10)
    x = np.log(np.asarray(Ts, np.float64))
    want_ctx = np.array([np.polyfit(x, want_rank[p, :, L], 1)[0] for p in range(P)])
    np.testing.assert_allclose(tr.context_slope(), want_ctx, rtol=1e-10)
    want_mean = np.array([np.polyfit(x, want_rank[p, :, 1:].mean(axis=1), 1)[0] for p in range(P)])
    np.testing.assert_allclose(tr.context_slope(layer="mean"), want_mean, rtol=1e-10)
    assert tr.depth_ci().value == pytest.approx(want_depth.mean(), rel=1e-12)
    assert tr.context_ci().value == pytest.approx(want_ctx.mean(), rel=1e-12)
    assert tr.depth_ci().hi < 0 and tr.context_ci().hi < 0
    assert criterion_collapse(tr).status == REPRODUCED
    np.testing.assert_allclose(ols_slope(np.array([0.0, 1.0, 3.0]), np.array([1.0, 3.0, 7.0])), 2.0)
    assert np.isnan(ols_slope(np.array([2.0, 2.0]), np.array([1.0, 3.0])))


@pytest.mark.parametrize("depth_b,ctx_b,noise,status", [
    (-0.02, -0.05, 0.01, REPRODUCED),      # residual falls with depth and with log T
    (0.02, -0.05, 0.01, CONTRADICTED),     # rises with depth
    (-0.02, 0.05, 0.01, CONTRADICTED),     # rises with length
    (0.0, 0.0, 0.05, INCONCLUSIVE),        # flat, noisy
    (-0.02, 0.0, 0.05, INCONCLUSIVE),      # falls with depth, flat with length
])
def test_criterion_collapse_statuses(depth_b, ctx_b, noise, status):
    tr = synthetic_trend(depth_b, ctx_b, noise, seed=2)
    v = criterion_collapse(tr)
    assert v.status == status, v.reason
    assert criterion_collapse(tr, measure="repr_rel").status == status    # repr_rel = rank here


def test_criterion_collapse_one_length():
    v = criterion_collapse(synthetic_trend(-0.02, 0.0, 0.01, lengths=(64,)))
    assert v.numbers["part0"]["status"] == REPRODUCED and v.numbers["part1"]["status"] == NOT_TESTABLE
    assert v.status == INCONCLUSIVE


def test_criterion_prop31_statuses():
    rng = np.random.default_rng(3)
    good = prop31_check(rng.normal(size=(4, 7, 5)))
    v = criterion_prop31(good)
    assert v.status == CONSISTENCY and v.numbers == {"holds": 4, "cases": 4}
    assert criterion_prop31([good, good]).numbers["cases"] == 8
    bad = _Prop31(dev_frob=np.array([1.0, 1.0, 1.0]), last_two=np.array([1.0, 2.5, 1.6]))   # 2.5 > 2: fails;
    v = criterion_prop31(bad)                                        # 1.6: holds but slack 0.8 > 1/sqrt(2)
    assert v.status == CONTRADICTED and v.numbers == {"holds": 1, "cases": 3}
    with pytest.raises(ValueError):
        criterion_prop31([])


def test_collapse_trend_summary_save_load_figure(tmp_path):
    import json

    from matplotlib.figure import Figure

    from sinklab.viz.figures_mixing import collapse_trend_figure

    tr = synthetic_trend(-0.02, -0.05, 0.01, P=4, lengths=(16, 64))
    s = tr.summary()
    json.dumps(s, allow_nan=False)
    assert s["settings"]["bos"]["rank"]["verdict"]["status"] == REPRODUCED
    assert s["settings"]["bos"]["prop31"]["verdict"]["status"] == CONSISTENCY
    back = CollapseTrend.load(tr.save(str(tmp_path / "trend")))
    np.testing.assert_array_equal(back.rank["bos"], tr.rank["bos"])
    assert back.meta == tr.meta and back.settings == tr.settings
    with pytest.raises(ValueError, match="not a saved collapse trend"):
        CollapseTrend.load(_other_npz(tmp_path))
    for meas in ("rank", "repr_rel"):
        assert isinstance(collapse_trend_figure(tr, meas), Figure)


def _other_npz(tmp_path):
    from sinklab.results import save_npz

    return save_npz(str(tmp_path / "other.npz"), {"x": np.zeros(1)}, {"kind": "other"})
