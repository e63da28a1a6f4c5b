"""The mixing measure (sinklab.analysis.mixing) against independent references:

* the exclusion sets by construction: position 0 of the run with BOS and the first text token (the
  relocated sink) are excluded in both conditions, so both compare text tokens 1..T-2;
* the masses sum_{j in O} ||d resid[L][-1] / d resid[l][j]||_F^2 from sl.sensitivity (exact)
  against torch.func.jacrev through the Hugging Face forward on a random tiny LLaMA, with the
  source positions written out here by hand; the probe estimate close to them;
* the trends (per-unit OLS slope vs log T, bootstrap over units) against numpy.polyfit;
* criterion_mixing fed synthetic results that must give reproduced, contradicted and inconclusive.
"""
import json
import math

import numpy as np
import pytest

from tests.support.reference_models import SPECS, make_hf_model, random_ids, require, save_hf

torch = require("torch")

import sinklab as sl  # noqa: E402
from sinklab.analysis.mixing import (GROUPS, MixingResult, criterion_mixing, group_masses,  # noqa: E402
                                     mixing_measure, source_groups)
from sinklab.analysis.stats import N_BOOT  # noqa: E402
from sinklab.analysis.status import CONTRADICTED, INCONCLUSIVE, NOT_TESTABLE, REPRODUCED  # noqa: E402


# ------------------------------------------------------------------ exclusion sets by construction
@pytest.mark.parametrize("T", [3, 4, 7, 64])
def test_exclusion_sets_same_text_tokens(T):
    b, n = source_groups(T, "bos"), source_groups(T, "nobos")
    # the partition of each run's positions
    for g, run_len in ((b, T + 1), (n, T)):
        allpos = np.sort(np.concatenate([g[k] for k in GROUPS]))
        np.testing.assert_array_equal(allpos, np.arange(run_len))
    # with BOS: position 0 is BOS, position 1 the first text token, both out of "others"
    assert b["bos"].tolist() == [0] and b["first_text"].tolist() == [1] and b["target"].tolist() == [T]
    assert 0 not in b["others"] and 1 not in b["others"] and T not in b["others"]
    # without BOS: position 0 is the first text token (the relocated sink), out of "others"
    assert n["bos"].tolist() == [] and n["first_text"].tolist() == [0] and n["target"].tolist() == [T - 1]
    assert 0 not in n["others"] and T - 1 not in n["others"]
    # the same text tokens in both: text index = position - 1 with BOS, = position without
    np.testing.assert_array_equal(b["others"] - 1, n["others"])
    np.testing.assert_array_equal(n["others"], np.arange(1, T - 1))
    with pytest.raises(ValueError, match="at least 3"):
        source_groups(2, "bos")


def test_group_masses_by_hand():
    rng = np.random.default_rng(0)
    T = 6
    fro_b, fro_n = rng.random((2, T + 1)), rng.random((2, T))
    mb, mn = group_masses(fro_b, T, "bos"), group_masses(fro_n, T, "nobos")
    np.testing.assert_allclose(mb["others"], (fro_b[:, 2:6] ** 2).sum(1), rtol=1e-14)
    np.testing.assert_allclose(mn["others"], (fro_n[:, 1:5] ** 2).sum(1), rtol=1e-14)
    np.testing.assert_allclose(mb["bos"], fro_b[:, 0] ** 2, rtol=1e-14)
    np.testing.assert_allclose(mb["first_text"], fro_b[:, 1] ** 2, rtol=1e-14)
    np.testing.assert_allclose(mn["first_text"], fro_n[:, 0] ** 2, rtol=1e-14)
    np.testing.assert_array_equal(mn["bos"], 0.0)
    np.testing.assert_allclose(sum(mb.values()), (fro_b ** 2).sum(1), rtol=1e-14)


# ------------------------------------------------------------------ masses against torch.autograd
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    hf = make_hf_model(SPECS["mha"])
    d = save_hf(hf, tmp_path_factory.mktemp("mha_mixing"))
    return hf, sl.load(str(d), quiet=True)


def _ref_block_norms2(hf, ids, l):
    """(T,) float64 ||d resid[L][-1] / d resid[l][j]||_F^2 for every j, by torch.func.jacrev of the
    HF forward with resid[l] (the input of decoder layer l) replaced by x."""
    layers = hf.model.layers
    ids_t = torch.as_tensor(np.asarray(ids, np.int64))[None]
    store = {}

    def capture(_m, args, kwargs):
        store["x"] = args[0][0].detach().clone()

    h = layers[l].register_forward_pre_hook(capture, with_kwargs=True)
    with torch.no_grad():
        hf.model(input_ids=ids_t, use_cache=False)
    h.remove()

    def f(x):
        def replace(_m, args, kwargs):
            return (x[None].to(args[0].dtype),) + tuple(args[1:]), kwargs

        out = {}

        def last(_m, _a, o):
            out["y"] = o[0] if isinstance(o, (tuple, list)) else o

        h1 = layers[l].register_forward_pre_hook(replace, with_kwargs=True)
        h2 = layers[-1].register_forward_hook(last)
        try:
            hf.model(input_ids=ids_t, use_cache=False)
        finally:
            h1.remove()
            h2.remove()
        return out["y"][0, -1]

    J = torch.func.jacrev(f)(store["x"]).detach().double()      # (d, T, d)
    return (J ** 2).sum(dim=(0, 2)).numpy()


def test_mass_exact_matches_autograd(tiny):
    hf, model = tiny
    L = model.config.n_layers
    units = [random_ids(320, 12, seed=s, bos=False) for s in (1, 2)]
    lengths = (5, 9)
    res = mixing_measure(model, passages=units, lengths=lengths, n_passages=2, exact_up_to=100, progress=False)
    assert res.method == ["exact", "exact"] and res.layers.tolist() == list(range(1, L))
    assert res.meta["units"] == [[0], [1]]
    for u, text in enumerate(units):
        for i, T in enumerate(lengths):
            runs = {"bos": np.concatenate([[1], text[:T]]), "nobos": text[:T]}
            for k, l in enumerate(res.layers):
                ref = {c: _ref_block_norms2(hf, ids, int(l)) for c, ids in runs.items()}
                # the sources written out by hand: text tokens 1..T-2
                want = {"bos": ref["bos"][2:T].sum(), "nobos": ref["nobos"][1:T - 1].sum()}
                for c in ("bos", "nobos"):
                    assert res.mass[c]["others"][u, i, k] == pytest.approx(want[c], rel=2e-4)
                    assert res.total(c)[u, i, k] == pytest.approx(ref[c].sum(), rel=2e-4)
                assert res.mass["bos"]["bos"][u, i, k] == pytest.approx(ref["bos"][0], rel=2e-4)
                assert res.mass["bos"]["first_text"][u, i, k] == pytest.approx(ref["bos"][1], rel=2e-4)
                assert res.mass["nobos"]["first_text"][u, i, k] == pytest.approx(ref["nobos"][0], rel=2e-4)
                assert res.log_ratio()[u, i, k] == pytest.approx(math.log(want["nobos"] / want["bos"]), abs=5e-4)
                assert res.share("nobos")[u, i, k] == pytest.approx(want["nobos"] / ref["nobos"].sum(), rel=5e-4)


def test_estimate_close_to_exact(tiny):
    _, model = tiny
    units = [random_ids(320, 24, seed=s, bos=False) for s in (3, 4)]
    ex = mixing_measure(model, passages=units, lengths=(8, 24), n_passages=2, exact_up_to=1000, progress=False)
    est = mixing_measure(model, passages=units, lengths=(8, 24), n_passages=2, n_probes=256, seed=5, progress=False)
    assert est.method == ["estimate", "estimate"]
    for c in ("bos", "nobos"):
        rel = np.abs(est.mass[c]["others"] / ex.mass[c]["others"] - 1)
        assert np.median(rel) < 0.1, np.median(rel)
    assert np.median(np.abs(est.log_ratio() - ex.log_ratio())) < 0.1
    again = mixing_measure(model, passages=units, lengths=(8, 24), n_passages=2, n_probes=256, seed=5, progress=False)
    np.testing.assert_array_equal(again.mass["bos"]["others"], est.mass["bos"]["others"])


def test_text_passages_units_and_errors(tiny):
    _, model = tiny
    L = model.config.n_layers
    texts = ["the cat sat on the mat.", "a dog ran to the park and back again.", "the bat flew.",
             "then the rat sat on the cat, the end."]
    res = mixing_measure(model, passages=texts, lengths=(4, 30), n_passages=2, n_probes=4, progress=False)
    spans = res.meta["units"]
    assert len(spans) == 2 and not set(spans[0]) & set(spans[1])       # disjoint passages
    flat = [k for s in spans for k in s]
    assert flat == list(range(len(flat)))                                # consecutive, in order
    with pytest.raises(ValueError, match="units never share a passage"):
        mixing_measure(model, passages=texts, lengths=(4, 200), n_passages=2, progress=False)
    with pytest.raises(ValueError, match="layers"):
        mixing_measure(model, passages=texts, lengths=(4,), n_passages=1, layers=[0], progress=False)
    with pytest.raises(ValueError, match="layers"):
        mixing_measure(model, passages=texts, lengths=(4,), n_passages=1, layers=[L], progress=False)
    with pytest.raises(ValueError, match=">= 3"):
        mixing_measure(model, passages=texts, lengths=(2, 4), n_passages=1, progress=False)


# ------------------------------------------------------------------ synthetic results
def synthetic(a, b, noise, P=12, lengths=(64, 128, 256, 512, 1024), nl=4, seed=0):
    """A MixingResult whose per-unit log ratio is a + b (log T - mean log T) + noise (the other
    groups fixed): a is the mean effect, b the slope vs log T."""
    rng = np.random.default_rng(seed)
    Ts = np.asarray(lengths, np.int64)
    base = np.exp(rng.normal(size=(P, len(Ts), nl)))
    x = np.log(Ts) - np.log(Ts).mean()
    e = rng.normal(size=(P // 2, len(Ts), nl))
    e = np.concatenate([e, -e])           # mirrored units: the noise's mean and mean slope are exactly 0
    lr = a + b * x[None, :, None] + noise * e
    ones = np.ones((P, len(Ts), nl))
    mass = {"bos": {"bos": 2 * ones, "first_text": ones, "others": base, "target": 3 * ones},
            "nobos": {"bos": 0 * ones, "first_text": 2 * ones, "others": base * np.exp(lr), "target": 3 * ones}}
    return MixingResult(lengths=Ts, layers=np.arange(1, nl + 1), mass=mass, method=["estimate"] * len(Ts),
                        seconds={c: np.zeros((P, len(Ts))) for c in ("bos", "nobos")}, meta={"model": "synthetic"})


def test_trend_against_polyfit():
    r = synthetic(0.2, 0.05, 0.3, seed=3)
    lr = np.log(r.mass["nobos"]["others"] / r.mass["bos"]["others"])
    x = np.log(r.lengths.astype(np.float64))
    want = np.array([np.polyfit(x, lr[p].mean(axis=1), 1)[0] for p in range(r.n_units)])
    np.testing.assert_allclose(r.slopes(), want, rtol=1e-10, atol=1e-12)
    want_l = np.array([[np.polyfit(x, lr[p, :, k], 1)[0] for k in range(lr.shape[2])] for p in range(r.n_units)])
    np.testing.assert_allclose(r.layer_slopes(), want_l, rtol=1e-10, atol=1e-12)
    iv = r.slope()
    assert iv.value == pytest.approx(want.mean(), rel=1e-12) and iv.n == r.n_units and iv.lo < iv.value < iv.hi
    # the bootstrap over units, by hand (same seed and resamples as sinklab.analysis.stats)
    from sinklab.analysis.stats import SEED

    idx = np.random.default_rng(SEED).integers(0, r.n_units, size=(N_BOOT, r.n_units))
    boot = want[idx].mean(axis=1)
    assert iv.lo == pytest.approx(np.quantile(boot, 0.025), rel=1e-10)
    assert iv.hi == pytest.approx(np.quantile(boot, 0.975), rel=1e-10)
    assert r.effect().value == pytest.approx(lr.mean(), rel=1e-12)


@pytest.mark.parametrize("a,b,noise,status", [
    (0.3, 0.1, 0.05, REPRODUCED),          # more mixing without BOS, growing with T
    (-0.3, 0.1, 0.05, CONTRADICTED),       # less mixing without BOS
    (0.3, -0.1, 0.05, CONTRADICTED),       # more mixing, shrinking with T
    (0.0, 0.0, 0.5, INCONCLUSIVE),         # noise only
    (0.3, 0.0, 0.5, INCONCLUSIVE),         # an effect, no detectable trend
])
def test_criterion_mixing_statuses(a, b, noise, status):
    v = criterion_mixing(synthetic(a, b, noise, seed=7))
    assert v.status == status, v.reason
    assert set(v.numbers) == {"part0", "part1"}


def test_criterion_mixing_one_length_not_testable_part():
    v = criterion_mixing(synthetic(0.5, 0.0, 0.05, lengths=(64,)))
    assert v.numbers["part0"]["status"] == REPRODUCED and v.numbers["part1"]["status"] == NOT_TESTABLE
    assert v.status == INCONCLUSIVE


def test_criterion_is_scale_free_per_condition():
    """An overall factor on every mass of one condition moves the log ratio by its log, the share
    not at all (what the two versions measure)."""
    r = synthetic(0.3, 0.1, 0.05)
    s0, lr0 = r.share("nobos").copy(), r.log_ratio().copy()
    for g in GROUPS:
        r.mass["nobos"][g] = r.mass["nobos"][g] * 10.0
    np.testing.assert_allclose(r.share("nobos"), s0, rtol=1e-12)
    np.testing.assert_allclose(r.log_ratio(), lr0 + math.log(10.0), rtol=1e-12)
    np.testing.assert_allclose(r.log_ratio_vs_self(), lr0, rtol=1e-12, atol=1e-12)


def test_summary_save_load_figure(tmp_path):
    from matplotlib.figure import Figure

    from sinklab.viz.figures_mixing import mixing_measure_figure

    r = synthetic(0.3, 0.1, 0.2, P=6, lengths=(64, 256), nl=3)
    s = r.summary()
    json.dumps(s, allow_nan=False)
    assert s["verdict"]["status"] == criterion_mixing(r).status
    assert len(s["log_ratio"]["by_length_layer"]) == 2 and len(s["log_ratio"]["by_length_layer"][0]) == 3
    path = r.save(str(tmp_path / "mix"))
    back = MixingResult.load(path)
    np.testing.assert_array_equal(back.log_ratio(), r.log_ratio())
    assert back.method == r.method and back.meta == r.meta and back.layers.tolist() == [1, 2, 3]
    with pytest.raises(ValueError, match="not a saved mixing"):
        from sinklab.results import save_npz

        MixingResult.load(save_npz(str(tmp_path / "other"), {"x": np.zeros(1)}, {"kind": "x"}))
    fig = mixing_measure_figure(r)
    assert isinstance(fig, Figure)
