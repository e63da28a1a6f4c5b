"""Analyses that loop over prompts run them in batches (sinklab.batching): the results must be
bitwise those of the per-prompt loop they replaced.

Reference: ``model.run`` on one (T,) sequence at a time, the quantities then computed here (or
by the analysis' own per-row formula, which batching does not touch). Batching only decides which
sequences share a forward call, so any difference, one bit included, is a bug: a row read from
the wrong batch slot, results put back in the wrong order, a ``logits_from`` applied to the wrong
group. Run on a tiny random model (mixed lengths, so several groups form) and, for the sink
study and the perturbation study, on the real SmolLM2-135M-Instruct.
"""
import functools

import numpy as np
import pytest

from tests.support import reference_models as rm

rm.require("torch")
rm.require("transformers")

import sinklab as sl  # noqa: E402
from sinklab import batching  # noqa: E402
from sinklab.analysis import noop, perturbation, quality, sinkset  # noqa: E402
from sinklab.analysis.sinks import first_token_importance  # noqa: E402
from sinklab.model import CAPTURES  # noqa: E402

LENGTHS = (12, 9, 12, 7, 9, 12, 12)       # three groups, order interleaved


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    hf = rm.make_hf_model(rm.SPECS["gqa_tied"])
    return sl.load(str(rm.save_hf(hf, tmp_path_factory.mktemp("gqa_tied"))), quiet=True)


@pytest.fixture(scope="module")
def smol(smollm2_model):
    return smollm2_model


def _seqs(model, lengths=LENGTHS, seed=0, bos=True):
    return [rm.random_ids(model.config.vocab_size, T, seed=seed + k, bos=bos) for k, T in enumerate(lengths)]


class CountRuns:
    """Wraps model.run to record the batch shape of every call."""

    def __init__(self, model, monkeypatch):
        self.shapes = []
        orig = model.run

        @functools.wraps(orig)          # keeps run's signature (run_each looks for lengths=)
        def run(ids, *a, **kw):
            self.shapes.append(np.shape(ids))
            return orig(ids, *a, **kw)

        monkeypatch.setattr(model, "run", run)


def _assert_same(a, b, what):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape, f"{what}: shape {a.shape} != {b.shape}"
    if not np.array_equal(a, b, equal_nan=True):
        n = int(np.count_nonzero(a != b))
        pytest.fail(f"{what}: not bitwise equal to the per-prompt loop ({n} elements differ)")


# ------------------------------------------------------------------ the helper
def test_plan_groups_by_length_in_first_appearance_order():
    got = batching.plan([5, 3, 5, 5, 3, 7, 5], lambda T, key: 2)
    assert got == [[0, 2], [3, 6], [1, 4], [5]]
    assert batching.plan([4, 4, 4], lambda T, key: 10, keys=[1, 2, 1]) == [[0, 2], [1]]


def test_max_batch_follows_capture_bytes(tiny):
    per = sum(tiny.capture_bytes(12, ("attn", "resid"), B=1).values())
    assert batching.max_batch(tiny, 12, ("attn", "resid"), batch_bytes=5 * per + per // 2) == 5
    assert batching.max_batch(tiny, 12, ("attn", "resid"), batch_bytes=1) == 1
    with pytest.raises(ValueError, match="batch_bytes"):
        batching.max_batch(tiny, 12, "attn", batch_bytes=0)


# groups (T, logits_from resolved): (12, 2) x3, (9, 6), (7, 4), (9, 2), (12, 9)
@pytest.mark.parametrize("batch_bytes,sizes", [(None, [1, 1, 1, 1, 3]), (1, [1] * 7),
                                               ("two", [1, 1, 1, 1, 1, 2])])
def test_run_each_rows_equal_single_runs(tiny, monkeypatch, batch_bytes, sizes):
    """Every capture of every row, with per-sequence logits_from and an intervention, equals the
    (T,) run of that sequence; every index comes exactly once; the calls are the planned batches."""
    seqs = _seqs(tiny)
    lf = [-3 if k % 2 else 2 for k in range(len(seqs))]   # two logits_from groups among equal T
    iv = sl.Intervention(mask_first=[(1, 0)])
    if batch_bytes == "two":
        batch_bytes = 2 * sum(tiny.capture_bytes(12, CAPTURES, B=1).values())
    single = [tiny.run(s, capture=CAPTURES, logits_from=x, intervene=iv, progress=False) for s, x in zip(seqs, lf)]
    counter = CountRuns(tiny, monkeypatch)
    seen = []
    for i, tr in batching.run_each(tiny, seqs, CAPTURES, logits_from=lf, intervene=iv,
                                   batch_bytes=batch_bytes, progress=False):
        seen.append(i)
        ref = single[i]
        for k in ("ids", "attn", "resid", "logits", "q", "k", "v", "z", "head_out", "attn_out", "mlp_out"):
            _assert_same(getattr(tr, k), getattr(ref, k), f"row {i} {k}")
        for k in ("importance", "to_first", "entropy"):
            _assert_same(getattr(tr.stats, k), getattr(ref.stats, k), f"row {i} stats.{k}")
        assert tr.meta == ref.meta and tr.layers == ref.layers
    assert sorted(seen) == list(range(len(seqs)))
    assert sorted(s[0] for s in counter.shapes) == sizes, f"batch shapes {counter.shapes}"


@pytest.mark.parametrize("batch_bytes,sizes", [(None, [7]), ("two", [1, 2, 2, 2])])
def test_run_each_ragged_rows_equal_single_runs(tiny, monkeypatch, batch_bytes, sizes):
    """ragged=True: unequal lengths share zero-padded calls (longest first); every row, cut back
    to its length, equals the (T,) run of that sequence in every capture."""
    seqs = _seqs(tiny, seed=50)
    if batch_bytes == "two":     # two sequences of the longest length per call
        batch_bytes = 2 * sum(tiny.capture_bytes(12, CAPTURES, logits_from=2, B=1).values())
    single = [tiny.run(s, capture=CAPTURES, logits_from=2, progress=False) for s in seqs]
    counter = CountRuns(tiny, monkeypatch)
    seen = []
    for i, tr in batching.run_each(tiny, seqs, CAPTURES, logits_from=2, batch_bytes=batch_bytes,
                                   progress=False, ragged=True):
        seen.append(i)
        for k in ("ids", "attn", "resid", "logits", "q", "k", "v", "z", "head_out", "attn_out", "mlp_out"):
            _assert_same(getattr(tr, k), getattr(single[i], k), f"row {i} {k}")
        for k in ("importance", "to_first", "entropy"):
            _assert_same(getattr(tr.stats, k), getattr(single[i].stats, k), f"row {i} stats.{k}")
        assert tr.meta == single[i].meta
    assert sorted(seen) == list(range(len(seqs)))
    assert sorted(s[0] for s in counter.shapes) == sizes, f"batch shapes {counter.shapes}"


# ------------------------------------------------------------------ sink study
def _sink_loop(model, seqs, capture):
    if capture == "attn":
        return np.stack([first_token_importance(model.run(s, capture=("attn",), progress=False).attn) for s in seqs])
    return np.stack([model.run(s, capture=("stats",), progress=False).stats.importance[..., 0].astype(np.float64)
                     for s in seqs])


@pytest.mark.parametrize("capture", ["attn", "stats"])
def test_sink_study_batched_equals_loop_tiny(tiny, monkeypatch, capture):
    prompts = _seqs(tiny, (20, 31, 25, 40, 20, 22), seed=10, bos=False)
    T = 16
    ref = _sink_loop(tiny, [np.concatenate([[rm.BOS_ID], p[:T - 1]]) for p in prompts], capture)
    counter = CountRuns(tiny, monkeypatch)
    st = sinkset.sink_study(tiny, prompts, T=T, capture=capture, progress=False)
    assert counter.shapes == [(6, T)], "one batch of all six prompts under the default cap"
    _assert_same(st.importance, ref, f"sink study ({capture})")
    small = sinkset.sink_study(tiny, prompts, T=T, capture=capture, progress=False,
                               batch_bytes=2 * sum(tiny.capture_bytes(T, capture, B=1).values()))
    _assert_same(small.importance, ref, f"sink study ({capture}, batches of 2)")


@pytest.mark.slow  # a whole sink study on SmolLM2, twice
def test_sink_study_batched_equals_loop_smollm2(smol):
    from sinklab.prompts import load_passages

    texts = load_passages("sinks")[:20]
    for bos in (True, False):
        st = sinkset.sink_study(smol, texts, T=64, bos=bos, capture="attn", progress=False,
                                batch_bytes=8 * sum(smol.capture_bytes(64, "attn", B=1).values()))
        seqs = [sl.inputs.prepare(smol, t, bos, 64) for t in texts]
        _assert_same(st.importance, _sink_loop(smol, seqs, "attn"), f"SmolLM2 sink study (bos={bos})")


# ------------------------------------------------------------------ quality
def test_perplexity_batched_equals_loop(tiny, monkeypatch):
    texts = _seqs(tiny, (20, 25, 20, 30, 25, 20), seed=20, bos=False)
    for bos in (True, False):
        ref = []
        for x in texts:
            ids = sl.inputs.prepare(tiny, x, bos)
            tr = tiny.run(ids, capture=("logits",), logits_from=1 if bos else 0, progress=False)
            ref.append(float(quality.nll_rows(tr.logits[: len(x) - 1], x[1:]).mean()))
        counter = CountRuns(tiny, monkeypatch)
        got = quality.perplexity(tiny, texts, bos=bos, progress=False)
        monkeypatch.undo()
        n = 1 if bos else 0
        assert counter.shapes == [(6, 30 + n)], "one zero-padded call of all six texts"
        _assert_same(got.nll, np.asarray(ref), f"perplexity nll (bos={bos})")
        assert got.n_predicted.tolist() == [len(x) - 1 for x in texts]


def test_passkey_forced_batched_equals_loop(tiny):
    rng = np.random.default_rng(3)
    V = tiny.config.vocab_size
    prompts = [quality.PasskeyPrompt(ids=rng.integers(3, V, n), answer=rng.integers(3, V, m), passkey="1",
                                     depth=0.5, length=n + m + 1, n_filler=0, template="plain", text="")
               for n, m in [(20, 3), (21, 2), (20, 3), (20, 2), (21, 2)]]
    for p in prompts[:2]:              # make some answers right: the model's own greedy decoding
        p.answer = quality._greedy(tiny, p, rm.BOS_ID)
    ref = []
    for p in prompts:
        seq = p.sequence(rm.BOS_ID)
        tr = tiny.run(seq, capture=("logits",), logits_from=len(seq) - len(p.answer) - 1, progress=False)
        pred = tr.logits[: len(p.answer)].argmax(-1)
        ref.append((tiny.detokenize(pred), bool((pred == p.answer).all()), float((pred == p.answer).mean())))

    class Bar:
        n = 0

        def update(self, k):
            self.n += k

    bar = Bar()
    got = quality._score_all(tiny, prompts, rm.BOS_ID, "forced", None, bar)
    assert got == ref and bar.n == len(prompts)
    assert got[0][1] and got[1][1]


# ------------------------------------------------------------------ no-op heads
def test_noop_analysis_batched_equals_loop(tiny, monkeypatch):
    texts = _seqs(tiny, (14, 10, 14, 10, 6), seed=30, bos=False)
    counter = CountRuns(tiny, monkeypatch)
    res = noop.noop_analysis(tiny, texts, bos=True, progress=False)
    monkeypatch.undo()
    assert counter.shapes == [(5, 15)], "one zero-padded call of all five prompts"
    for k, x in enumerate(texts):
        ids = sl.inputs.prepare(tiny, x, True)
        tr = tiny.run(ids, capture=("attn", "resid", "v", "head_out"), progress=False)
        _assert_same(res.ids[k], ids, f"prompt {k} ids")
        _assert_same(res.value_norm[k], noop.value_norms(tiny, tr.v), f"prompt {k} value_norm")
        _assert_same(res.out_norm[k], noop.head_output_norms(tiny, tr.head_out), f"prompt {k} out_norm")
        _assert_same(res.to_first[k], tr.attn[..., :, 0].astype(np.float64), f"prompt {k} to_first")
        _assert_same(res.resid_norm[k], np.linalg.norm(tr.resid[:-1].astype(np.float64), axis=-1),
                     f"prompt {k} resid_norm")


def test_conditional_heads_batched_equals_one_at_a_time(tiny):
    """Batched against one prompt per call (run_each == model.run row by row is tested above),
    and against the definition: mean over prompts of the attention to position 0 without trigger."""
    trig = 5
    rng = np.random.default_rng(40)
    V = tiny.config.vocab_size

    def prompt(n, with_trigger):
        x = rng.integers(6, V, n)
        if with_trigger:
            x[n // 2] = trig
        return x

    withs = [prompt(n, True) for n in (12, 15, 12)]
    withouts = [prompt(n, False) for n in (12, 9, 12, 9)]
    a = noop.find_conditional_heads(tiny, withs, withouts, trigger=trig, progress=False)
    b = noop.find_conditional_heads(tiny, withs, withouts, trigger=trig, progress=False, batch_bytes=1)
    for k in ("to_trigger_with", "to_first_with", "to_first_without", "to_prev_without",
              "out_norm_with", "out_norm_without"):
        _assert_same(getattr(a, k), getattr(b, k), k)
    ref = np.mean([tiny.run(sl.inputs.prepare(tiny, x, True), capture=("attn",), progress=False)
                   .attn[:, :, 1:, 0].astype(np.float64).mean(-1) for x in withouts], axis=0)
    _assert_same(a.to_first_without, ref, "to_first_without against its definition")


# ------------------------------------------------------------------ perturbation study
def test_perturbation_study_batched_equals_perturb(smol):
    """Each swap of the (batched) study equals perturb() of that swap alone (four single runs)."""
    study = perturbation.perturbation_study(smol, n_passages=2, swaps_per_passage=2, T=32, progress=False)
    assert study.n_swaps == 4
    for r in study.results:
        one = perturbation.perturb(smol, r.ids, position=int(r.changed[0]), token=int(r.ids_perturbed[r.changed[0]]),
                                   bos="both", progress=False)
        for s in ("bos", "nobos"):
            _assert_same(r.abs_change[s], one.abs_change[s], f"abs_change[{s}]")
            _assert_same(r.norm[s], one.norm[s], f"norm[{s}]")
            _assert_same(r.entropy[s], one.entropy[s], f"entropy[{s}]")
        _assert_same(r.entropy_text["bos"], one.entropy_text["bos"], "entropy_text[bos]")
