"""Sinks across concatenated documents (sinklab.analysis.multidoc): the sequences' layout (the
separator at every later document's start, the documents the tokenizer's passages, position 0 by
the ⟨bos⟩ rule), and every per-head number against brute force on transformers' full attention
matrices (output_attentions, float64 sums over the queries that see each key, the window mask
built here): a tiny Gemma 3 with windows (fp32 weights both sides, 1e-6 relative) and SmolLM2-135M
(all layers at 2e-5: the fp32 accumulation bound measured in test_secondary.py; layer 0 at 3e-6,
not 1e-6: on these multi-document sequences layer 0's a at the separator differs by 1.08e-6 of
its largest value (measured 2026-12-03), the two stacks rounding the Q4_1 file's fp32 products in
different orders before the softmax; 1e-6 is held where both sides compute from the same fp32
weights: the tiny Gemma 3 here and the models of tests/test_secondary.py)."""
import numpy as np
import pytest

from tests.support import reference_models as rm

torch = rm.require("torch")
transformers = rm.require("transformers")

import sinklab as sl  # noqa: E402
from sinklab.analysis import multidoc as M  # noqa: E402
from tests.test_secondary import brute_a, rel_err  # noqa: E402


def brute_numbers(a, starts, separated, min_queries, eps):
    """The module docstring's numbers for one sequence from brute-force a (L, H, T), by masks
    written out here."""
    T = a.shape[-1]
    other = [k for k in range(1, T - min_queries + 1)
             if k not in set(starts) and not (separated and k - 1 in set(starts))]
    return {"a0": a[..., 0], "a_start": np.stack([a[..., s] for s in starts]),
            "a_rest": a[..., other].mean(-1), "rest_rate": (a[..., other] > eps).mean(-1),
            "a_after": np.stack([a[..., s + 1] for s in starts]) if separated else None}


def test_layout(smollm2_model):
    m = smollm2_model
    passages = sl.load_passages("sinks")
    ids, starts, groups = M.document_sequences(m, 3, 20, 2, bos=True, sep_id=7)
    assert ids.shape == (2, 1 + 3 * 20 + 2) and starts.tolist() == [21, 42]
    assert (ids[:, 0] == m.config.bos_token_id).all() and (ids[:, starts] == 7).all()
    for p in range(2):
        docs = [m.tokenize(passages[i])[:20] for i in groups[p]]
        np.testing.assert_array_equal(ids[p], np.concatenate([[m.config.bos_token_id], docs[0], [7], docs[1], [7],
                                                              docs[2]]))
    plain, st2, _ = M.document_sequences(m, 3, 20, 2, bos=False, sep_id=None)
    assert plain.shape == (2, 60) and st2.tolist() == [20, 40]
    with pytest.raises(ValueError, match="n_docs"):
        M.document_sequences(m, 1, 20, 2, True, None)
    with pytest.raises(ValueError, match="passages"):
        M.document_sequences(m, 50, 100, 10, True, None)


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    return rm.FamilyModels(tmp_path_factory.mktemp("multidoc_families"))


def test_document_numbers_tiny_gemma3(families):
    model, hf = families.sl("gemma3"), families.hf("gemma3")
    windows = [model.config.layer_window(l) for l in range(model.config.n_layers)]
    ids = rm.random_ids(model.config.vocab_size, 44, seed=5, bos=False)
    starts = np.array([11, 22, 33])
    ids[starts] = 2
    ref = brute_a(rm.family_forward(hf, ids)["attn"], windows)
    imp = model.run(ids, capture=("stats",), progress=False).stats.importance
    for sep in (True, False):
        got = M.document_importance(imp, windows, starts, sep, 4, 0.05)
        want = brute_numbers(ref, starts.tolist(), sep, 4, 0.05)
        for k, v in want.items():
            if v is None:
                assert np.isnan(got[k]).all()
            elif k == "rest_rate":
                np.testing.assert_allclose(got[k], v, atol=0.1)    # an indicator may flip at 1e-7 from eps
            else:
                assert rel_err(got[k], v) <= 1e-6, k
        mass = ref * rm_visible(ref.shape[-1], windows)
        np.testing.assert_allclose(got["mass_starts"], mass[..., starts].sum(-1) / ids.size, rtol=1e-5)


def rm_visible(T, windows):
    """(L, 1, T) number of queries seeing each key, counted from the mask."""
    i = np.arange(T)
    return np.stack([(((i[:, None] >= i[None, :]) & ((i[:, None] - i[None, :] < w) if w else True)).sum(0))[None]
                     for w in windows])


def test_multidoc_smollm2_against_transformers(smollm2_model, smollm2_reference):
    hf, _ = smollm2_reference
    m = smollm2_model
    r = M.multidoc_sinks(m, n_docs=3, doc_tokens=24, n_prompts=2, min_queries=8, progress=False)
    assert r.bos is False and r.sep_id == m.config.bos_token_id       # SmolLM2's own rule: no ⟨bos⟩ at 0
    for cond in M.CONDITIONS:
        d = r.data[cond]
        ids = d["ids"][1]
        with torch.no_grad():
            out = hf(input_ids=torch.from_numpy(ids)[None], output_attentions=True, use_cache=False)
        ref = brute_a(np.stack([a[0].double().numpy() for a in out.attentions]), [0] * m.config.n_layers)
        want = brute_numbers(ref, d["starts"].tolist(), cond == "separated", 8, r.eps)
        for k in ("a0", "a_start", "a_rest") + (("a_after",) if cond == "separated" else ()):
            assert rel_err(d[k][1][..., 0, :] if d[k].ndim == 4 else d[k][1][0], want[k][..., 0, :] if want[k].ndim == 3
                           else want[k][0]) <= 3e-6, (cond, k, "layer 0")
            assert rel_err(d[k][1], want[k]) <= 2e-5, (cond, k)
    s = r.summary()
    assert s["separated"]["a_after"] is not None and s["concatenated"]["a_after"] is None
    assert 0.0 <= s["separated"]["mass_sinks"]["value"] <= 1.0


def test_save_load_threads_and_bad_inputs(families, tmp_path):
    model = families.sl("gemma3")       # tiny vocabulary: documents from its byte-level tokenizer
    with sl.threads(1):
        r1 = M.multidoc_sinks(model, n_docs=2, doc_tokens=24, n_prompts=2, bos=True, min_queries=4, progress=False)
    with sl.threads(2):
        r2 = M.multidoc_sinks(model, n_docs=2, doc_tokens=24, n_prompts=2, bos=True, min_queries=4, progress=False)
    back = M.MultiDocSinks.load(r1.save(tmp_path / "md"))
    for c in M.CONDITIONS:
        for k, v in r1.data[c].items():
            np.testing.assert_array_equal(v, r2.data[c][k])
            np.testing.assert_array_equal(v, back.data[c][k])
    assert back.sep_token == r1.sep_token and back.windows == r1.windows
    with pytest.raises(ValueError, match="eps"):
        M.multidoc_sinks(model, eps=1.5, progress=False)
    with pytest.raises(ValueError, match="sep_id"):
        M.multidoc_sinks(model, sep_id=10 ** 9, progress=False)
    with pytest.raises(ValueError, match="where"):
        r1.rate("separated", "middle")


def iv(v, lo, hi):
    return {"value": v, "lo": lo, "hi": hi, "n": 8}


def test_report_section_criteria_and_outputs(families, monkeypatch):
    """The section on a tiny model (smaller preset): markdown with one reading per model, a PNG
    figure, and readings that follow the criteria on the intervals, not hand-written verdicts."""
    from sinklab.report import beyond_multidoc as BM
    from sinklab.results import to_jsonable

    monkeypatch.setattr(BM, "settings", lambda quick: {"n_prompts": 3, "n_docs": 3, "doc_tokens": 40})
    res = to_jsonable(BM.compute(families.sl("gemma3"), True, False))
    md = BM.markdown({"tiny": res})
    assert md.count("**Reading.**") == 1 and "| tiny |" in md
    fig = BM.figures({"tiny": res})["beyond_multidoc.png"]
    assert len(fig.axes) >= 1
    sep = dict(res["separated"])
    sep.update(start_over_first=iv(0.6, 0.55, 0.65), start_minus_rest=iv(0.1, 0.09, 0.11))
    assert BM.boundary_kind(sep) == "sink like position 0"
    sep.update(start_over_first=iv(0.6, 0.45, 0.75))
    assert BM.boundary_kind(sep) == "attracts"               # 1/2 inside the interval: not sink-like
    sep.update(start_minus_rest=iv(-0.1, -0.2, -0.01))
    assert BM.boundary_kind(sep) == "repels"
    sep.update(start_minus_rest=iv(0.0, -0.1, 0.1))
    assert BM.boundary_kind(sep) == "like other keys"
    res2 = dict(res, separated=dict(sep, start_over_first=iv(0.6, 0.55, 0.65), start_minus_rest=iv(0.1, 0.09, 0.11)))
    assert "becomes a sink, weaker than position 0" in BM.reading("tiny", res2)
