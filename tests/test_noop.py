"""No-op analysis (the paper's §3.2–3.3) against Hugging Face transformers (fp32 eager) with forward hooks:
the input of v_proj is exactly the attention input x_j = RMSNorm(v_j) * w of every token and the
input of o_proj is the concatenation of the per-head outputs sum_k A_ik W_V^h x_k, so

    value norm   ||W_V^g x_j||      = ||v_proj.weight[g*hd:(g+1)*hd] @ v_in_j||
    head output  ||W_O^h z_i^h||    = ||o_proj.weight[:, h*hd:(h+1)*hd] @ o_in_i[h*hd:(h+1)*hd]||

computed here in float64 from HF's weights and activations; sinklab reads the same quantities
from its forward's captures (Trace.v, Trace.head_out), so the two sides share nothing. Statistics (sink mass, correlations, value-norm ratio, conditional-head scores) are
checked against loops over the definitions applied to HF's attention."""
import math

import numpy as np
import pytest

from tests.support import reference_models as rm
from tests.support.reference_models import BOS_ID, SPECS, make_hf_model, random_ids, require, save_hf

torch = require("torch")
transformers = require("transformers")

import sinklab as sl  # noqa: E402
from sinklab.analysis.noop import (ConditionalHeads, NoopResult, find_conditional_heads,  # noqa: E402
                          head_output_norms, noop_analysis, value_norms)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    hf = make_hf_model(SPECS["gqa_tied"])
    d = save_hf(hf, tmp_path_factory.mktemp("gqa_tied"))
    return hf, sl.load(str(d))


def hf_hooked(hf, ids):
    """Per layer: v_proj input (T, d), o_proj input (T, H*hd), attention (H, T, T); float64."""
    v_in, o_in, hooks = {}, {}, []
    for l, layer in enumerate(hf.model.layers):
        att = layer.self_attn
        hooks.append(att.v_proj.register_forward_pre_hook(lambda m, a, l=l: v_in.__setitem__(l, a[0][0])))
        hooks.append(att.o_proj.register_forward_pre_hook(lambda m, a, l=l: o_in.__setitem__(l, a[0][0])))
    try:
        with torch.no_grad():
            out = hf(input_ids=torch.from_numpy(np.asarray(ids, dtype=np.int64))[None], output_attentions=True,
                     use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    L = len(hf.model.layers)
    return ([v_in[l].double().numpy() for l in range(L)], [o_in[l].double().numpy() for l in range(L)],
            [a[0].double().numpy() for a in out.attentions])


def ref_norms(hf, ids):
    """(value norms (L, H, T), head-output norms (L, H, T), attention (L, H, T, T)) from HF."""
    cfg = hf.config
    H, G = cfg.num_attention_heads, cfg.num_key_value_heads
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // H
    v_in, o_in, attn = hf_hooked(hf, ids)
    T = len(ids)
    vn, on = np.zeros((len(v_in), H, T)), np.zeros((len(v_in), H, T))
    for l, layer in enumerate(hf.model.layers):
        Wv = layer.self_attn.v_proj.weight.detach().double().numpy()
        Wo = layer.self_attn.o_proj.weight.detach().double().numpy()
        for h in range(H):
            g = h // (H // G)
            for j in range(T):
                vn[l, h, j] = np.linalg.norm(Wv[g * hd:(g + 1) * hd] @ v_in[l][j])
                on[l, h, j] = np.linalg.norm(Wo[:, h * hd:(h + 1) * hd] @ o_in[l][j, h * hd:(h + 1) * hd])
    return vn, on, np.stack(attn)


def pearson_loops(x, y):
    n = len(x)
    mx, my = sum(x) / n, sum(y) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
    sxx = sum((a - mx) ** 2 for a in x)
    syy = sum((b - my) ** 2 for b in y)
    return sxy / math.sqrt(sxx * syy)


def median_loops(x):
    s = sorted(float(v) for v in x)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def test_value_and_head_output_norms_match_hooked_hf(tiny):
    hf, model = tiny
    ids = random_ids(hf.config.vocab_size, 20, seed=7)
    vn_ref, on_ref, _ = ref_norms(hf, ids)
    tr = model.run(ids, capture=("v", "head_out"))
    vn = value_norms(model, tr.v)
    on = head_output_norms(model, tr.head_out)
    assert vn.shape == on.shape == (4, 6, 20)
    for l in range(vn.shape[0]):
        np.testing.assert_allclose(vn[l], vn_ref[l], rtol=0, atol=1e-5 * vn_ref[l].max())
        np.testing.assert_allclose(on[l], on_ref[l], rtol=0, atol=1e-5 * on_ref[l].max())
    # heads sharing a kv head see the same values
    np.testing.assert_array_equal(vn[:, 0], vn[:, 2])
    with pytest.raises(ValueError, match="v must have shape"):
        value_norms(model, tr.v[:-1])
    with pytest.raises(ValueError, match="head_out must have shape"):
        head_output_norms(model, tr.head_out[:2])


@pytest.fixture(scope="module")
def noop_res(tiny):
    hf, model = tiny
    texts = [random_ids(hf.config.vocab_size, T, seed=T, bos=False) for T in (12, 17)]
    return texts, noop_analysis(model, texts, bos=True, progress=False)


def test_noop_statistics_match_definitions(tiny, noop_res):
    hf, model = tiny
    texts, r = noop_res
    refs = [ref_norms(hf, np.concatenate([[BOS_ID], t])) for t in texts]
    L, H = 4, 6
    for p, (vn, on, attn) in enumerate(refs):
        np.testing.assert_array_equal(r.ids[p], np.concatenate([[BOS_ID], texts[p]]))
        np.testing.assert_allclose(r.to_first[p], attn[..., :, 0], rtol=0, atol=1e-5)
        np.testing.assert_allclose(r.out_norm[p], on, rtol=0, atol=1e-5 * on.max())
    mass, corr, ratio = r.sink_mass(), r.correlation(), r.first_value_ratio()
    spear = r.correlation("spearman")
    for l in range(L):
        for h in range(H):
            f = [float(a[l, h, i, 0]) for (_, _, a) in refs for i in range(1, a.shape[-1])]
            o = [float(on[l, h, i]) for (_, on, a) in refs for i in range(1, a.shape[-1])]
            assert mass[l, h] == pytest.approx(sum(f) / len(f), abs=1e-5)
            assert corr[l, h] == pytest.approx(pearson_loops(f, o), abs=5e-5)
            rk = lambda xs: [sorted(xs).index(x) for x in xs]  # noqa: E731 (no ties in float data)
            assert spear[l, h] == pytest.approx(pearson_loops(rk(f), rk(o)), abs=1e-9)
            rat = [vn[l, h, 0] / median_loops(vn[l, h, 1:]) for (vn, _, _) in refs]
            assert ratio[l, h] == pytest.approx(sum(rat) / len(rat), rel=1e-4)
    s = r.summary(eps=0.3)
    assert s["n_heads"] == L * H and s["n_sink_heads"] == int((mass > 0.3).sum())
    assert len(s["per_head"]["sink_mass"]) == L


def test_value_ratios_grouped_by_kv_head(tiny, noop_res):
    """GQA (6 query heads, 2 kv heads): value-norm ratios per kv head from HF's v_proj (each
    value head once), sink kv heads by the majority / any / all of their query heads, and the
    summary's medians over those groups, from loops over the definitions."""
    hf, model = tiny
    texts, r = noop_res
    cfg = hf.config
    H, G = cfg.num_attention_heads, cfg.num_key_value_heads
    hd = cfg.hidden_size // H
    rep = H // G
    assert (H, G) == (6, 2) and r.n_kv_heads == G and r.meta["n_heads"] == H
    kv_ratio = np.zeros((4, G))
    masses = []
    for t in texts:
        ids = np.concatenate([[BOS_ID], t])
        v_in, _, attn = hf_hooked(hf, ids)
        masses.append([[[float(a[h, i, 0]) for i in range(1, len(ids))] for h in range(H)] for a in attn])
        for l, layer in enumerate(hf.model.layers):
            Wv = layer.self_attn.v_proj.weight.detach().double().numpy()
            for g in range(G):
                vn = [float(np.linalg.norm(Wv[g * hd:(g + 1) * hd] @ v_in[l][j])) for j in range(len(ids))]
                kv_ratio[l, g] += vn[0] / median_loops(vn[1:]) / len(texts)
    got = r.kv_first_value_ratio()
    assert got.shape == (4, G)
    np.testing.assert_allclose(got, kv_ratio, rtol=1e-4)
    # the per-query-head ratio repeats its kv head's value
    np.testing.assert_array_equal(r.first_value_ratio(), np.repeat(got, rep, axis=1))
    assert r.first_value_is_smallest().shape == (4, G)
    mass = np.array([[sum(sum(m[l][h]) for m in masses) / sum(len(m[l][h]) for m in masses) for h in range(H)]
                     for l in range(4)])
    eps = float(np.median(mass))                     # both groups non-empty
    for rule in ("majority", "any", "all"):
        want = np.zeros((4, G), dtype=bool)
        for l in range(4):
            for g in range(G):
                n = sum(mass[l, h] > eps for h in range(g * rep, (g + 1) * rep))
                want[l, g] = {"majority": n >= 2, "any": n >= 1, "all": n == 3}[rule]
        np.testing.assert_array_equal(r.kv_sink_heads(eps, rule), want)
        s = r.summary(eps=eps, kv_rule=rule)
        grp = s["kv_groups"][rule]
        assert s["n_kv_heads"] == 4 * G and s["kv_rule"] == rule
        assert s["n_sink_kv_heads"] == grp["n_sink_kv_heads"] == int(want.sum())
        assert s["n_other_kv_heads"] == int((~want).sum())
        if want.any():
            assert s["median_first_value_ratio_sink_kv_heads"] == pytest.approx(
                median_loops(kv_ratio[want]), rel=1e-4)
        if (~want).any():
            assert s["median_first_value_ratio_other_kv_heads"] == pytest.approx(
                median_loops(kv_ratio[~want]), rel=1e-4)
    assert r.summary(eps)["kv_rule"] == "majority"
    assert 0 < r.summary(eps)["n_sink_kv_heads"] < 4 * G
    with pytest.raises(ValueError, match="rule must be"):
        r.kv_sink_heads(eps, "most")


def test_noop_save_load_and_figure(noop_res, tmp_path):
    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure

    from sinklab.viz.figures_mixing import noop_figure

    _, r = noop_res
    p = tmp_path / "noop.npz"
    r.save(str(p))
    b = NoopResult.load(str(p))
    assert b.meta == r.meta and len(b.ids) == 2
    for x, y in zip(b.out_norm, r.out_norm):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(b.correlation(), r.correlation())
    fig = noop_figure(r, eps=0.3)
    assert isinstance(fig, Figure)
    plt.close(fig)


WITH = [" the cat's hat sat on the mat", " a rat's tail and the bat ran"]
WITHOUT = [" the cat hat sat on the mat", " a rat tail and the bat ran", " then the cat ran"]


def ref_conditional(hf, model, with_texts, without_texts, trig, window=None):
    """(to_trigger_with, to_first_without, to_prev_without) (L, H) from HF attention, loops over
    the definitions."""
    tw, fw, pw = [], [], []
    for t in with_texts:
        ids = [BOS_ID] + model.tokenize(t).tolist()
        _, _, attn = hf_hooked(hf, ids)
        A = np.stack(attn)
        starts = [i for i in range(len(ids) - len(trig) + 1) if ids[i:i + len(trig)] == trig]
        vals = np.zeros(A.shape[:2])
        n = 0
        for s0 in starts:
            end = len(ids) if window is None else min(len(ids), s0 + len(trig) + window)
            for i in range(s0 + len(trig), end):
                vals += sum(A[:, :, i, k] for k in range(s0, s0 + len(trig)))
                n += 1
        tw.append(vals / n)
    for t in without_texts:
        ids = [BOS_ID] + model.tokenize(t).tolist()
        A = np.stack(hf_hooked(hf, ids)[2])
        fw.append(sum(A[:, :, i, 0] for i in range(1, len(ids))) / (len(ids) - 1))
        pw.append(sum(A[:, :, i, i - 1] for i in range(2, len(ids))) / (len(ids) - 2))
    return np.mean(tw, axis=0), np.mean(fw, axis=0), np.mean(pw, axis=0)


@pytest.mark.parametrize("window", [None, 2])
def test_conditional_heads_match_reference(tiny, window, tmp_path):
    hf, model = tiny
    trig = model.tokenize("'s").tolist()
    assert len(trig) == 2                              # "'" and "s": a two-token trigger
    res = find_conditional_heads(model, WITH, WITHOUT, trigger="'s", top=5, window=window, progress=False)
    tw, fw, pw = ref_conditional(hf, model, WITH, WITHOUT, trig, window)
    np.testing.assert_allclose(res.to_trigger_with, tw, rtol=0, atol=1e-5)
    np.testing.assert_allclose(res.to_first_without, fw, rtol=0, atol=1e-5)
    np.testing.assert_allclose(res.to_prev_without, pw, rtol=0, atol=1e-5)
    score = tw * fw
    want = sorted(((float(score[l, h]), l, h) for l in range(score.shape[0]) for h in range(score.shape[1])),
                  reverse=True)[:5]
    got = res.top
    assert len(got) == 5
    for g, (sc, l, h) in zip(got, want):
        assert g["score"] == pytest.approx(sc, abs=1e-5)
    assert [g["score"] for g in got] == sorted([g["score"] for g in got], reverse=True)
    assert "layer" in res.table()
    p = tmp_path / "cond.npz"
    res.save(str(p))
    back = ConditionalHeads.load(str(p))
    assert back.top == res.top and back.trigger == "'s"


def test_conditional_heads_bad_input(tiny):
    _, model = tiny
    with pytest.raises(ValueError, match="does not occur"):
        find_conditional_heads(model, [" no trigger here"], WITHOUT, trigger="'s", progress=False)
    with pytest.raises(ValueError, match="occurs in the trigger-free"):
        find_conditional_heads(model, WITH, WITH, trigger="'s", progress=False)
    with pytest.raises(ValueError, match="no query comes after"):
        find_conditional_heads(model, [" the cat's"], WITHOUT, trigger="'s", progress=False)
    ctx = model.config.context_length
    with pytest.raises(ValueError, match="context length"):
        noop_analysis(model, [np.full(ctx, 40)], bos=True, progress=False)


def test_smollm2_norms_match_hooked_hf(smollm2_gguf):
    """The real GGUF (Q4_1): value and head-output norms from sinklab's captures agree with
    HF's hooked activations."""
    path = smollm2_gguf
    hf = rm.hf_gguf_reference(str(path))[0]
    model = sl.load(str(path), quiet=True)
    text = "My sister's new job starts next week in the city centre."
    ids = model.tokenize(text, bos=True)
    vn_ref, on_ref, attn = ref_norms(hf, ids)
    tr = model.run(ids, capture=("v", "head_out"))
    vn, on = value_norms(model, tr.v), head_output_norms(model, tr.head_out)
    for l in range(vn.shape[0]):
        np.testing.assert_allclose(vn[l], vn_ref[l], rtol=0, atol=1e-4 * vn_ref[l].max())
        np.testing.assert_allclose(on[l], on_ref[l], rtol=0, atol=1e-4 * on_ref[l].max())
    res = find_conditional_heads(model, [text], ["My sister starts a new job next week in the city centre."],
                                 trigger="'s", progress=False)
    t = int(np.nonzero(ids == model.tokenize("'s")[0])[0][0])
    np.testing.assert_allclose(res.to_trigger_with, attn[:, :, t + 1:, t].mean(-1), rtol=0, atol=1e-4)
