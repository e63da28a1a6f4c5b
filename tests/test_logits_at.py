"""``logits_at=``: the output head on chosen positions only.

- Rows against transformers fp32 (an independent reference) on tiny models of two families: a
  LLaMA block and Gemma 2's final soft-cap (applied to the gathered rows), alone, in a ragged
  batch with a row per sequence, and with repeats and more rows than one head chunk holds.
- Each row is bitwise the row ``logits_from`` gives, at every precision and thread count (the
  head's rows are independent products), so the tasks that now ask only for the rows they read
  give the same scores as before.
- ``batching.run_each`` with a different number of rows per sequence; buffers sized by
  ``capture_bytes``; the positions in ``Trace.meta`` and the labelled array; clear errors for bad
  positions from Python and from the core itself.
"""
import numpy as np
import pytest

from tests.support import reference_models as rm

import sinklab as sl  # noqa: E402
from sinklab import _core, batching  # noqa: E402

SPEC = rm.TinySpec("logits_at", d_model=72, n_layers=2, n_heads=6, n_kv_heads=2, head_dim=12,
                   d_ff=120, vocab_size=331, context_length=512, seed=7)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    rm.require("torch")
    rm.require("transformers")
    hf = rm.make_hf_model(SPEC)
    return sl.load(rm.write_gguf(hf, tmp_path_factory.mktemp("logits_at") / "tiny.gguf", "F32")), hf


@pytest.fixture(scope="module")
def gemma2(tmp_path_factory):
    rm.require("torch")
    rm.require("transformers")
    store = rm.FamilyModels(tmp_path_factory.mktemp("logits_at_families"))
    return store.sl("gemma2", "st"), store.hf("gemma2", "st")


def test_rows_match_transformers_alone_and_in_a_ragged_batch(tiny):
    model, hf = tiny
    ids = rm.random_ids(SPEC.vocab_size, 50, seed=1, batch=3)
    lengths = [50, 19, 33]
    at = np.array([[0, 49, 7, 7], [18, 3, -1, 0], [32, 31, 1, -33]])
    tr = model.run(ids, capture=("logits",), lengths=lengths, logits_at=at, progress=False)
    assert tr.logits.shape == (3, 4, SPEC.vocab_size)
    for b, n in enumerate(lengths):
        ref = rm.hf_forward(hf, ids[b, :n])["logits"]
        rm.assert_close(f"logits_at row {b}", tr.logits[b], ref[at[b] % n])
    one = model.run(ids[1, :19], capture=("logits",), logits_at=[5, -2], progress=False)
    rm.assert_close("logits_at (T,)", one.logits, rm.hf_forward(hf, ids[1, :19])["logits"][[5, 17]])


def test_final_soft_cap_applies_to_the_gathered_rows(gemma2):
    model, hf = gemma2
    assert model.config.final_softcap > 0
    ids = rm.random_ids(model.config.vocab_size, 24, seed=2)
    at = [23, 0, 11, 11, 4]
    tr = model.run(ids, capture=("logits",), logits_at=at, progress=False)
    ref = rm.family_forward(hf, ids)["logits"]
    rm.assert_close("gemma2 logits_at", tr.logits, ref[at])
    assert np.abs(tr.logits).max() <= 6.0     # the soft-cap's bound (6.0 in the spec) holds


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8"])
def test_each_row_is_bitwise_the_logits_from_row(tiny, precision, threads, threads_restored):
    sl.set_num_threads(threads)
    model, _ = tiny
    ids = rm.random_ids(SPEC.vocab_size, 40, seed=3, batch=2)
    full = model.run(ids, capture=("logits",), lengths=[40, 26], precision=precision, progress=False).logits
    # 700 rows for 66 tokens: the gathered rows go through the head in many chunks
    rng = np.random.default_rng(4)
    at = np.stack([rng.integers(0, 40, 700), rng.integers(0, 26, 700)])
    tr = model.run(ids, capture=("logits",), lengths=[40, 26], logits_at=at, precision=precision, progress=False)
    for b in range(2):
        assert np.array_equal(tr.logits[b], full[b, at[b]]), f"sequence {b}: rows differ from logits_from's"


def test_run_each_with_rows_per_sequence(tiny):
    model, _ = tiny
    seqs = [rm.random_ids(SPEC.vocab_size, n, seed=10 + n) for n in (30, 12, 30, 7, 12)]
    at = [[5, 29], [11], [0, 1, 2], [-2], [3, 3, 3, 3]]
    got = {}
    for i, tr in batching.run_each(model, seqs, ("logits",), logits_at=at, ragged=True, progress=False):
        got[i] = tr
    for i, s in enumerate(seqs):
        ref = model.run(s, capture=("logits",), progress=False).logits
        pos = np.asarray(at[i]) % len(s)
        assert got[i].logits.shape == (len(pos), SPEC.vocab_size)
        assert np.array_equal(got[i].logits, ref[pos]), f"sequence {i}"
        assert got[i].meta["logits_at"] == pos.tolist()


def test_buffers_meta_and_labels(tiny, tmp_path):
    model, _ = tiny
    ids = rm.random_ids(SPEC.vocab_size, 21, seed=5, batch=3)
    need = model.capture_bytes(21, ("logits", "stats"), B=3, logit_rows=4)
    tr = model.run(ids, capture=("logits", "stats"), logits_at=[0, 20, 2, 2], progress=False)
    assert need["logits"] == tr.logits.nbytes == 3 * 4 * SPEC.vocab_size * 4
    assert tr.meta["logits_at"] == [[0, 20, 2, 2]] * 3
    one = model.run(ids[0], capture=("logits",), logits_at=[9, -1], progress=False)
    assert one.to_xarray().logit_pos.values.tolist() == [9, 20]
    back = sl.Trace.load(one.save(tmp_path / "tr"))
    assert back.meta["logits_at"] == [9, 20] and np.array_equal(back.logits, one.logits)


@pytest.mark.parametrize("kw,match", [
    (dict(logits_at=[21]), r"logits_at\[0\]=21 outside \[-21, 21\)"),
    (dict(logits_at=[-22]), r"outside \[-21, 21\)"),
    (dict(logits_at=[]), "non-empty"),
    (dict(logits_at=[1.0]), "integer positions"),
    (dict(logits_at=[[1]]), r"for ids of shape \(21,\)"),
    (dict(logits_at=[1], logits_from=3), "exclusive"),
])
def test_bad_positions_are_named(tiny, kw, match):
    model, _ = tiny
    ids = rm.random_ids(SPEC.vocab_size, 21, seed=6)
    with pytest.raises(ValueError, match=match):
        model.run(ids, capture=("logits",), progress=False, **kw)


def test_positions_past_a_ragged_end_and_the_core_checks_its_own(tiny):
    model, _ = tiny
    ids = rm.random_ids(SPEC.vocab_size, 21, seed=7, batch=2)
    with pytest.raises(ValueError, match=r"logits_at\[1, 0\]=9 outside \[-9, 9\) for sequence 1 of 9 tokens"):
        model.run(ids, capture=("logits",), lengths=[21, 9], logits_at=[[0], [9]], progress=False)
    V = SPEC.vocab_size
    with pytest.raises(ValueError, match=r"logits_at\[1, 0\]=9 outside sequence 1's \[0, 9\)"):
        _core.model_forward(model._handle, ids, logits=np.empty((2, 1, V), np.float32),
                            lengths=np.array([21, 9]), logits_at=np.array([[0], [9]]))
    with pytest.raises(ValueError, match=r"logits_at has size 1 on axis 0, expected 2"):
        _core.model_forward(model._handle, ids, logits=np.empty((2, 1, V), np.float32), logits_at=np.array([[0]]))
    with pytest.raises(ValueError, match="exclusive"):
        _core.model_forward(model._handle, ids, logits=np.empty((2, 1, V), np.float32), logits_from=3,
                            logits_at=np.array([[0], [1]]))
    with pytest.raises(ValueError, match=r"logits has size 21 on axis 1, expected 1"):
        _core.model_forward(model._handle, ids, logits=np.empty((2, 21, V), np.float32), logits_at=np.array([[0], [1]]))
