"""Bad input to a loaded model gets a Python exception naming the problem, never a crash."""
import numpy as np
import pytest

import sinklab as sl
from sinklab import _core
from reference_models import SPECS, make_hf_model, save_hf


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
