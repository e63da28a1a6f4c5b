"""The model's windowed attention with kept first tokens (``Model.run(window=w, keep_first=k)``)
and :func:`sinklab.analysis.windowed.windowed_perplexity`, against transformers' fp32 eager
forward of the same SmolLM2 weights given a custom 4-D attention mask built from the definition
(query i sees key j iff j <= i and (j > i - w or j < k))."""
import numpy as np
import pytest

from sinklab.analysis.quality import nll_rows
from sinklab.analysis.windowed import windowed_perplexity
from tests.support import reference_models as rm

T, W = 96, 16


def mask_4d(torch, T, w, k):
    i = np.arange(T)[:, None]
    j = np.arange(T)[None, :]
    ok = (j <= i) & ((j > i - w) | (j < k))
    m = np.where(ok, 0.0, np.finfo(np.float32).min).astype(np.float32)
    return torch.from_numpy(m)[None, None]


def hf_logits(ref_model, ids, w, k):
    torch = rm.require("torch")
    with torch.no_grad():
        out = ref_model(input_ids=torch.from_numpy(np.asarray(ids, np.int64)[None]),
                        attention_mask=mask_4d(torch, len(ids), w, k), use_cache=False)
    return out.logits[0].float().numpy()


@pytest.fixture(scope="module")
def ids(smollm2_model):
    from sinklab.analysis.long_context import long_texts
    return long_texts(smollm2_model, T, 1)[0]


@pytest.mark.parametrize("k", [0, 1, 4])
def test_windowed_logits_match_transformers_masked(smollm2_model, smollm2_reference, ids, k):
    got = smollm2_model.run(ids, capture=("logits",), window=W, keep_first=k, progress=False).logits
    ref = hf_logits(smollm2_reference[0], ids, W, k)
    rm.assert_close(f"logits w={W} k={k}", got, ref)
    nll, nll_ref = nll_rows(got[:-1], ids[1:]), nll_rows(ref[:-1], ids[1:])
    assert np.max(np.abs(nll - nll_ref)) < 1e-3
    if k == 0:  # the window is really in play: full attention gives other logits past w
        full = hf_logits(smollm2_reference[0], ids, T + 1, 0)
        assert np.max(np.abs(full[W:] - ref[W:])) > 1e-2


def test_windowed_perplexity_matches_transformers(smollm2_model, smollm2_reference):
    r = windowed_perplexity(smollm2_model, T=T, windows=(W,), keeps=(0, 2), n_texts=2, n_scored=40, progress=False)
    from sinklab.analysis.long_context import long_texts
    for n, x in enumerate(long_texts(smollm2_model, T, 2)):
        full = hf_logits(smollm2_reference[0], x, T + 1, 0)
        assert r.nll_full[n] == pytest.approx(nll_rows(full[T - 41:T - 1], x[T - 40:]).mean(), abs=1e-4)
        for ki, k in enumerate(r.keeps):
            ref = hf_logits(smollm2_reference[0], x, W, k)
            assert r.nll[n, 0, ki] == pytest.approx(nll_rows(ref[T - 41:T - 1], x[T - 40:]).mean(), abs=1e-4)
    assert r.delta(W, 0).value == pytest.approx(np.mean(r.nll[:, 0, 0] - r.nll_full))


def test_keep_first_bool_and_count_agree(smollm2_model, ids):
    a = smollm2_model.run(ids, capture=("logits",), window=W, keep_first=True, progress=False).logits
    b = smollm2_model.run(ids, capture=("logits",), window=W, keep_first=1, progress=False).logits
    assert np.array_equal(a, b)


@pytest.mark.parametrize("kw, match", [(dict(window=0), "window"), (dict(window=2.5), "window"),
                                       (dict(window=True), "window"), (dict(keep_first=-1), "keep_first"),
                                       (dict(keep_first="4"), "keep_first")])
def test_bad_window_arguments(smollm2_model, ids, kw, match):
    with pytest.raises(ValueError, match=match):
        smollm2_model.run(ids[:8], capture=("logits",), progress=False, **kw)


@pytest.mark.parametrize("kw, match", [(dict(windows=()), "windows"), (dict(keeps=(1, 4)), "keeps"),
                                       (dict(n_scored=0), "n_scored"), (dict(n_texts=1, n_scored=8), "n_texts")])
def test_bad_analysis_arguments(smollm2_model, kw, match):
    with pytest.raises(ValueError, match=match):
        windowed_perplexity(smollm2_model, T=32, progress=False, **kw)


def test_report_section_readings_follow_the_intervals(smollm2_model, monkeypatch):
    from sinklab.analysis.stats import Interval
    from sinklab.report import beyond_windowed as BW

    assert BW.plain_window(Interval(1.0, 0.8, 1.2, 3)) == "explodes"
    assert BW.plain_window(Interval(0.3, 0.1, 0.5, 3)) == "rises"
    assert BW.plain_window(Interval(0.1, -0.1, 0.3, 3)) == "no detectable change"
    assert BW.kept(Interval(0.02, 0.0, 0.05, 3), Interval(1.0, 0.9, 1.1, 3)) == "restores"
    assert BW.kept(Interval(0.2, 0.1, 0.3, 3), Interval(1.0, 0.9, 1.1, 3)) == "helps"
    assert BW.kept(Interval(0.9, 0.8, 1.0, 3), Interval(0.0, -0.1, 0.1, 3)) == "no detectable help"
    assert BW.kept(Interval(1.8, 1.5, 2.1, 3), Interval(-1.2, -1.5, -0.9, 3)) == "hurts"  # Gemma 3 past its window
    monkeypatch.setattr(BW, "settings", lambda quick: {"T": 64, "windows": (8,), "keeps": (0, 1), "n_texts": 2,
                                                       "n_scored": 16})
    res = BW.compute(smollm2_model, True, False)
    md = BW.markdown({"m": res})
    d0 = Interval.from_dict(res["delta"]["8"]["0"])
    assert md.count("**Reading.**") == 1 and f"without kept tokens perplexity {BW.plain_window(d0)}" in md
    assert "first 1 kept (first text token): " in md      # SmolLM2 has no ⟨bos⟩: k = 1 is that token alone
    assert d0.value == pytest.approx(np.mean(np.asarray(res["nll"])[:, 0, 0] - np.asarray(res["nll_full"])))
    assert set(BW.figures({"m": res})) == {"beyond_windowed.png"}


GEMMA_T, GEMMA_W = 640, 128  # past Gemma 3's own 512-key window: its local layers' windows are in play


@pytest.mark.parametrize("k", [0, 4])
def test_gemma3_windowed_past_its_own_window_matches_transformers(gemma3_path, gemma3_model, hf_gguf_reference, k):
    """Gemma 3 (local layers with their own 512-key window, global layers without): the override
    window and the k kept keys apply to both layer types (``Model.run``'s rule), which
    transformers is given as one mask per layer type ({"full_attention", "sliding_attention"})."""
    torch = rm.require("torch")
    from sinklab.analysis.long_context import long_texts

    x = long_texts(gemma3_model, GEMMA_T, 1)[0]
    rows = 48
    got = gemma3_model.run(x, window=GEMMA_W, keep_first=k, logits_from=GEMMA_T - rows, progress=False).logits
    ref_model = hf_gguf_reference(gemma3_path)
    ref_model.config._attn_implementation = "eager"
    mask = mask_4d(torch, GEMMA_T, GEMMA_W, k)
    with torch.no_grad():
        ref = ref_model(input_ids=torch.from_numpy(np.asarray(x, np.int64)[None]), use_cache=False,
                        attention_mask={"full_attention": mask, "sliding_attention": mask}).logits[0, -rows:].float().numpy()
    rm.assert_close(f"gemma-3 logits T={GEMMA_T} w={GEMMA_W} k={k}", got, ref)
    nll, nll_ref = nll_rows(got[:-1], x[-rows + 1:]), nll_rows(ref[:-1], x[-rows + 1:])
    assert np.max(np.abs(nll - nll_ref)) < 1e-3
