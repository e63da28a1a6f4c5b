"""Batches as one forward call (issue 9): packed rows, ragged lengths, out= buffers, workspace reuse.

- A (B, T) batch runs its sequences' tokens through every weight product together; each output
  element of the SGEMM is one fixed FMA chain whatever the number of rows, and RoPE and
  attention are per sequence, so every capture of sequence b is BITWISE that of running
  sequence b alone (the single-sequence path that the parity suites check against
  transformers), for every capture, with interventions, at 1 and 2 threads.
- Ragged batches (lengths=): each sequence equals its own unpadded run bitwise and is zero at
  the padded positions; one ragged sequence is also checked against transformers directly.
- out=: a refill gives the bits of a fresh run and keeps the very same array objects.
- Bad lengths / out raise ValueError naming the problem.
"""
import threading

import numpy as np
import pytest

from tests.support import reference_models as rm

import sinklab as sl  # noqa: E402
from sinklab import _core  # noqa: E402

ALL = ("attn", "resid", "logits", "stats", "q", "k", "v", "z", "head_out", "attn_out", "mlp_out")
STATS = ("importance", "to_first", "entropy")
# Position axes of each sequence's capture (no batch axis): where padding zeros go.
POS_AXES = {"attn": (2, 3), "resid": (1,), "logits": (0,), "q": (2,), "k": (2,), "v": (2,), "z": (2,),
            "head_out": (2,), "attn_out": (1,), "mlp_out": (1,), "importance": (2,), "to_first": (2,),
            "entropy": (2,)}

# d_ff = 120 and d_model = 72 are not multiples of 16, so packed rows start at every alignment
# inside the elementwise kernels; T > 4 query blocks of 64 exercises the importance segments.
SPEC = rm.TinySpec("batch", d_model=72, n_layers=2, n_heads=6, n_kv_heads=2, head_dim=12,
                   d_ff=120, vocab_size=331, context_length=512, seed=5)
T_LONG = 300


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny model as a GGUF (llama.cpp's permuted Q/K rows) and its transformers original."""
    rm.require("torch")
    rm.require("transformers")
    hf = rm.make_hf_model(SPEC)
    path = rm.write_gguf(hf, tmp_path_factory.mktemp("batch") / "batch.gguf", "F32")
    return sl.load(path), hf


@pytest.fixture(scope="module")
def smol(smollm2_model):
    return smollm2_model


def _arrays(tr):
    """Every captured array of a Trace by name (stats flattened to their three names)."""
    out = {k: getattr(tr, k) for k in ALL if k != "stats" and getattr(tr, k) is not None}
    if tr.stats is not None:
        out.update({k: getattr(tr.stats, k) for k in STATS})
    return out


def _interventions(model):
    c = model.config
    rng = np.random.default_rng(3)
    heads = rng.random((c.n_layers, c.n_heads)) < 0.5
    return {"none": None,
            "mask_first": sl.Intervention(mask_first=heads),
            "zero_first_value_others": sl.Intervention(zero_first_value=heads, zero_first_value_scope="others"),
            "zero_first_value_all": sl.Intervention(zero_first_value=heads, zero_first_value_scope="all"),
            "head_scale": sl.Intervention(head_scale=rng.uniform(0.0, 2.0, (c.n_layers, c.n_heads)))}


def _assert_same(got, want, what):
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    if not np.array_equal(got, want):
        n = int(np.count_nonzero(got != want))
        d = float(np.nanmax(np.abs(got.astype(np.float64) - want.astype(np.float64))))
        pytest.fail(f"{what}: not bitwise equal ({n} elements differ, max |diff| {d:.3e})")


def _padded_part(a, axes, n):
    """The entries of a (one sequence's capture) at positions >= n along any of `axes`."""
    mask = np.zeros(a.shape, bool)
    for ax in axes:
        idx = [slice(None)] * a.ndim
        idx[ax] = slice(n, None)
        mask[tuple(idx)] = True
    return a[mask]


def _real_part(a, axes, n):
    idx = [slice(None)] * a.ndim
    for ax in axes:
        idx[ax] = slice(0, n)
    return a[tuple(idx)]


def _check_batch(model, ids, lengths=None, logits_from=0, intervene=None, layers=None, **kw):
    """Runs ids (B, T) batched and every sequence alone (unpadded); asserts bitwise equality of
    the real positions and zeros at the padded ones."""
    tr = model.run(ids, capture=ALL, lengths=lengths, logits_from=logits_from, intervene=intervene,
                   layers=layers, progress=False, **kw)
    B, T = ids.shape
    lens = np.full(B, T) if lengths is None else np.asarray(lengths)
    got = _arrays(tr)
    lf = logits_from % T
    for b in range(B):
        n = int(lens[b])
        if lf >= n:  # no real logits row for this sequence: all its rows are padding
            assert not got["logits"][b].any()
            alone = _arrays(model.run(ids[b, :n], capture=[c for c in ALL if c != "logits"],
                                      intervene=intervene, layers=layers, progress=False))
        else:
            alone = _arrays(model.run(ids[b, :n], capture=ALL, logits_from=lf, intervene=intervene,
                                      layers=layers, progress=False))
        for k, want in alone.items():
            axes = POS_AXES[k]
            g = got[k][b]
            if k == "logits":  # rows are positions lf.. of the padded sequence
                g = g[: n - lf]
                assert not got[k][b][n - lf:].any(), f"sequence {b} logits: padding rows not zero"
            else:
                pad = _padded_part(g, axes, n)
                assert not pad.any(), f"sequence {b} {k}: {np.count_nonzero(pad)} nonzero padding entries"
                g = _real_part(g, axes, n)
            _assert_same(g, want, f"sequence {b} (length {n}) {k}")
    return tr


# ------------------------------------------------------------------ tiny model

@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("iv", ["none", "mask_first", "zero_first_value_others", "zero_first_value_all",
                                "head_scale"])
def test_batched_equals_per_sequence_tiny(tiny, threads, iv, threads_restored):
    model, _ = tiny
    sl.set_num_threads(threads)
    ids = rm.random_ids(SPEC.vocab_size, 70, seed=1, batch=4)
    for lf in (0, -1):
        _check_batch(model, ids, logits_from=lf, intervene=_interventions(model)[iv])


@pytest.mark.parametrize("threads", [1, 2])
def test_ragged_equals_unpadded_tiny(tiny, threads, threads_restored):
    model, _ = tiny
    sl.set_num_threads(threads)
    ids = rm.random_ids(SPEC.vocab_size, T_LONG, seed=2, batch=5)
    lengths = [T_LONG, 1, 65, 257, 64]
    for iv in ("none", "zero_first_value_others", "head_scale"):
        tr = _check_batch(model, ids, lengths=lengths, intervene=_interventions(model)[iv], layers=[1])
        assert np.array_equal(tr.lengths, lengths)
    # logits_from counts padded positions: rows past a sequence's end are zero
    _check_batch(model, ids, lengths=lengths, logits_from=100)
    _check_batch(model, ids, lengths=lengths, logits_from=-1)


def test_ragged_padding_ids_are_not_read(tiny):
    """Changing the padding ids changes nothing (they are never embedded)."""
    model, _ = tiny
    ids = rm.random_ids(SPEC.vocab_size, 40, seed=4, batch=3)
    lengths = [40, 9, 23]
    a = _arrays(model.run(ids, capture=ALL, lengths=lengths, progress=False))
    ids2 = ids.copy()
    for b, n in enumerate(lengths):
        ids2[b, n:] = (ids2[b, n:] + 7) % SPEC.vocab_size
    b_ = _arrays(model.run(ids2, capture=ALL, lengths=lengths, progress=False))
    for k in a:
        _assert_same(b_[k], a[k], f"padding ids changed {k}")


def test_ragged_sequence_matches_transformers(tiny):
    """An independent reference: a short sequence inside a padded batch against transformers on
    its own tokens."""
    model, hf = tiny
    ids = rm.random_ids(SPEC.vocab_size, 90, seed=6, batch=3)
    lengths = [90, 37, 61]
    tr = model.run(ids, capture=("attn", "resid", "logits"), lengths=lengths, progress=False)
    for b in (1, 2):
        n = lengths[b]
        ref = rm.hf_forward(hf, ids[b, :n])
        rm.assert_close("logits", tr.logits[b, :n], ref["logits"])
        for l in range(SPEC.n_layers):
            rm.assert_close(f"attn[{l}]", tr.attn[b, l, :, :n, :n], ref["attn"][l])
            rm.assert_close(f"resid[{l}]", tr.resid[b, l, :n], ref["resid"][l])


def test_chunks_equal_one_call(tiny):
    """max_rows splits the batch into several C calls: same bits as one call."""
    model, _ = tiny
    ids = rm.random_ids(SPEC.vocab_size, 33, seed=7, batch=7)
    lengths = [33, 5, 20, 33, 1, 32, 17]
    one = _arrays(model.run(ids, capture=ALL, lengths=lengths, progress=False))
    many = _arrays(model.run(ids, capture=ALL, lengths=lengths, progress=False, max_rows=70))  # 2 per call
    for k in one:
        _assert_same(many[k], one[k], f"chunked {k}")


def test_out_refill_is_bitwise_and_in_place(tiny):
    model, _ = tiny
    ids = rm.random_ids(SPEC.vocab_size, 50, seed=8, batch=3)
    other = rm.random_ids(SPEC.vocab_size, 50, seed=9, batch=3)
    iv = _interventions(model)["mask_first"]
    out = model.run(other, capture=ALL, layers=[0], progress=False)
    before = {k: id(v) for k, v in _arrays(out).items()}
    for lengths in (None, [50, 3, 44]):
        fresh = _arrays(model.run(ids, capture=ALL, layers=[0], intervene=iv, lengths=lengths, progress=False))
        got = model.run(ids, capture=ALL, layers=[0], intervene=iv, lengths=lengths, out=out, progress=False)
        assert got is out
        assert {k: id(v) for k, v in _arrays(got).items()} == before, "out= replaced an array"
        for k, v in _arrays(got).items():
            _assert_same(v, fresh[k], f"out= refill {k}")
        assert np.array_equal(got.ids, ids)
        assert (got.lengths is None) == (lengths is None)
    # one sequence (T,) ids: the arrays have no batch axis
    one = model.run(ids[0], capture=("attn", "stats"), progress=False)
    arr = one.attn
    again = model.run(ids[1], capture=("attn", "stats"), out=one, progress=False)
    assert again.attn is arr
    _assert_same(arr, model.run(ids[1], capture=("attn",), progress=False).attn, "out= (T,) attn")


def test_bad_lengths_raise(tiny):
    model, _ = tiny
    ids = rm.random_ids(SPEC.vocab_size, 10, seed=10, batch=3)
    for bad, match in (([10, 0, 5], r"lengths\[1\]=0 outside \[1, 10\]"),
                       ([10, 11, 5], r"lengths\[1\]=11 outside"),
                       ([10, 5], "3 integers"), ([1.0, 2.0, 3.0], "integers"), (np.ones((3, 1), int), "3 integers")):
        with pytest.raises(ValueError, match=match):
            model.run(ids, capture="logits", lengths=bad, progress=False)
    with pytest.raises(ValueError, match="lengths"):  # the core checks too
        _core.model_forward(model._handle, ids, lengths=np.array([10, 0, 5], np.int64))
    with pytest.raises(ValueError, match="outside"):  # padding ids must still be valid ids
        bad_ids = ids.copy()
        bad_ids[1, 9] = SPEC.vocab_size
        model.run(bad_ids, capture="logits", lengths=[10, 5, 5], progress=False)


def test_bad_out_raises(tiny):
    model, _ = tiny
    ids = rm.random_ids(SPEC.vocab_size, 12, seed=11, batch=2)
    out = model.run(ids, capture=("attn", "stats"), layers=[0], progress=False)
    with pytest.raises(ValueError, match=r"out.attn is float32 \(2, 1, 6, 12, 12\), expected float32 \(2, 1, 6, 13, 13\)"):
        model.run(np.concatenate([ids, ids[:, :1]], axis=1), capture=("attn", "stats"), layers=[0], out=out,
                  progress=False)
    with pytest.raises(ValueError, match="out.layers"):
        model.run(ids, capture=("attn", "stats"), layers=[1], out=out, progress=False)
    with pytest.raises(ValueError, match=r"out.resid is None"):
        model.run(ids, capture=("attn", "stats", "resid"), layers=[0], out=out, progress=False)
    with pytest.raises(ValueError, match=r"\['stats'\]"):
        model.run(ids, capture=("attn",), layers=[0], out=out, progress=False)
    out.stats.entropy = out.stats.entropy.astype(np.float64)
    with pytest.raises(ValueError, match=r"out.stats.entropy is float64"):
        model.run(ids, capture=("attn", "stats"), layers=[0], out=out, progress=False)
    with pytest.raises(ValueError, match="Trace"):
        model.run(ids, capture="attn", out={"attn": None}, progress=False)


def test_workspace_is_cached_and_released(tiny):
    model, _ = tiny
    ids = rm.random_ids(SPEC.vocab_size, 40, seed=12, batch=2)
    _core.model_release_workspace(model._handle)
    assert _core.model_workspace_bytes(model._handle) == 0
    a = model.run(ids, capture="logits", progress=False).logits
    held = _core.model_workspace_bytes(model._handle)
    # at least the packed activations: rows x (2d + 2H*hd + 2G*hd + 2F) floats
    c = model.config
    rows = ids.size
    assert held >= 4 * rows * (2 * c.d_model + 2 * c.n_heads * c.head_dim + 2 * c.n_kv_heads * c.head_dim + 2 * c.d_ff)
    b = model.run(ids, capture="logits", progress=False).logits  # reuses it (stale contents)
    _assert_same(b, a, "second run on the cached workspace")
    assert _core.model_workspace_bytes(model._handle) == held
    _core.model_release_workspace(model._handle)
    assert _core.model_workspace_bytes(model._handle) == 0


def test_concurrent_callers_do_not_share_a_workspace(tiny, threads_restored):
    """Two Python threads on one model with different batch shapes: each gets what it gets alone."""
    model, _ = tiny
    sl.set_num_threads(1)
    jobs = [(rm.random_ids(SPEC.vocab_size, 60, seed=13, batch=3), [60, 10, 33]),
            (rm.random_ids(SPEC.vocab_size, 25, seed=14, batch=5), None)]
    want = [model.run(i, capture=("stats", "logits"), lengths=ln, progress=False) for i, ln in jobs]
    errors = []

    def work(k):
        i, ln = jobs[k]
        for _ in range(15):
            got = model.run(i, capture=("stats", "logits"), lengths=ln, progress=False)
            if not (np.array_equal(got.logits, want[k].logits)
                    and np.array_equal(got.stats.importance, want[k].stats.importance)):
                errors.append(k)

    ts = [threading.Thread(target=work, args=(k,)) for k in (0, 1, 0, 1)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, f"{len(errors)} concurrent runs differed from the serial ones"


def test_trace_save_load_keeps_lengths(tiny, tmp_path):
    model, _ = tiny
    ids = rm.random_ids(SPEC.vocab_size, 12, seed=15, batch=2)
    tr = model.run(ids, capture="stats", lengths=[12, 4], progress=False)
    back = sl.Trace.load(tr.save(tmp_path / "tr"))
    assert np.array_equal(back.lengths, [12, 4])
    assert model.run(ids, capture="stats", lengths=[12, 12], progress=False).lengths is None


def test_capture_bytes_matches_the_buffers(tiny):
    model, _ = tiny
    ids = rm.random_ids(SPEC.vocab_size, 21, seed=16, batch=3)
    need = model.capture_bytes(21, ALL, layers=[1], logits_from=-1, B=3)
    tr = model.run(ids, capture=ALL, layers=[1], logits_from=-1, lengths=[21, 2, 9], progress=False)
    got = _arrays(tr)
    assert need.pop("stats") == sum(got[k].nbytes for k in STATS)
    assert need == {k: got[k].nbytes for k in need}


# ------------------------------------------------------------------ SmolLM2-135M

@pytest.mark.parametrize("threads", [1, 2])
def test_batched_equals_per_sequence_smollm2(smol, threads, threads_restored):
    sl.set_num_threads(threads)
    ids = rm.random_ids(smol.config.vocab_size, 40, seed=21, batch=3)
    ivs = _interventions(smol)
    for iv in ("none", "zero_first_value_others", "head_scale"):
        _check_batch(smol, ids, intervene=ivs[iv], layers=[0, 5, 29], logits_from=-1 if iv == "none" else 0)
    _check_batch(smol, ids, intervene=ivs["mask_first"], layers=[3, 28], lengths=[40, 13, 27])
