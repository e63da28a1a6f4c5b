"""Perturbation propagation (PAPER.md §4) against an independent float64 implementation of the
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

from reference_models import BOS_ID, SPECS, hf_forward, make_hf_model, require, save_hf

torch = require("torch")

import sinklab as sl  # noqa: E402
from sinklab.perturbation import PerturbationResult, perturb, row_entropy  # noqa: E402

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
    L, H = att.shape[:2]
    ent = np.zeros((L, H, T))
    for l in range(L):
        for h in range(H):
            for j in range(T):
                row = att[l, h, j + off]
                ent[l, h, j] = -sum(p * math.log(p) for p in row if p > 0)
    return ab, nm, ent, float(np.abs(a["resid"]).max())


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

    from sinklab import figures_mixing as fm

    for fig in (fm.perturbation_heatmaps(word_result), fm.perturbation_heatmaps(word_result, relative=False),
                fm.perturbation_lines(word_result), fm.perturbation_lines([word_result, word_result])):
        assert isinstance(fig, Figure)
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
    from sinklab.perturbation import run_resid_entropy

    _, model = tiny
    ids = model.tokenize(TEXT, bos=True)
    r1, e1 = run_resid_entropy(model, ids)
    monkeypatch.setattr(model_mod, "CAPTURES", tuple(c for c in model_mod.CAPTURES if c != "stats"))
    r2, e2 = run_resid_entropy(model, ids)
    np.testing.assert_array_equal(r1, r2)
    np.testing.assert_allclose(e1, e2, rtol=0, atol=1e-5)
