"""Bad input to a loaded model gets a Python exception naming the problem, never a crash."""
import numpy as np
import pytest

import sinklab as sl
from sinklab import _core
from tests.support.reference_models import SPECS, make_hf_model, save_hf


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    save_hf(make_hf_model(SPECS["mha"]), d)
    return sl.load(d)


def test_ids_out_of_range(model):
    V = model.config.vocab_size
    with pytest.raises(ValueError, match=f"token id {V} is outside"):
        model.run([1, 2, V])
    with pytest.raises(ValueError, match="token id -1 is outside"):
        model.run([1, -1, 2])


@pytest.mark.parametrize("ids", [[1.0, 2.0], np.array([1.5]), ["a", "b"], [True, False], [None]])
def test_non_integer_ids(model, ids):
    with pytest.raises(TypeError, match="integers"):
        model.run(ids)


@pytest.mark.parametrize("ids", [np.zeros((1, 2, 3), np.int64), np.int64(3)])
def test_wrong_ndim(model, ids):
    with pytest.raises(ValueError, match=r"shape \(T,\) or \(B, T\)"):
        model.run(ids)


@pytest.mark.parametrize("ids", [[], np.zeros((2, 0), np.int64)])
def test_empty_sequence(model, ids):
    with pytest.raises(ValueError, match="empty"):
        model.run(ids)


def test_sequence_beyond_context(model):
    with pytest.raises(ValueError, match="context length"):
        model.run(np.ones(model.config.context_length + 1, np.int64))


def test_unknown_capture_and_layers(model):
    with pytest.raises(ValueError, match="unknown capture"):
        model.run([1, 2], capture=("attention",))
    with pytest.raises(ValueError, match="out of range"):
        model.run([1, 2], layers=[model.config.n_layers])


def test_noncontiguous_and_narrow_ids_work(model):
    ids = np.arange(40, dtype=np.int32)[::2]  # strided int32 view: converted, not rejected
    a = model.run(ids, capture=("logits",)).logits
    b = model.run(np.ascontiguousarray(ids, dtype=np.int64), capture=("logits",)).logits
    assert np.array_equal(a, b)


def test_core_rejects_bad_buffers(model):
    T, c = 4, model.config
    ids = np.arange(T, dtype=np.int64)
    ok = np.zeros((T, c.vocab_size), np.float32)
    readonly = ok.copy()
    readonly.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        _core.model_forward(model._handle, ids, None, None, readonly)
    with pytest.raises(ValueError, match="size"):
        _core.model_forward(model._handle, ids, None, None, np.zeros((T + 1, c.vocab_size), np.float32))
    with pytest.raises(ValueError, match="contiguous"):
        _core.model_forward(model._handle, ids, None, None, np.zeros((c.vocab_size, T), np.float32).T)
    with pytest.raises(TypeError, match="dtype"):
        _core.model_forward(model._handle, ids, None, None, np.zeros((T, c.vocab_size), np.float64))
    with pytest.raises(TypeError, match="dtype"):
        _core.model_forward(model._handle, ids.astype(np.int32), None, None, ok)
    with pytest.raises(ValueError, match="list of"):
        _core.model_forward(model._handle, ids, [None], None, ok)
    with pytest.raises(ValueError, match="outside"):  # the core re-checks ids itself
        _core.model_forward(model._handle, np.array([0, c.vocab_size], np.int64), None, None, None)
    with pytest.raises(ValueError):
        _core.model_forward(object(), ids, None, None, ok)


def test_tokenize_needs_a_tokenizer_and_bos(model):
    ids = model.tokenize("the cat", bos=True)
    assert ids[0] == model.config.bos_token_id
    assert model.detokenize(ids[1:]) == "the cat"


# ------------------------------------------------------------------ capture names
def test_capture_as_one_string(model):
    ids = model.tokenize("the cat sat", bos=True)
    tr = model.run(ids, capture="attn")                  # one name, not the letters a, t, n
    c = model.config
    assert tr.attn.shape == (c.n_layers, c.n_heads, len(ids), len(ids))
    assert tr.resid is None and tr.logits is None and tr.stats is None
    assert np.allclose(tr.attn.sum(-1), 1, atol=1e-5)
    tr2 = model.run(ids, capture="stats")
    assert tr2.stats is not None and tr2.attn is None


def test_capture_any_iterable(model):
    ids = model.tokenize("the cat sat", bos=True)
    ref = model.run(ids, capture=("attn", "logits"))
    for cap in (["attn", "logits"], {"attn", "logits"}, (n for n in ("attn", "logits")), iter(["logits", "attn"])):
        tr = model.run(ids, capture=cap)
        assert np.array_equal(tr.attn, ref.attn) and np.array_equal(tr.logits, ref.logits) and tr.resid is None
    with pytest.raises(TypeError, match="strings"):
        model.run(ids, capture=["attn", 3])
    with pytest.raises(ValueError, match="unknown capture"):
        model.run(ids, capture="attention")


# ------------------------------------------------------------------ Trace: file name and repr
def test_trace_save_load_agree_on_the_file_name(model, tmp_path):
    ids = model.tokenize("the cat sat on the mat", bos=True)
    tr = model.run(ids, capture=("attn", "stats", "logits"), layers=[0, 2])
    written = tr.save(tmp_path / "tr")
    assert written == str(tmp_path / "tr.npz") and sorted(p.name for p in tmp_path.iterdir()) == ["tr.npz"]
    for name in ("tr", "tr.npz"):                        # both name the same file
        back = sl.Trace.load(tmp_path / name)
        assert np.array_equal(back.attn, tr.attn) and np.array_equal(back.logits, tr.logits)
        assert np.array_equal(back.stats.entropy, tr.stats.entropy)
        assert back.layers == [0, 2] and back.meta == tr.meta and back.resid is None
    assert tr.save(str(tmp_path / "other.npz")) == str(tmp_path / "other.npz")
    assert not (tmp_path / "other.npz.npz").exists()


def test_trace_repr_is_short(model):
    ids = model.tokenize("the cat sat on the mat", bos=True)
    T, c = len(ids), model.config
    tr = model.run(ids, capture=("attn", "resid", "logits", "stats"), layers=[1, 2])
    r = repr(tr)
    assert "\n" not in r and len(r) < 400, r
    assert f"attn ({2}, {c.n_heads}, {T}, {T}) float32" in r
    assert f"resid ({c.n_layers + 1}, {T}, {c.d_model}) float32" in r
    assert f"logits ({T}, {c.vocab_size}) float32" in r and f"ids ({T},) int64" in r
    assert model.name in r and "layers [1, 2]" in r and f"bos_token_id={c.bos_token_id}" in r
    assert "array(" not in r and "\n" not in repr(tr.stats)


# ------------------------------------------------------------------ memory check before allocating
def test_capture_bytes_match_the_buffers(model):
    c = model.config
    B, T, sel = 2, 7, [0, 2]
    ids = np.ones((B, T), np.int64)
    need = model.capture_bytes(T, ("attn", "resid", "logits", "stats"), layers=sel, logits_from=3, B=B)
    # the brief's formula, written out: attn is B*L'*H*T*T*4 bytes
    assert need == {"attn": B * len(sel) * c.n_heads * T * T * 4, "resid": B * (c.n_layers + 1) * T * c.d_model * 4,
                    "logits": B * (T - 3) * c.vocab_size * 4, "stats": 3 * B * len(sel) * c.n_heads * T * 4}
    tr = model.run(ids, capture=("attn", "resid", "logits", "stats"), layers=sel, logits_from=3, progress=False)
    got = {"attn": tr.attn.nbytes, "resid": tr.resid.nbytes, "logits": tr.logits.nbytes,
           "stats": sum(a.nbytes for a in vars(tr.stats).values())}
    assert got == need


def test_too_large_request_names_cheaper_captures(model, monkeypatch):
    from sinklab import model as sm

    ids = np.arange(1, 9)
    attn_bytes = model.capture_bytes(8, "attn")["attn"]
    monkeypatch.setattr(sm, "available_memory", lambda: attn_bytes - 1)
    with pytest.raises(MemoryError, match=r"layers=\[\.\.\.\].*capture=\"stats\"") as e:
        model.run(ids, capture="attn")
    assert f"{attn_bytes / 1e6:.1f} MB" in str(e.value)
    assert model.run(ids, capture="attn", layers=[0]).attn.shape[0] == 1   # the cheaper requests run
    assert model.run(ids, capture="stats").stats is not None


def test_available_memory_falls_back_cleanly(monkeypatch, tmp_path):
    import sys
    from sinklab import system as sm

    monkeypatch.setitem(sys.modules, "psutil", None)      # psutil not installed: read /proc/meminfo
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       16000000 kB\nMemFree:         1000000 kB\nMemAvailable:    1234567 kB\n")
    monkeypatch.setattr(sm, "MEMINFO", str(meminfo))
    assert sm.available_memory() == 1234567 * 1024
    monkeypatch.setattr(sm, "MEMINFO", str(tmp_path / "absent"))
    assert sm.available_memory() is None                  # unknown: no check, no crash


def _mem_available_bytes():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    pytest.skip("no /proc/meminfo on this system")


def test_request_larger_than_the_machine_raises_before_allocating(smollm2_gguf):
    """SmolLM2 at its full context: attn for 30 layers x 9 heads x 8192^2 x 4 bytes = 72.5 GB per
    sequence; with enough sequences it exceeds this machine's memory whatever its size."""
    import tracemalloc

    m = sl.load(smollm2_gguf)
    c, T = m.config, m.config.context_length
    per_seq = c.n_layers * c.n_heads * T * T * 4
    assert (T, per_seq) == (8192, 72_477_573_120)
    B = _mem_available_bytes() // per_seq + 2
    ids = np.ones((B, T), np.int64)
    tracemalloc.start()
    try:
        with pytest.raises(MemoryError, match=r"capture=\"stats\"") as e:
            m.run(ids, capture="attn", progress=False)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, peak                           # nothing of the GB-sized buffers was allocated
    msg = str(e.value)
    assert f"{B * per_seq / 1e9:.2f} GB" in msg and "available" in msg and "layers=[...]" in msg


def test_text_instead_of_ids_says_to_tokenize(model):
    with pytest.raises(TypeError, match="tokenize"):
        model.run("some text")


def test_ragged_ids_name_lengths(model):
    with pytest.raises(ValueError, match="ragged.*lengths="):
        model.run([[1, 2, 3], [4, 5]])


@pytest.mark.parametrize("kw", [{"mask_first": "yes"}, {"zero_first_value": 3}, {"mask_first": [(0, 1, 2)]},
                                {"mask_first": ["ab"]}, {"head_scale": 0.0}])
def test_intervention_head_sets_of_the_wrong_kind_fail_at_construction(kw):
    """Before, Intervention(mask_first="yes") was accepted and failed later inside int('y')."""
    with pytest.raises(TypeError, match=next(iter(kw))):
        sl.Intervention(**kw)
