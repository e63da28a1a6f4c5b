"""Perturbation propagation (the paper's Fig. 2–3) against an independent float64 implementation of the
formulas, applied to residual streams and attention captured from Hugging Face transformers
(fp32 eager) on a random tiny GQA model:

    abs[l, j] = ||v_j^(l) - ṽ_j^(l)||_2,  rel = abs / ||v_j^(l)||_2,
    with BOS: positions aligned by dropping the BOS position;
    row entropy = -sum_k A_ik ln A_ik.

Tolerances: sinklab's residual stream matches HF to ~1e-6 of its max (test_parity_tiny); a
change ||v - ṽ|| is compared with an absolute bound of 1e-4 * max|v| (measured: ~1e-5, i.e.
~2e-6 * max|v|), row entropies within 2e-5 nats (measured ~3e-6)."""
import math

import numpy as np
import pytest

from tests.support.reference_models import BOS_ID, SPECS, hf_forward, make_hf_model, require, save_hf

torch = require("torch")

import sinklab as sl  # noqa: E402
from sinklab.analysis.perturbation import (PerturbationResult, PerturbationStudy, perturb,  # noqa: E402
                                  perturbation_study, row_entropy, text_key_entropy)

TEXT = " the cat sat on the mat and the bat ran to the hat"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    hf = make_hf_model(SPECS["gqa_tied"])
    d = save_hf(hf, tmp_path_factory.mktemp("gqa_tied"))
    return hf, sl.load(str(d))


# ------------------------------------------------------------------ independent reference
def ref_change(hf, ids, ids_p, bos):
    """(abs (L+1, T), norm (L+1, T), entropy (L, H, T)) with loops over layers and positions."""
    off = 1 if bos else 0
    seq = ([BOS_ID] if bos else []) + [int(i) for i in ids]
    seq_p = ([BOS_ID] if bos else []) + [int(i) for i in ids_p]
    a = hf_forward(hf, np.asarray(seq, dtype=np.int64))
    b = hf_forward(hf, np.asarray(seq_p, dtype=np.int64))
    L1, T = a["resid"].shape[0], len(ids)
    ab, nm = np.zeros((L1, T)), np.zeros((L1, T))
    for l in range(L1):
        for j in range(T):
            v = a["resid"][l, j + off].astype(np.float64)
            w = b["resid"][l, j + off].astype(np.float64)
            ab[l, j] = math.sqrt(sum((float(x) - float(y)) ** 2 for x, y in zip(v, w)))
            nm[l, j] = math.sqrt(float(np.dot(v, v)))
    att = a["attn"].astype(np.float64)
    return ab, nm, entropy_loops(att, off), float(np.abs(a["resid"]).max())


def entropy_loops(att, off, text_keys=False):
    """(L, H, T) row entropies at text queries (rows off..), term by term in float64; with
    ``text_keys`` only keys 1..i of row i, renormalised by their sum."""
    att = np.asarray(att, dtype=np.float64)
    L, H, Tf = att.shape[:3]
    ent = np.zeros((L, H, Tf - off))
    for l in range(L):
        for h in range(H):
            for j in range(Tf - off):
                row = [float(p) for p in att[l, h, j + off, : j + off + 1]]
                if text_keys:
                    z = sum(row[1:])
                    row = [p / z for p in row[1:]]
                ent[l, h, j] = -sum(p * math.log(p) for p in row if p > 0)
    return ent


@pytest.fixture(scope="module")
def word_result(tiny):
    _, model = tiny
    return perturb(model, TEXT, "cat", "bat", bos="both", progress=False)


@pytest.mark.parametrize("setting", ["bos", "nobos"])
def test_word_perturbation_matches_reference(tiny, word_result, setting):
    hf, model = tiny
    r = word_result
    ids = model.tokenize(TEXT)
    np.testing.assert_array_equal(r.ids, ids)
    assert model.detokenize(r.ids_perturbed) == TEXT.replace("cat", "bat")
    # " cat" -> Ġ c at and " bat" -> Ġ b at: only the middle token differs
    assert r.changed.tolist() == [int(np.nonzero(ids != r.ids_perturbed)[0][0])]
    ab, nm, ent, scale = ref_change(hf, r.ids, r.ids_perturbed, setting == "bos")
    tol = 1e-4 * scale
    assert r.abs_change[setting].shape == ab.shape == (model.config.n_layers + 1, len(ids))
    np.testing.assert_allclose(r.abs_change[setting], ab, rtol=0, atol=tol)
    np.testing.assert_allclose(r.norm[setting], nm, rtol=1e-4)
    big = nm > 0.1 * nm.max()
    np.testing.assert_allclose(r.rel_change[setting][big], (ab / nm)[big], rtol=0, atol=tol / nm[big].min())
    np.testing.assert_allclose(r.entropy[setting], ent, rtol=0, atol=2e-5)
    # causality: positions before the perturbation do not move
    j0 = int(r.changed.min())
    assert np.all(r.abs_change[setting][:, :j0] <= 1e-6 * scale)
    assert np.all(ab[:, :j0] == 0)
    # at the embeddings only the replaced token changes
    assert np.all(r.abs_change[setting][0, r.reach_mask()] == 0)
    assert r.abs_change[setting][0, j0] > 0


def test_summaries_follow_their_definitions(word_result):
    r = word_result
    T = len(r.ids)
    j0 = int(r.changed.min())
    reach = [j for j in range(T) if j > j0 and j not in r.changed.tolist()]
    assert r.reach_mask().tolist() == [j in reach for j in range(T)]
    for s in ("bos", "nobos"):
        rel = r.rel_change[s]
        for l in range(rel.shape[0]):
            want = sum(float(rel[l, j]) for j in reach)
            assert r.spread(s)[l] == pytest.approx(want, rel=1e-12, abs=1e-300)
            assert r.mean_change(s)[l] == pytest.approx(want / len(reach), rel=1e-12, abs=1e-300)
            assert r.spread(s, relative=False)[l] == pytest.approx(sum(float(r.abs_change[s][l, j]) for j in reach), rel=1e-12, abs=1e-300)
        e = r.entropy[s]
        for l in range(e.shape[0]):
            assert r.mean_entropy(s)[l] == pytest.approx(float(np.mean(e[l, :, 1:])), rel=1e-12)
    ratio = r.spread_ratio()
    assert np.isnan(ratio[0])                       # embeddings: no spread either way
    np.testing.assert_allclose(ratio[1:], r.spread("nobos")[1:] / r.spread("bos")[1:], rtol=1e-12)
    s = r.summary()
    assert len(s["spread_ratio_nobos_over_bos_rel"]) == r.n_layers + 1
    assert s["spread_ratio_nobos_over_bos_rel"][0] is None


def test_token_perturbation_and_single_setting(tiny):
    hf, model = tiny
    ids = model.tokenize(TEXT)
    r = perturb(model, ids, position=-2, token=77, bos=False, progress=False)
    assert r.settings == ["nobos"]
    assert r.changed.tolist() == [len(ids) - 2]
    assert r.ids_perturbed[-2] == 77 and r.meta["old_token"] == int(ids[-2])
    p = ids.copy()
    p[-2] = 77
    ab, nm, ent, scale = ref_change(hf, ids, p, False)
    np.testing.assert_allclose(r.abs_change["nobos"], ab, rtol=0,
                               atol=1e-4 * scale)
    with pytest.raises(ValueError, match="both settings"):
        r.spread_ratio()
    # a one-token string is accepted as the replacement
    r2 = perturb(model, TEXT, position=1, token="b", bos=True, progress=False)
    assert r2.ids_perturbed[1] == model.tokenize("b")[0] and r2.settings == ["bos"]


def test_row_entropy_known_values():
    T = 5
    uniform = np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]
    np.testing.assert_allclose(row_entropy(uniform), np.log(np.arange(1, T + 1)), rtol=1e-14)
    onehot = np.zeros((T, T))
    onehot[:, 0] = 1
    assert np.all(row_entropy(onehot) == 0)


def test_token_count_change_is_rejected(tiny):
    _, model = tiny
    n = len(model.tokenize(TEXT))
    # " cat" -> Ġ c at, " dog" -> Ġ d o g: after the shared Ġ, 2 tokens vs 3
    with pytest.raises(ValueError, match=rf"changes the token count.*{n} tokens.*{n + 1}.*is 2 token.*is 3"):
        perturb(model, TEXT, "cat", "dog", progress=False)


@pytest.mark.parametrize("kwargs, match", [
    (dict(old="zebra", new="bat"), "does not occur"),
    (dict(old="cat", new="cat"), "unchanged"),
    (dict(old="cat", new="bat", occurrence=3), "occurs 1 time"),
    (dict(position=99, token=5), "outside the prompt"),
    (dict(position=1, token=10**6), "outside the vocabulary"),
    (dict(position=1, token="hello world"), "not one"),
    (dict(old="cat"), "both old and new"),
    (dict(old="cat", new="bat", position=1, token=3), "not both"),
    (dict(old="cat", new="bat", bos="yes"), "bos must be"),
])
def test_bad_arguments(tiny, kwargs, match):
    _, model = tiny
    with pytest.raises(ValueError, match=match):
        perturb(model, TEXT, progress=False, **kwargs)


def test_prompt_beyond_context_is_rejected(tiny):
    _, model = tiny
    ctx = model.config.context_length
    ids = np.full(ctx, 40, dtype=np.int64)
    with pytest.raises(ValueError, match=rf"{ctx + 1} tokens exceeds the model's context length {ctx}"):
        perturb(model, ids, position=3, token=41, bos="both", progress=False)
    perturb(model, ids[:8], position=3, token=41, bos=False, progress=False)  # fits


def test_save_load_roundtrip(word_result, tmp_path):
    p = tmp_path / "pert.npz"
    word_result.save(str(p))
    r = PerturbationResult.load(str(p))
    assert r.settings == word_result.settings and r.tokens == word_result.tokens
    assert r.meta == word_result.meta
    for s in r.settings:
        np.testing.assert_array_equal(r.abs_change[s], word_result.abs_change[s])
        np.testing.assert_array_equal(r.entropy[s], word_result.entropy[s])
    np.testing.assert_array_equal(r.spread_ratio(), word_result.spread_ratio())
    with np.load(str(p), allow_pickle=False) as z:   # no object arrays
        assert all(z[k].dtype != object for k in z.files)


def test_figures(word_result):
    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure

    from sinklab.viz import figures_mixing as fm

    for fig in (fm.perturbation_heatmaps(word_result), fm.perturbation_heatmaps(word_result, relative=False),
                fm.perturbation_lines(word_result), fm.perturbation_lines([word_result, word_result])):
        assert isinstance(fig, Figure)
        plt.close(fig)


def test_figures_name_tokens_by_their_text(smollm2_gguf):
    """A token perturbation's figure says which tokens changed by their text, and the ⟨bos⟩
    panel names ⟨bos⟩ by its text (SmolLM2's is <|im_start|>), not by ids; a result saved
    before the texts were recorded still draws, with ids."""
    import matplotlib.pyplot as plt

    from sinklab.viz import figures_mixing as fm

    model = sl.load(str(smollm2_gguf), quiet=True)
    text = "The greatest thing about this city is the food."
    j = [model.detokenize([i]) for i in model.tokenize(text)].index(" greatest")
    r = perturb(model, text, position=j, token=" best", progress=False)
    fig = fm.perturbation_heatmaps(r)
    title = fig._suptitle.get_text()
    assert f"' greatest' at position {j} → ' best'" in title and "id" not in title
    assert [a.get_title() for a in fig.axes[:2]] == ["with BOS ('<|im_start|>')", "without BOS"]
    plt.close(fig)
    old = {k: v for k, v in r.meta.items() if k not in ("bos_token", "token_text", "old_token_text")}
    r.meta = old
    fig = fm.perturbation_heatmaps(r)
    assert f"→ id {r.meta['token']}" in fig._suptitle.get_text() and fig.axes[0].get_title().endswith(
        f"(id {model.config.bos_token_id})")
    plt.close(fig)


def test_smollm2_paper_example_errors(smollm2_gguf):
    """The paper's 'greatest' -> 'best' is one token each in SmolLM2; a two-token replacement
    and a prompt beyond the 8192-token context are rejected before any forward pass."""
    model = sl.load(str(smollm2_gguf), quiet=True)
    text = "The greatest thing about this city is the food."
    assert len(model.tokenize(" greatest")) == len(model.tokenize(" best")) == 1
    n = len(model.tokenize(text))
    with pytest.raises(ValueError, match=rf"original prompt has {n} tokens, the perturbed one {n + 1}"):
        perturb(model, text, "greatest", "most wonderful", progress=False)
    long_ids = np.full(model.config.context_length, 260, dtype=np.int64)
    with pytest.raises(ValueError, match="exceeds the model's context length 8192"):
        perturb(model, long_ids, position=5, token=261, bos=True, progress=False)
    r = perturb(model, text, "greatest", "best", bos="both", progress=False)
    assert r.changed.tolist() == [1]
    for s in ("bos", "nobos"):
        assert np.all(np.isfinite(r.abs_change[s])) and np.all(r.abs_change[s][:, :1] == 0)


def test_entropy_from_streaming_stats_equals_full_attention(tiny, monkeypatch):
    """run_resid_entropy uses the C core's streaming stats when present; the full-attention
    fallback gives the same entropies and the same residual stream."""
    import sinklab.model as model_mod
    from sinklab.analysis.perturbation import run_resid_entropy

    _, model = tiny
    ids = model.tokenize(TEXT, bos=True)
    r1, e1, t1 = run_resid_entropy(model, ids, text_keys=True)
    monkeypatch.setattr(model_mod, "CAPTURES", tuple(c for c in model_mod.CAPTURES if c != "stats"))
    r2, e2, t2 = run_resid_entropy(model, ids, text_keys=True)
    np.testing.assert_array_equal(r1, r2)
    np.testing.assert_allclose(e1, e2, rtol=0, atol=1e-5)
    np.testing.assert_array_equal(t1, t2)
    assert run_resid_entropy(model, ids)[2] is None


# ------------------------------------------------------------------ entropy over the same keys
def test_text_key_entropy_matches_float64_loops(tiny, word_result):
    """The BOS run's entropy over text keys only (keys 1..i renormalised) against loops over
    HF's attention (fp32 eager) and over sinklab's own captured attention, in float64."""
    hf, model = tiny
    r = word_result
    assert set(r.entropy_text) == {"bos"}
    seq = np.concatenate([[BOS_ID], r.ids])
    want_hf = entropy_loops(hf_forward(hf, seq)["attn"], 1, text_keys=True)
    got = r.entropy_text["bos"]
    assert got.shape == r.entropy["bos"].shape == want_hf.shape
    np.testing.assert_allclose(got, want_hf, rtol=0, atol=2e-5)
    own = entropy_loops(model.run(seq, capture=("attn",)).attn, 1, text_keys=True)
    np.testing.assert_allclose(got, own, rtol=0, atol=1e-12)
    assert np.all(got[:, :, 0] == 0)            # text query 0 has one text key
    # text keys are what the no-BOS row has: at the embeddings layer the text tokens' queries
    # and keys are identical in both runs (RoPE is relative), so the distributions coincide
    np.testing.assert_allclose(got[0], r.entropy["nobos"][0], rtol=0, atol=2e-5)
    assert not np.allclose(r.entropy["bos"][0], r.entropy["nobos"][0], atol=1e-3)
    assert r.mean_entropy("bos", text_keys=True) == pytest.approx(got[:, :, 1:].mean(axis=(1, 2)), rel=1e-12)
    np.testing.assert_array_equal(r.mean_entropy("nobos", text_keys=True), r.mean_entropy("nobos"))
    s = r.summary()["settings"]
    assert "mean_entropy_text_keys" in s["bos"] and "mean_entropy_text_keys" not in s["nobos"]
    no = perturb(model, TEXT, "cat", "bat", bos="both", text_entropy=False, progress=False)
    assert no.entropy_text == {}
    with pytest.raises(ValueError, match="text-key entropy was not computed"):
        no.mean_entropy("bos", text_keys=True)


def test_text_key_entropy_known_values():
    T = 6
    uniform = np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]
    got = text_key_entropy(uniform)
    assert np.isnan(got[0])                          # no text key
    np.testing.assert_allclose(got[1:], np.log(np.arange(1, T)), rtol=1e-14)
    sink = np.tril(np.full((T, T), 1e-3))
    sink[:, 0] = 0
    sink[np.arange(T), 0] = 1 - 1e-3 * np.arange(T)  # almost all mass on key 0
    np.testing.assert_allclose(text_key_entropy(sink)[1:], np.log(np.arange(1, T)), rtol=1e-12)
    assert np.all(row_entropy(sink)[1:] < 0.05)


# ------------------------------------------------------------------ the study over many swaps
STUDY_TEXTS = [   # the tiny byte-level vocabulary has " the" and " a" as whole-word tokens
    " the cat and the bat saw a rat at the mat, a hat on the bat and a cat",
    " a dog ran to the sea, the sun was up and a man sat on the sand at a tree",
    " so short",
    " the boy had a ball and the girl had a kite; the day was a good one for a walk",
    " at the end of the day a king and the queen sat at a table in the hall",
]
STUDY_KW = dict(n_passages=3, swaps_per_passage=2, T=32, min_after=6, pairs=(("the", "a"),), seed=3)


@pytest.fixture(scope="module")
def study(tiny):
    _, model = tiny
    return perturbation_study(model, STUDY_TEXTS, progress=False, **STUDY_KW)


def quantile_loops(xs, q):
    s = sorted(float(x) for x in xs)
    pos = (len(s) - 1) * q / 100
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def test_study_swaps_are_valid_and_deterministic(tiny, study):
    _, model = tiny
    the, a = int(model.tokenize(" the")[0]), int(model.tokenize(" a")[0])
    T = STUDY_KW["T"]
    assert study.n_swaps == 6 and study.n_passages == 3
    assert study.meta["skipped"] == [{"passage": 2, "reason": f"{len(model.tokenize(STUDY_TEXTS[2]))} tokens < T={T}"}]
    assert study.meta["passage_indices"] == [0, 1, 3]
    assert study.passage.tolist() == [0, 0, 1, 1, 3, 3]
    for r, i in zip(study.results, study.passage):
        np.testing.assert_array_equal(r.ids, model.tokenize(STUDY_TEXTS[i])[:T])
        assert len(r.ids_perturbed) == T and len(r.changed) == 1
        j = int(r.changed[0])
        assert 1 <= j <= T - 1 - STUDY_KW["min_after"]
        assert {int(r.ids[j]), int(r.ids_perturbed[j])} == {the, a}
        assert not model.detokenize([int(r.ids[j + 1])])[:1].isalnum()    # a whole word
        # the swap is a word swap in the text too: re-tokenizing the swapped text changes one token
        re_o = model.tokenize(model.detokenize(r.ids))
        re_p = model.tokenize(model.detokenize(r.ids_perturbed))
        assert len(re_o) == len(re_p) and np.nonzero(re_o != re_p)[0].tolist() == [j]
    positions = [(int(p), int(r.changed[0])) for p, r in zip(study.passage, study.results)]
    assert len(set(positions)) == 6                   # distinct positions within a passage
    again = perturbation_study(model, STUDY_TEXTS, progress=False, **STUDY_KW)
    assert [int(r.changed[0]) for r in again.results] == [j for _, j in positions]
    np.testing.assert_array_equal(again.spread_ratios(), study.spread_ratios())
    with pytest.raises(ValueError, match=r"only 4 of the 5 passages"):
        perturbation_study(model, STUDY_TEXTS, progress=False, **dict(STUDY_KW, n_passages=5))
    with pytest.raises(ValueError, match="no swap pair"):
        perturbation_study(model, STUDY_TEXTS, progress=False, **dict(STUDY_KW, pairs=(("cat", "bat"),)))


def test_study_numbers_match_reference(tiny, study):
    """Per swap: spreads and ratios from HF residual streams (float64 loops), entropies (all
    keys, text keys, no BOS) from HF attention; the statistics over swaps from hand-written
    loops over those reference ratios."""
    hf, model = tiny
    ratios, ents = [], {"bos_all_keys": {}, "bos_text_keys": {}, "nobos": {}}
    for r, p in zip(study.results, study.passage):
        j0 = int(r.changed[0])
        reach = list(range(j0 + 1, len(r.ids)))
        spread = {}
        for s in ("bos", "nobos"):
            ab, nm, ent, scale = ref_change(hf, r.ids, r.ids_perturbed, s == "bos")
            np.testing.assert_allclose(r.abs_change[s], ab, rtol=0, atol=1e-4 * scale)
            spread[s] = [sum(ab[l, j] / nm[l, j] for j in reach) for l in range(ab.shape[0])]
            np.testing.assert_allclose(r.spread(s)[1:], spread[s][1:], rtol=2e-3)
            key = "bos_all_keys" if s == "bos" else "nobos"
            ents[key][int(p)] = [float(np.mean(ent[l, :, 1:])) for l in range(ent.shape[0])]
        seq = np.concatenate([[BOS_ID], r.ids])
        et = entropy_loops(hf_forward(hf, seq)["attn"], 1, text_keys=True)
        ents["bos_text_keys"][int(p)] = [float(np.mean(et[l, :, 1:])) for l in range(et.shape[0])]
        ratios.append([b / a for a, b in zip(spread["bos"][1:], spread["nobos"][1:])])
    ratios = np.asarray(ratios)                      # (S, L) for layers 1..L
    got = study.spread_ratios()
    assert got.shape == (6, model.config.n_layers + 1) and np.all(np.isnan(got[:, 0]))
    np.testing.assert_allclose(got[:, 1:], ratios, rtol=4e-3)
    st = study.ratio_stats()
    S = len(ratios)
    for l in range(1, got.shape[1]):
        col = got[:, l]                              # statistics are checked on the code's ratios
        m = sum(col) / S
        assert st["mean"][l] == pytest.approx(m, rel=1e-12)
        assert st["std"][l] == pytest.approx(math.sqrt(sum((x - m) ** 2 for x in col) / (S - 1)), rel=1e-9)
        for q in (10, 50, 90):
            assert st[f"q{q}"][l] == pytest.approx(quantile_loops(col, q), rel=1e-12)
        assert st["geomean"][l] == pytest.approx(math.exp(sum(math.log(x) for x in col) / S), rel=1e-12)
        assert st["frac_gt1"][l] == sum(x > 1 for x in col) / S
    assert all(np.isnan(v[0]) for v in st.values())
    ent = study.entropies()
    for k in ents:
        want = np.array([ents[k][p] for p in (0, 1, 3)])
        assert ent[k].shape == want.shape
        np.testing.assert_allclose(ent[k], want, rtol=0, atol=2e-5)
        np.testing.assert_allclose(study.mean_entropies()[k], want.mean(axis=0), rtol=0, atol=2e-5)


def test_study_summary_and_save_load(study, tmp_path):
    import json

    s = study.summary()
    json.dumps(s)
    L = study.n_layers
    assert s["n_swaps"] == 6 and s["n_passages"] == 3 and s["T"] == STUDY_KW["T"]
    assert len(s["spread_ratio_rel"]["mean"]) == L + 1 and s["spread_ratio_rel"]["mean"][0] is None
    assert set(s["mean_entropy"]) == {"bos_all_keys", "bos_text_keys", "nobos"}
    assert len(s["mean_entropy"]["nobos"]) == L
    r = study.spread_ratios()[:, 1:]
    assert s["pooled_rel"]["mean"] == pytest.approx(float(r.mean()), rel=1e-12)
    assert s["pooled_rel"]["frac_gt1"] == pytest.approx(float((r > 1).mean()), rel=1e-12)
    d = study.to_dict()
    json.dumps(d)
    assert len(d["swaps"]) == 6 and d["swaps"][0]["passage"] == 0
    p = tmp_path / "study.npz"
    study.save(str(p))
    back = PerturbationStudy.load(str(p))
    assert back.meta == json.loads(json.dumps(study.meta)) and back.n_swaps == 6
    np.testing.assert_array_equal(back.spread_ratios(), study.spread_ratios())
    np.testing.assert_array_equal(back.spread_ratios(False), study.spread_ratios(False))
    for k, v in study.entropies().items():
        np.testing.assert_array_equal(back.entropies()[k], v)
    assert back.results[1].meta == study.results[1].meta
    with np.load(str(p), allow_pickle=False) as z:
        assert all(z[k].dtype != object for k in z.files)


def test_study_defaults_cover_30_swaps_on_10_passages():
    import inspect

    sig = inspect.signature(perturbation_study).parameters
    assert sig["n_passages"].default * sig["swaps_per_passage"].default >= 30
    assert sig["n_passages"].default >= 10 and sig["T"].default == 64


def test_smollm2_study_small(smollm2_gguf):
    """On SmolLM2: every shipped swap pair is one token per word, swaps are valid word swaps, and
    at the embeddings layer the BOS run's text-key entropy equals the no-BOS entropy."""
    from sinklab.analysis.perturbation import SWAP_PAIRS, swap_table

    model = sl.load(str(smollm2_gguf), quiet=True)
    assert len(swap_table(model)) == 2 * len(SWAP_PAIRS)
    st = perturbation_study(model, n_passages=2, swaps_per_passage=2, T=40, progress=False)
    assert st.n_swaps == 4 and st.meta["passage_source"] == "load_passages('sinks')"
    for r in st.results:
        assert len(r.ids) == 40 and len(r.changed) == 1
    e = st.entropies()
    np.testing.assert_allclose(e["bos_text_keys"][:, 0], e["nobos"][:, 0], rtol=0, atol=1e-4)
    assert np.all(np.isfinite(st.spread_ratios()[:, 1:]))
