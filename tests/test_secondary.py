"""Secondary sinks (sinklab.analysis.secondary): Gu et al.'s a_k for every key, from the C kernel's
streamed statistic, against brute force on transformers' full attention matrices
(output_attentions, fp32 eager, summed in float64 over the queries that see each key, the mask
built here from the causal rule and the window):

- a tiny Gemma 3 (window 10 < T on three of four layers) and a tiny GQA LLaMA, fp32 weights in
  both stacks: every layer within 1e-6 relative (max |diff| / max |ref|);
- SmolLM2-135M (Q4_1 dequantized by transformers) at T = 64: layer 0 within 1e-6; all 30 layers
  within 2e-5, the bound the fp32 accumulation through 30 layers leaves (measured 2026-12-03:
  3.7e-7 at layer 0, at most 5.2e-6 over layers; the parity tests bound attention at 1e-4);
- Gemma-3-270M past its 512-token window (T = 600; slow): within 5e-5 (measured at most 1.1e-5),
  and the C statistic alone (which averages over all later queries) does NOT match there.

Under the packing mask (key_start, keep_first) the conversion is checked against the mask written
out here and the run's own attention capture (transformers has no such mask to compare with).
Plus the token classes on known strings, class shares and the uniform baseline against loops,
the top keys against a brute-force sort, and thread-count independence."""
import numpy as np
import pytest

from tests.support import reference_models as rm

torch = rm.require("torch")
transformers = rm.require("transformers")

import sinklab as sl  # noqa: E402
from sinklab.analysis import secondary as S  # noqa: E402


def brute_a(attn, windows):
    """(L, H, T) float64: mean of A[i, k] over the queries i that see k (i >= k, i - k < w)."""
    A = np.asarray(attn, np.float64)
    T = A.shape[-1]
    i = np.arange(T)
    out = []
    for l in range(A.shape[0]):
        w = windows[l]
        vis = (i[:, None] >= i[None, :]) & ((i[:, None] - i[None, :] < w) if w else True)
        out.append((A[l] * vis).sum(-2) / vis.sum(0))
    return np.stack(out)


def rel_err(got, ref):
    return float(np.abs(np.asarray(got) - ref).max() / np.abs(ref).max())


def sl_a(model, ids):
    c = model.config
    imp = model.run(ids, capture=("stats",), progress=False).stats.importance
    return np.stack([S.column_mean(imp[l], c.layer_window(l)) for l in range(c.n_layers)]), imp


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    return rm.FamilyModels(tmp_path_factory.mktemp("secondary_families"))


@pytest.mark.parametrize("name", ["gemma3", "llama"])
def test_a_k_matches_transformers_tiny(families, name):
    model, hf = families.sl(name), families.hf(name)
    windows = [model.config.layer_window(l) for l in range(model.config.n_layers)]
    T = 40
    ids = rm.random_ids(model.config.vocab_size, T, seed=3, bos=False)
    ref = brute_a(rm.family_forward(hf, ids)["attn"], windows)
    got, imp = sl_a(model, ids)
    assert rel_err(got, ref) <= 1e-6
    if any(windows):                                   # the conversion is needed: C's statistic differs
        l = windows.index(next(w for w in windows if w))
        assert rel_err(imp[l], ref[l]) > 1e-2
    # the column mass sums to T over keys (every query row sums to 1)
    np.testing.assert_allclose(S.column_mass(imp).sum(-1), T, rtol=1e-5)


def test_a_k_matches_transformers_smollm2(smollm2_model, smollm2_reference):
    hf, _ = smollm2_reference
    ids = S.long_sequences(smollm2_model, 64, 1, True)[0]
    with torch.no_grad():
        out = hf(input_ids=torch.from_numpy(ids)[None], output_attentions=True, use_cache=False)
    attn = np.stack([a[0].double().numpy() for a in out.attentions])
    ref = brute_a(attn, [0] * attn.shape[0])
    got, _ = sl_a(smollm2_model, ids)
    assert rel_err(got[0], ref[0]) <= 1e-6
    assert rel_err(got, ref) <= 2e-5


@pytest.mark.slow
def test_a_k_past_the_window_gemma3(gemma3_model, gemma3_path, hf_gguf_reference):
    hf = hf_gguf_reference(gemma3_path)
    m = gemma3_model
    ids = S.long_sequences(m, 600, 1, True)[0]
    with torch.no_grad():
        out = hf(input_ids=torch.from_numpy(ids)[None], output_attentions=True, use_cache=False)
    windows = [m.config.layer_window(l) for l in range(m.config.n_layers)]
    ref = brute_a(np.stack([a[0].double().numpy() for a in out.attentions]), windows)
    got, imp = sl_a(m, ids)
    assert rel_err(got, ref) <= 5e-5
    assert rel_err(imp[0], ref[0]) > 1e-2              # layer 0 slides: C's mean over all later queries differs


def test_token_classes():
    want = {"\n": "newline", ".\n\n": "newline", " ": "whitespace", "  ": "whitespace", ".": "punctuation",
            ",": "punctuation", "?!": "punctuation", ";": "punctuation", " (": "delimiter", ")": "delimiter",
            '"': "delimiter", " —": "delimiter", "'": "delimiter", " the": "other", "x.": "other", "": "other",
            "3": "other"}
    for piece, cls in want.items():
        assert S.TOKEN_CLASSES[S.token_class(piece)] == cls, piece
    assert S.TOKEN_CLASSES[S.token_class(".", first=True)] == "first"


def test_shares_uniform_and_top_keys_by_loops():
    rng = np.random.default_rng(0)
    T, w = 30, 7
    for window in (0, w):
        # uniform attention over each query's visible keys, built as a matrix
        A = np.zeros((T, T))
        for i in range(T):
            lo = max(0, i - window + 1) if window else 0
            A[i, lo:i + 1] = 1.0 / (i + 1 - lo)
        np.testing.assert_allclose(S.uniform_mass(T, window), A.sum(0), rtol=1e-12)
        np.testing.assert_array_equal(S.visible_queries(T, window), (A > 0).sum(0))
    mass = rng.random((2, 3, T))
    classes = rng.integers(0, len(S.TOKEN_CLASSES), T)
    got = S.class_shares(mass, classes)
    for l in range(2):
        for h in range(3):
            tot = sum(mass[l, h, k] for k in range(1, T))
            for c in range(len(S.TOKEN_CLASSES)):
                want = sum(mass[l, h, k] for k in range(1, T) if classes[k] == c) / tot
                assert abs(got[l, h, c] - want) <= 1e-12
    a = rng.random((2, 3, T))
    top = S.top_keys(a, 4, min_queries=5)
    for l in range(2):
        for h in range(3):
            cand = sorted(range(1, T - 5 + 1), key=lambda k: -a[l, h, k])[:4]
            assert top[l, h].tolist() == cand


def test_secondary_sinks_end_to_end_and_threads(families):
    model = families.sl("gemma3")
    seqs = np.stack([rm.random_ids(model.config.vocab_size, 48, seed=s, bos=False) for s in range(3)])
    with sl.threads(1):
        r1 = S.secondary_sinks(model, seqs=seqs, n_top=3, min_queries=8, progress=False)
    with sl.threads(2):
        r2 = S.secondary_sinks(model, seqs=seqs, n_top=3, min_queries=8, progress=False)
    for f in S.FIELDS:
        np.testing.assert_array_equal(getattr(r1, f), getattr(r2, f))
    # shares over the classes present sum to 1; the first share equals a_0 (T - 0) / T = importance[0]
    np.testing.assert_allclose(r1.class_share.sum(-1), 1.0, rtol=1e-12)
    imp = model.run(seqs[0], capture=("stats",), progress=False).stats.importance
    np.testing.assert_allclose(r1.first_share[0], imp[..., 0], rtol=1e-6)
    sm = r1.summary()
    assert set(sm["classes"]) == set(S.TOKEN_CLASSES[1:])
    assert r1.head_top(0, 1, 2)[0]["pos"] == int(r1.top_keys[2, 0, 1, 0])


def test_save_load_and_bad_inputs(families, tmp_path):
    model = families.sl("llama")
    seqs = np.stack([rm.random_ids(model.config.vocab_size, 24, seed=s, bos=False) for s in range(2)])
    r = S.secondary_sinks(model, seqs=seqs, n_top=2, min_queries=4, progress=False)
    back = S.SecondarySinks.load(r.save(tmp_path / "sec"))
    for f in S.FIELDS:
        np.testing.assert_array_equal(getattr(back, f), getattr(r, f))
    assert back.pieces == r.pieces and back.windows == r.windows
    with pytest.raises(ValueError, match="seqs"):
        S.secondary_sinks(model, seqs=np.zeros((2, 3), np.int64), progress=False)
    with pytest.raises(ValueError, match="T must"):
        S.secondary_sinks(model, T=5, progress=False)
    with pytest.raises(ValueError, match="n_prompts"):
        S.secondary_sinks(model, T=64, n_prompts=0, progress=False)
    with pytest.raises(ValueError, match="over"):
        r.enrichment("nothing")
    with pytest.raises(ValueError, match="layer"):
        r.head_top(99, 0)
    with pytest.raises(ValueError):
        S.visible_queries(0)


def test_report_section_criteria_and_outputs(families, monkeypatch):
    """The section on a tiny model (smaller preset): markdown, two figures, and the class
    readings from the enrichment intervals (above 1, below 1, containing 1)."""
    from sinklab.report import beyond_secondary as BS
    from sinklab.results import to_jsonable

    monkeypatch.setattr(BS, "settings", lambda quick: {"n_prompts": 3, "T": 200})
    res = to_jsonable(BS.compute(families.sl("gemma3"), True, False))
    md = BS.markdown({"tiny": res})
    assert md.count("**Reading.**") == 1 and "| tiny | newline |" in md
    assert set(BS.figures({"tiny": res})) == {"beyond_secondary_classes.png", "beyond_secondary_heads.png"}
    cls = {c: dict(v) for c, v in res["classes"].items()}
    cls["newline"]["enrich_pos"] = {"value": 2.0, "lo": 1.5, "hi": 2.5, "n": 3}
    cls["punctuation"]["enrich_pos"] = {"value": 0.5, "lo": 0.4, "hi": 0.6, "n": 3}
    cls["delimiter"]["enrich_pos"] = {"value": 1.1, "lo": 0.8, "hi": 1.4, "n": 3}
    e = BS.enriched(dict(res, classes=cls))
    assert "newline" in e["more"] and "punctuation" in e["less"] and "delimiter" in e["as expected"]
    assert "newline ×2.00 [1.50, 2.50]" in BS.reading("tiny", dict(res, classes=cls))


def test_a_k_under_the_packing_mask(families):
    """key_start (intra-document masking) with and without keep_first on the tiny Gemma 3 (windows
    too): a_k from the C importance equals the column sums of the run's attention over the
    queries that the mask, written out here, lets see k."""
    model = families.sl("gemma3")
    T = 36
    ids = rm.random_ids(model.config.vocab_size, T, seed=7, bos=False)
    ks = np.repeat([0, 9, 20, 27], [9, 11, 7, 9])
    i = np.arange(T)
    for keep in (False, True):
        tr = model.run(ids, capture=("stats", "attn"), key_start=ks, keep_first=keep, progress=False)
        for l in range(model.config.n_layers):
            w = model.config.layer_window(l)
            vis = (i[:, None] >= i[None, :]) & (ks[:, None] <= i[None, :])
            if w:
                vis &= i[:, None] - i[None, :] < w
            if keep:
                vis[:, 0] = True            # a fixed ⟨bos⟩: every query reads key 0, window or not
            np.testing.assert_array_equal(S.visible_queries(T, w, key_start=ks, keep_first=keep), vis.sum(0))
            want = (tr.attn[l].astype(np.float64) * vis).sum(-2) / vis.sum(0)
            got = S.column_mean(tr.stats.importance[l], w, key_start=ks, keep_first=keep)
            assert rel_err(got, want) <= 1e-6, (keep, l)
    with pytest.raises(ValueError, match="key_start"):
        S.visible_queries(4, key_start=[0, 2, 1, 3])
