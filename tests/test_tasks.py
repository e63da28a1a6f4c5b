"""Multi-key retrieval and cloze (sinklab.analysis.tasks): prompt and item construction, the
candidates' log-likelihoods against Hugging Face transformers (fp32 eager, log-softmax in
float64) on a tiny random LLaMA, chance accuracy on that random model, result objects, the
figure, and bad inputs."""
import json
import re

import numpy as np
import pytest

from tests.support import reference_models as rm

import sinklab as sl
from sinklab.analysis import quality as q
from sinklab.analysis import stats
from sinklab.analysis import tasks as T

SPEC = rm.TinySpec("tasks", d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, d_ff=128,
                   context_length=2048, seed=11)
LP_ATOL = 1e-4     # nats, on summed candidate log-likelihoods


@pytest.fixture(scope="module")
def hf():
    return rm.make_hf_model(SPEC)


@pytest.fixture(scope="module")
def tiny(hf, tmp_path_factory):
    path = rm.save_hf(hf, tmp_path_factory.mktemp("tasks") / "tiny")
    return sl.load(str(path), quiet=True)


def hf_logprobs(hf, seq):
    """(T, V) float64 log-softmax of HF's fp32 logits for one sequence."""
    torch = rm.require("torch")
    with torch.no_grad():
        z = hf(input_ids=torch.tensor([list(map(int, seq))]), use_cache=False).logits[0].double()
    return torch.log_softmax(z, dim=-1).numpy()


def ref_candidate_lp(hf, prefix, cand, upto=None):
    """Summed log-likelihood of cand[:upto] after prefix (prefix includes any BOS)."""
    seq = np.concatenate([prefix, cand]).astype(np.int64)
    lp = hf_logprobs(hf, seq)
    n = len(cand) if upto is None else upto
    return float(sum(lp[len(prefix) - 1 + j, int(cand[j])] for j in range(n)))


def filler_tol(model):
    return max(len(model.tokenize(" " + s, bos=False)) for s in q.FILLER) + 1


# ------------------------------------------------------------------ retrieval prompts
@pytest.mark.parametrize("length,n_keys", [(320, 2), (500, 4), (800, 6)])
def test_multikey_prompt_properties(tiny, length, n_keys):
    for t in range(4):
        p = T.make_multikey_prompt(tiny, length, n_keys, seed=[3, length, t])
        asked, value = p.names[p.target], p.values[p.target]
        # every key sentence is in the haystack exactly once; the asked value appears once
        for name, v in zip(p.names, p.values):
            assert p.text.count(T.MK_NEEDLE.format(name=name, value=v)) == 1
            assert p.text.count(v) == 1
        assert len(set(p.names)) == n_keys and len(set(p.values)) == n_keys
        assert len({v[0] for v in p.values}) == n_keys            # distinct leading digits
        assert p.text.endswith(f"What is the pass code for {asked}? The pass code for {asked} is")
        # near duplicates: every other name shares the asked first or last name
        f0, l0 = asked.split()
        assert all(n.split()[0] == f0 or n.split()[1] == l0 for n in p.names)
        # candidates are the K values' tokens after the cue; the answer is the asked one
        for v, c in zip(p.values, p.candidates):
            assert tiny.detokenize(c) == " " + v
        assert np.array_equal(p.answer, p.candidates[p.target])
        assert length - filler_tol(tiny) <= p.n_tokens <= length
        assert np.array_equal(p.ids, tiny.tokenize(p.text, bos=False))
        assert p.depths == sorted(p.depths) and all(0 <= d <= 1 for d in p.depths)


def test_multikey_prompt_deterministic_and_bos_alignment(tiny):
    a = T.make_multikey_prompt(tiny, 420, 4, seed=[0, 420, 1])
    b = T.make_multikey_prompt(tiny, 420, 4, seed=[0, 420, 1])
    c = T.make_multikey_prompt(tiny, 420, 4, seed=[0, 420, 2])
    assert np.array_equal(a.ids, b.ids) and a.names == b.names and a.values == b.values
    assert a.text != c.text
    with_bos, without = a.sequence(tiny.bos_id(True)), a.sequence(None)
    assert with_bos[0] == tiny.config.bos_token_id and np.array_equal(with_bos[1:], without)
    # the asked key is uniform over positions: over many seeds every index is asked
    targets = {T.make_multikey_prompt(tiny, 380, 3, seed=[9, s]).target for s in range(30)}
    assert targets == {0, 1, 2}


def test_multikey_prompt_passages_filler(tiny):
    p = T.make_multikey_prompt(tiny, 900, 5, seed=1, filler="passages", near_duplicates=False)
    assert "The grass is green." not in p.text
    assert len({n.split()[0] for n in p.names}) == 5      # no shared first names without near duplicates
    longest = max(len(tiny.tokenize(" " + s, bos=False)) for s in
                  re.split(r"(?<=[.!?])\s+", " ".join(sl.prompts.load_passages("sinks"))))
    assert 900 - longest - 1 <= p.n_tokens <= 900


# ------------------------------------------------------------------ retrieval scoring vs HF
@pytest.mark.parametrize("score", ["first", "sum"])
@pytest.mark.parametrize("bos", [True, False], ids=["bos", "nobos"])
def test_retrieval_scores_match_reference(tiny, hf, score, bos):
    n, trials = 380, 3
    r = T.multikey_retrieval(tiny, lengths=(n,), trials=trials, n_keys=3, bos=bos, seed=5,
                             score=score, progress=False)
    bos_id = tiny.bos_id(bos)
    for t in range(trials):
        p = T.make_multikey_prompt(tiny, n, 3, seed=[5, n, t])
        prefix = p.sequence(bos_id)[: len(p.sequence(bos_id)) - len(p.answer)]
        upto = T._divergence(p.candidates) + 1 if score == "first" else None
        want = [ref_candidate_lp(hf, prefix, c, upto) for c in p.candidates]
        np.testing.assert_allclose(r.scores[t], want, rtol=0, atol=LP_ATOL)
        assert r.target[t] == p.target and r.names[t] == p.names
        # exact: HF's argmax at every answer position
        lp = hf_logprobs(hf, p.sequence(bos_id))
        rows = lp[len(prefix) - 1: len(prefix) - 1 + len(p.answer)]
        assert r.exact[t] == bool(np.array_equal(rows.argmax(-1), p.answer))
    assert np.array_equal(r.correct, r.margin > 0)
    assert r.n_tokens.tolist() == [T.make_multikey_prompt(tiny, n, 3, seed=[5, n, t]).n_tokens
                                   - (0 if bos else 1) for t in range(trials)]


def test_retrieval_same_items_with_and_without_bos(tiny):
    a = T.multikey_retrieval(tiny, lengths=(360, 420), trials=4, n_keys=3, bos=True, progress=False)
    b = T.multikey_retrieval(tiny, lengths=(360, 420), trials=4, n_keys=3, bos=False, progress=False)
    assert a.same_items(b) and a.names == b.names and a.values == b.values
    assert np.array_equal(a.n_tokens, b.n_tokens + 1)
    d = T.compare(a, b, length=360)
    assert d.n == 4 and d.method == "bootstrap"
    want = stats.paired_difference(a.correct_at(360).astype(float), b.correct_at(360).astype(float))
    assert d == want


def test_retrieval_intervention_is_applied(tiny):
    """mask_first on every head equals running without the first token (RoPE is shift-invariant):
    BOS + mask scores like no BOS, and unlike BOS alone."""
    kw = dict(lengths=(380,), trials=3, n_keys=3, progress=False)
    masked = T.multikey_retrieval(tiny, bos=True, intervene=sl.Intervention(mask_first=True), **kw)
    plain = T.multikey_retrieval(tiny, bos=True, **kw)
    nobos = T.multikey_retrieval(tiny, bos=False, **kw)
    np.testing.assert_allclose(masked.scores, nobos.scores, rtol=0, atol=1e-3)
    assert np.abs(masked.scores - plain.scores).max() > 1e-3
    assert masked.intervention and "mask_first" in masked.intervention and plain.intervention is None


def test_retrieval_chance_on_random_model(tiny):
    r = T.multikey_retrieval(tiny, lengths=(400,), trials=240, n_keys=4, progress=False)
    iv = stats.wilson(int(r.correct.sum()), len(r.correct), level=0.99)
    assert iv.lo <= 0.25 <= iv.hi, iv
    assert r.accuracy(400).n == 240 and r.chance == 0.25


def test_retrieval_result_roundtrip_and_repr(tiny):
    r = T.multikey_retrieval(tiny, lengths=(320, 360), trials=3, n_keys=2, progress=False)
    d = json.loads(json.dumps(r.to_dict()))
    assert d["format"] == T.RETRIEVAL_FORMAT
    back = T.RetrievalResult.from_dict(d)
    assert back.same_items(r)
    for k in ("length", "n_tokens", "correct", "exact", "target", "chosen", "scores", "margin"):
        np.testing.assert_array_equal(getattr(back, k), getattr(r, k))
    assert back.seconds.keys() == r.seconds.keys() and back.lengths == [320, 360]
    assert back.accuracy(320) == r.accuracy(320) == stats.wilson(int(r.correct[:3].sum()), 3)
    s = repr(r)
    assert "RetrievalResult(" in s and "320:" in s and "360:" in s and "2 keys" in s and len(s) < 300
    assert "| 320 | 3 |" in r.table()
    with pytest.raises(ValueError, match="no trials at length 999"):
        r.accuracy(999)


# ------------------------------------------------------------------ cloze
CLOZE_KW = dict(min_context=40, max_context=120)
ANY = dict(CLOZE_KW, max_word_tokens=None)   # the tiny byte-level vocabulary has few one-token words


def test_cloze_items_properties(tiny):
    items = T.make_cloze_items(tiny, 60, 4, seed=2, max_word_tokens=None, **CLOZE_KW)
    again = T.make_cloze_items(tiny, 60, 4, seed=2, max_word_tokens=None, **CLOZE_KW)
    other = T.make_cloze_items(tiny, 60, 4, seed=3, max_word_tokens=None, **CLOZE_KW)
    texts = sl.prompts.load_passages("heldout")
    assert [(i.passage, i.cut, i.words, i.target) for i in items] == \
        [(i.passage, i.cut, i.words, i.target) for i in again]
    assert [(i.passage, i.cut) for i in items] != [(i.passage, i.cut) for i in other]
    assert len({i.passage for i in items}) == len(texts)      # spread over every passage
    n_same = 0
    for it in items:
        ids = tiny.tokenize(texts[it.passage], bos=False)
        assert 40 <= it.cut <= 120 and np.array_equal(it.context, ids[: it.cut])
        true = it.candidates[it.target]
        assert np.array_equal(ids[it.cut: it.cut + len(true)], true)    # the text's own next word
        assert tiny.detokenize(true) == it.words[it.target]
        assert len(it.words) == 4 and len({w.lower() for w in it.words}) == 4
        assert all(w.startswith(" ") and w[1:].isalpha() and w[1:] in texts[it.passage] for w in it.words)
        n_same += all(len(c) == len(true) for c in it.candidates)
    assert n_same >= 0.8 * len(items)      # same token count wherever the passage has enough


def test_cloze_single_token_items(tiny):
    items = T.make_cloze_items(tiny, 10, 2, seed=0, max_word_tokens=1, **CLOZE_KW)
    assert all(len(c) == 1 for it in items for c in it.candidates)


@pytest.mark.parametrize("bos", [True, False], ids=["bos", "nobos"])
def test_cloze_scores_match_reference(tiny, hf, bos):
    r = T.cloze(tiny, 12, bos=bos, seed=4, n_candidates=3, max_word_tokens=None, progress=False,
                **CLOZE_KW)
    items = T.make_cloze_items(tiny, 12, 3, seed=4, max_word_tokens=None, **CLOZE_KW)
    bos_id = tiny.bos_id(bos)
    assert any(len(c) > 1 for it in items for c in it.candidates)   # the multi-token path runs
    for i, it in enumerate(items):
        prefix = np.concatenate([[bos_id] if bos else [], it.context]).astype(np.int64)
        want = [ref_candidate_lp(hf, prefix, c) for c in it.candidates]
        np.testing.assert_allclose(r.scores[i], want, rtol=0, atol=LP_ATOL)
    assert r.words == [it.words for it in items] and r.target.tolist() == [it.target for it in items]
    assert np.array_equal(r.correct, r.margin > 0)


def test_cloze_chance_on_random_model(tiny):
    r = T.cloze(tiny, 300, n_candidates=4, seed=1, max_word_tokens=None, progress=False, **CLOZE_KW)
    iv = stats.wilson(int(r.correct.sum()), r.n_items, level=0.99)
    assert iv.lo <= 0.25 <= iv.hi, iv


def test_cloze_result_roundtrip_compare_repr(tiny):
    a = T.cloze(tiny, 20, bos=True, n_candidates=3, progress=False, **ANY)
    b = T.cloze(tiny, 20, bos=False, n_candidates=3, progress=False, **ANY)
    assert a.same_items(b)
    back = T.ClozeResult.from_dict(json.loads(json.dumps(a.to_dict())))
    assert back.same_items(a) and back.accuracy() == a.accuracy()
    np.testing.assert_array_equal(back.scores, a.scores)
    d = T.compare(a, b)
    assert d == stats.paired_difference(a.correct.astype(float), b.correct.astype(float))
    assert a.accuracy() == stats.wilson(int(a.correct.sum()), 20)
    c = a.clustered_accuracy()
    assert c.n == len(np.unique(a.passage)) and c.value == pytest.approx(a.accuracy().value)
    s = repr(a)
    assert s.startswith("ClozeResult(") and "20 items" in s and "BOS" in s
    other = T.cloze(tiny, 20, bos=True, n_candidates=3, seed=9, progress=False, **ANY)
    with pytest.raises(ValueError, match="same items"):
        T.compare(a, other)
    r = T.multikey_retrieval(tiny, lengths=(320,), trials=2, n_keys=2, progress=False)
    with pytest.raises(ValueError, match="cannot compare"):
        T.compare(a, r)


# ------------------------------------------------------------------ figure
def test_task_accuracy_figure(tiny):
    from sinklab.viz.figures_sinks import task_accuracy_figure

    kw = dict(lengths=(320, 360), trials=2, n_keys=2, progress=False)
    a = T.multikey_retrieval(tiny, bos=True, **kw)
    b = T.multikey_retrieval(tiny, bos=False, **kw)
    c = T.cloze(tiny, 10, n_candidates=3, progress=False, **ANY)
    fig = task_accuracy_figure({"with BOS": a, "without BOS": b, "cloze": c})
    ax = fig.axes[0]
    assert len(ax.get_legend().get_texts()) == 3 and "accuracy" in ax.get_ylabel()
    assert task_accuracy_figure([a, b], exact=True).axes
    with pytest.raises(ValueError, match="no results"):
        task_accuracy_figure({})


# ------------------------------------------------------------------ bad inputs
def test_bad_inputs(tiny):
    with pytest.raises(ValueError, match="n_keys must be >= 2"):
        T.multikey_retrieval(tiny, lengths=(200,), trials=1, n_keys=1, progress=False)
    with pytest.raises(ValueError, match="n_keys must be <= 9"):
        T.make_multikey_prompt(tiny, 600, 10)
    with pytest.raises(ValueError, match="too short for n_keys=6"):
        T.multikey_retrieval(tiny, lengths=(100,), trials=1, n_keys=6, progress=False)
    with pytest.raises(ValueError, match="context length"):
        T.multikey_retrieval(tiny, lengths=(4096,), trials=1, progress=False)
    with pytest.raises(ValueError, match="trials must be >= 1"):
        T.multikey_retrieval(tiny, lengths=(200,), trials=0, progress=False)
    with pytest.raises(ValueError, match="score must be one of"):
        T.multikey_retrieval(tiny, lengths=(200,), trials=1, score="best", progress=False)
    with pytest.raises(ValueError, match="filler must be one of"):
        T.make_multikey_prompt(tiny, 400, 2, filler="noise")
    with pytest.raises(ValueError, match="lengths is empty"):
        T.multikey_retrieval(tiny, lengths=(), progress=False)
    with pytest.raises(ValueError, match="repeats"):
        T.multikey_retrieval(tiny, lengths=(200, 200), progress=False)
    with pytest.raises(ValueError, match="n_candidates must be >= 2"):
        T.cloze(tiny, 10, n_candidates=1, progress=False)
    with pytest.raises(ValueError, match="n_items must be >= 1"):
        T.cloze(tiny, 0, progress=False)
    with pytest.raises(ValueError, match="min_context <= max_context"):
        T.make_cloze_items(tiny, 10, min_context=100, max_context=50)
    with pytest.raises(ValueError, match="eligible cloze positions"):
        T.make_cloze_items(tiny, 1000, 3, texts=sl.prompts.load_passages("heldout")[:2], **ANY)
    with pytest.raises(ValueError, match="texts is empty"):
        T.make_cloze_items(tiny, 10, texts=[])
