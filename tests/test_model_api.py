"""The public doors of Model that analyses use instead of the C core (issue 23): the capture
table in sinklab.trace, run(key_start=, keep_first=) and vjp_norms, each against what the C core
itself returns for the same call (bitwise: the same core computation, only reached through
Model), and the single checks of eps and layers."""
import numpy as np
import pytest

from tests.support import reference_models as rm

rm.require("torch")
rm.require("transformers")

import sinklab as sl  # noqa: E402
from sinklab import trace  # noqa: E402
from sinklab.analysis.sinks import check_eps, sink_indicator, sink_rate_of  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    hf = rm.make_hf_model(rm.SPECS["gqa_tied"])
    return sl.load(str(rm.save_hf(hf, tmp_path_factory.mktemp("gqa_tied"))), quiet=True)


def test_capture_table_gives_run_shapes(tiny):
    """Every buffer of the table has the shape run() returns, for a batch and a layer subset."""
    T, layers, lf = 9, [0, 1], 3
    ids = np.stack([rm.random_ids(tiny.config.vocab_size, T, seed=s) for s in (1, 2)])
    tr = tiny.run(ids, capture=trace.CAPTURES, layers=layers, logits_from=lf, progress=False)
    shapes = trace.buffer_shapes(tiny.config, T, len(layers), lf)
    assert set(shapes) == {b.name for b in trace.BUFFERS}
    for name, shape in shapes.items():
        a = getattr(tr.stats, name) if trace.capture_of(name) == "stats" else getattr(tr, name)
        assert a.shape == (2,) + shape, name
        assert len(trace.buffer_axes(name)) == len(shape)


def test_run_key_start_is_the_core_forward(tiny):
    """run(key_start=, keep_first=) gives the logits the C forward gives with the packing mask,
    and the mask changes them (two documents in one window)."""
    T = 10
    ids = rm.random_ids(tiny.config.vocab_size, T, seed=3)
    ks = np.array([0] * 4 + [4] * 6, np.int64)
    for keep_first in (False, True):
        want = np.empty((T, tiny.config.vocab_size), np.float32)
        sl._core.model_forward(tiny._handle, ids, logits=want, key_start=ks, keep_first=keep_first)
        got = tiny.run(ids, capture=("logits",), key_start=ks, keep_first=keep_first, progress=False).logits
        assert np.array_equal(got, want)
    plain = tiny.run(ids, capture=("logits",), progress=False).logits
    assert np.array_equal(plain[:4], got[:4]) and not np.array_equal(plain[4:], got[4:])
    with pytest.raises(ValueError, match="key_start"):
        tiny.run(ids, capture=("logits",), key_start=ks[:-1], progress=False)


def test_vjp_norms_are_the_vjp_gradients_norms(tiny):
    """vjp_norms' squared norms are those of vjp's gradients per source position (to float32
    rounding of the gradients; the positions after the target, whose gradients are zero, are
    left out), and its spectral norms are the largest singular values of the Jacobian blocks
    from jacobian()."""
    T, d, L = 8, tiny.config.d_model, tiny.config.n_layers
    ids = rm.random_ids(tiny.config.vocab_size, T, seed=4)
    cot = np.random.default_rng(0).standard_normal((3, d)).astype(np.float32)
    r = tiny.vjp_norms(ids, cot, at=(L, 5), layers=[2, 0])
    assert r.layers == [0, 2] and r.sq.shape == (2, 3, 6) and r.spectral is None
    g = tiny.vjp(ids, cot, at=(L, 5), layers=[0, 2]).astype(np.float64)   # (3, 2, T, d)
    want = (g ** 2).sum(axis=-1).transpose(1, 0, 2)                       # (2, 3, T)
    np.testing.assert_allclose(r.sq, want[:, :, :6], rtol=1e-5, atol=1e-10)
    assert np.all(want[:, :, 6:] == 0)
    eye = np.eye(d, dtype=np.float32)
    s = tiny.vjp_norms(ids, eye, at=(L, 5), layers=[1], spectral=True)
    J = tiny.jacobian(ids, of=(L, 5), wrt=1, progress=False).astype(np.float64)  # (d, T, d)
    sv = [np.linalg.norm(J[:, j, :], 2) for j in range(6)]
    np.testing.assert_allclose(s.spectral[0], sv, rtol=1e-4, atol=1e-6 * max(sv))
    assert s.iters >= 1
    with pytest.raises(ValueError, match="layers"):
        tiny.vjp_norms(ids, cot, at=(2, 5), layers=[3])


def test_one_eps_check_and_sink_rate():
    imp = np.array([[0.1, 0.5], [0.9, 0.3]])
    assert sink_rate_of(imp, 0.3) == 0.5 and sink_rate_of(imp, 0.05) == 1.0
    assert sink_indicator(imp, 0.3).dtype == np.float64
    assert np.array_equal(sink_indicator(imp, 0.3), [[0.0, 1.0], [1.0, 0.0]])
    for bad in (0.0, 1.0, -0.2, 1.5):
        with pytest.raises(ValueError, match=r"eps must lie in \(0, 1\)"):
            check_eps(bad)
    attn = np.zeros((1, 1, 3, 3))
    attn[..., 0] = 1.0
    assert sl.sink_rate(attn, 0.3) == sink_rate_of(sl.first_token_importance(attn), 0.3) == 1.0
