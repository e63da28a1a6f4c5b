"""Sink metrics over prompt sets (sinklab.analysis.sinkset) and the shipped passages (sinklab.prompts).

Reference: Hugging Face transformers' fp32 eager forward of the real SmolLM2-135M-Instruct GGUF
on the same prompts, tokenized by transformers' own tokenizer and cut by hand; the first-token
importance and sink rate are then computed here in float64 NumPy straight from Gu et al.'s
definition (the sink rate the paper uses for Fig. 5 and Tables 1-2):

    a_0^{(l,h)} = 1/T * sum_{i=0..T-1} A^{(l,h)}_{i,0},   Sink^eps = mean over (prompt, l, h) of 1[a_0 > eps]
"""
import json

import numpy as np
import pytest

from tests.support import reference_models as rm

import sinklab as sl
from sinklab import prompts as sp
from sinklab.analysis import sinkset

BOS = 1
T = 64
N_REF = 3            # prompts compared with the reference
ATOL = 1e-4          # |a_0(sinklab) - a_0(reference)|; attention itself agrees to ~1e-5


@pytest.fixture(scope="module")
def model(smollm2_model):
    return smollm2_model


@pytest.fixture(scope="module")
def reference(smollm2_reference):
    return smollm2_reference


def ref_importance(ref, tok, texts, bos):
    """(P, L, H) float64 a_0 from HF attention, prompts cut to T tokens with the BOS counted."""
    torch = rm.require("torch")
    out = []
    for text in texts:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        seq = ([BOS] + ids[: T - 1]) if bos else ids[:T]
        assert len(seq) == T
        with torch.no_grad():
            att = ref(input_ids=torch.tensor([seq]), output_attentions=True, use_cache=False).attentions
        A = np.stack([a[0].double().numpy() for a in att])          # (L, H, T, T)
        out.append(A[:, :, :, 0].sum(axis=-1) / T)                  # every query i >= 0 sees key 0
    return np.stack(out)


# ------------------------------------------------------------------ the shipped passages
def test_passages_splits():
    all_, sinks, held = sp.load_passages("all"), sp.load_passages("sinks"), sp.load_passages("heldout")
    assert len(all_) >= 100 and len(sinks) + len(held) == len(all_)
    assert len(held) == round(0.2 * len(all_)) and all_[-len(held):] == held
    assert not set(sinks) & set(held), "held-out passages must be disjoint from the sink passages"
    assert len(set(all_)) == len(all_)
    assert all("\n" not in p and p == p.strip() for p in all_)
    with pytest.raises(ValueError, match="unknown split"):
        sp.load_passages("train")


def test_passages_long_enough(model):
    n = [len(model.tokenize(p, bos=False)) for p in sp.load_passages("all")]
    assert min(n) >= 64, min(n)
    assert 120 <= np.median(n) <= 220


# ------------------------------------------------------------------ against the reference
@pytest.mark.parametrize("bos", [True, False], ids=["bos", "nobos"])
def test_sink_study_matches_reference(model, reference, bos):
    ref, tok = reference
    texts = sp.load_passages("sinks")[:N_REF]
    want = ref_importance(ref, tok, texts, bos)
    got = sinkset.sink_study(model, texts, T=T, eps=(0.3, 0.8), bos=bos, progress=False)
    assert got.importance.shape == want.shape == (N_REF, 30, 9)
    assert got.importance.dtype == np.float64
    err = np.abs(got.importance - want).max()
    assert err <= ATOL, f"max |a_0 - reference| = {err:.2e}"
    np.testing.assert_allclose(got.mean, want.mean(axis=0), atol=ATOL)
    np.testing.assert_allclose(got.std, want.std(axis=0), atol=2 * ATOL)
    for eps in (0.3, 0.8):
        near = np.abs(want - eps) <= ATOL                          # indicator may flip there
        agree = (got.importance > eps) == (want > eps)
        assert np.all(agree | near)
        lo, hi = np.mean((want > eps) & ~near), np.mean((want > eps) | near)
        assert lo - 1e-12 <= got.sink_rate(eps) <= hi + 1e-12
        per_layer = (want > eps).mean(axis=(0, 2))
        assert np.abs(got.layer_sink_rate(eps) - per_layer).max() <= near.mean(axis=(0, 2)).max() + 1e-12
    assert got.bos == bos and got.T == T and got.n_prompts == N_REF
    if bos:
        assert got.bos_token_id == BOS and got.bos_token == "<|im_start|>"
        assert np.all(got.first_token_ids == BOS)
    else:
        assert got.bos_token_id is None and got.bos_token is None
        firsts = [tok(t, add_special_tokens=False)["input_ids"][0] for t in texts]
        assert got.first_token_ids.tolist() == firsts


def test_stats_and_full_attention_agree(model):
    texts = sp.load_passages("sinks")[:2]
    a = sinkset.sink_study(model, texts, T=32, capture="stats", progress=False)
    b = sinkset.sink_study(model, texts, T=32, capture="attn", progress=False)
    assert np.abs(a.importance - b.importance).max() <= 1e-5


# ------------------------------------------------------------------ API behaviour
def test_cut_and_bos_in_T(model):
    ids = np.arange(100, 180)
    s = sinkset.sink_study(model, [ids], T=16, bos=True, bos_in_T=False, progress=False)
    assert s.meta["seq_len"] == 17 and s.first_token_ids.tolist() == [BOS]
    s = sinkset.sink_study(model, [ids], T=16, bos=True, progress=False)
    assert s.meta["seq_len"] == 16
    s = sinkset.sink_study(model, [ids], T=16, bos=False, progress=False)
    assert s.meta["seq_len"] == 16 and s.first_token_ids.tolist() == [100]


def test_compare_bos_save_load_and_figure(model, tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    from sinklab.viz.figures_sinks import bos_comparison_figure

    texts = sp.load_passages("sinks")[:3] + ["Too short."]
    cmp = sinkset.compare_bos(model, texts, T=24, skip_short=True, progress=False)
    for s in (cmp.bos, cmp.nobos):
        assert s.n_prompts == 3 and s.n_skipped == 1 and s.importance.shape == (3, 30, 9)
        assert set(s.sink_rates) == {0.3, 0.8}
        for e, r in s.sink_rates.items():    # the fraction of (prompt, layer, head) triples, counted one by one
            n_above = sum(1 for p in range(3) for l in range(30) for h in range(9) if s.importance[p, l, h] > e)
            assert r == n_above / (3 * 30 * 9)
            np.testing.assert_array_equal(s.layer_sink_rate(e), [
                sum(s.importance[p, l, h] > e for p in range(3) for h in range(9)) / 27 for l in range(30)])
    assert cmp.bos.bos and not cmp.nobos.bos and cmp.with_bos is cmp.bos and cmp.without_bos is cmp.nobos
    assert "with BOS" in cmp.table() and "without BOS" in cmp.table()
    s = cmp.bos
    for name in ("s.json", "s.npz"):
        s.save(tmp_path / name)
        back = sinkset.SinkStudy.load(tmp_path / name)
        np.testing.assert_array_equal(back.importance, s.importance)
        assert back.summary() == s.summary() and back.eps == s.eps
    json.loads(s.to_json())
    cmp.save(tmp_path / "cmp.json")
    back = sinkset.BosComparison.load(tmp_path / "cmp.json")
    np.testing.assert_array_equal(back.nobos.importance, cmp.nobos.importance)
    with pytest.raises(ValueError, match="not a saved"):
        sinkset.SinkStudy.load(tmp_path / "cmp.json")
    fig = bos_comparison_figure(cmp, eps=0.3)
    assert isinstance(fig, Figure) and len(fig.axes) >= 6
    fig.savefig(tmp_path / "f.png")
    assert (tmp_path / "f.png").stat().st_size > 10_000


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize("eps", [0.0, 1.0, 1.5, -0.1, (0.3, 1.0)])
def test_bad_eps(model, eps):
    with pytest.raises(ValueError, match="eps"):
        sinkset.sink_study(model, ["x"], eps=eps, progress=False)
    with pytest.raises(ValueError, match="eps"):
        sinkset.compare_bos(model, ["x"], eps=eps, progress=False)


def test_short_prompt_is_named(model):
    texts = sp.load_passages("sinks")[:2] + ["The cat sat on the mat."]
    with pytest.raises(ValueError, match=r"prompt 2 \('The cat sat on the mat.'\) has 7 tokens.*T=64"):
        sinkset.sink_study(model, texts, T=64, progress=False)
    with pytest.raises(ValueError, match="prompt 0"):
        sinkset.compare_bos(model, ["Short."], T=64, progress=False)
    with pytest.raises(ValueError, match="no prompt has"):
        sinkset.sink_study(model, ["Short."], T=64, skip_short=True, progress=False)


def test_T_beyond_context(model):
    ctx = model.config.context_length
    with pytest.raises(ValueError, match="context length"):
        sinkset.sink_study(model, ["x"], T=ctx + 1, progress=False)
    with pytest.raises(ValueError, match="context length"):
        sinkset.sink_study(model, ["x"], T=ctx, bos_in_T=False, progress=False)
    with pytest.raises(ValueError, match="at least 2"):
        sinkset.sink_study(model, ["x"], T=1, progress=False)
    with pytest.raises(ValueError, match="empty"):
        sinkset.sink_study(model, [], progress=False)


# ------------------------------------------------------------------ where the sink sits
@pytest.mark.real
@pytest.mark.parametrize("name", ["smollm2-135m-instruct", "gemma-3-270m", "all-minilm-l6-v2"])
@pytest.mark.parametrize("bos", [True, False], ids=["bos", "nobos"])
def test_where_the_sink_sits_vs_float64_attention(name, bos):
    """keep_keys: every key's mass m_k = 1/T sum_i A_ik (from the C statistics' per-key a_k), its
    argmax and the location fractions, against float64 NumPy on the captured T x T attention
    (for the encoder every query sees every key; for the decoders only the later ones)."""
    from tests.support.model_cache import real_model

    m = real_model(name)
    Tn, texts = 32, sp.load_passages("sinks")[:3]
    st = sinkset.sink_study(m, texts, T=Tn, eps=(0.3, 0.8), bos=bos, keep_keys=True, progress=False)
    ref = []
    for text in texts:
        ids = list(m.tokenize(text, bos=False))
        ids = ([m.config.bos_token_id] if bos else []) + ids
        A = m.run(np.array(ids[:Tn]), capture="attn").attn.astype(np.float64)   # (L, H, Tq, Tk)
        if not m.config.bidirectional:
            assert np.all(np.triu(A, 1) == 0)          # causal: no query sees a later key
        ref.append(A.sum(axis=2) / Tn)                 # (L, H, Tk)
    ref = np.stack(ref)
    assert st.key_mass.shape == ref.shape
    assert np.abs(st.key_mass - ref).max() < 1e-5
    assert np.array_equal(st.key_mass[..., 0], st.importance)      # m_0 = a_0
    top2 = np.sort(ref, axis=-1)[..., -2:]
    clear = top2[..., 1] - top2[..., 0] > 1e-5                     # no near-tie
    assert clear.mean() > 0.9
    pos = ref.argmax(axis=-1)
    assert np.array_equal(st.sink_position()[clear], pos[clear])
    loc = st.location()
    n = pos.size
    assert abs(loc["at_0"] - np.mean(pos == 0)) <= (~clear).sum() / n
    assert abs(loc["elsewhere"] - np.mean(pos > 1)) <= (~clear).sum() / n
    assert loc["at_0"] + loc["at_1"] + loc["elsewhere"] == pytest.approx(1.0)
    assert sum(loc["position_counts"]) == n
    assert loc["mean_max_mass"] == pytest.approx(ref.max(axis=-1).mean(), abs=1e-5)
    for e in (0.3, 0.8):
        assert loc["sink_anywhere"][f"{e:g}"] == pytest.approx(np.mean(ref.max(axis=-1) > e), abs=2.0 / n)
    assert "location" in st.summary()
    with pytest.raises(ValueError, match="keep_keys"):
        sinkset.sink_study(m, texts[:1], T=Tn, bos=bos, progress=False).location()
