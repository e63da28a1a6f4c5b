"""Streaming attention statistics (no T×T buffer) against full capture and float64 formulas."""
import numpy as np
import pytest

import sinklab as sl
from tests.support.reference_models import SPECS, hf_forward, make_hf_model, save_hf


def entropy64(attn):
    a = attn.astype(np.float64)
    return -np.where(a > 0, a * np.log(np.where(a > 0, a, 1.0)), 0.0).sum(-1)


def check_stats(stats, attn):
    np.testing.assert_allclose(stats.importance, sl.key_importance(attn), atol=1e-5, rtol=0)
    np.testing.assert_allclose(stats.to_first, attn[..., :, 0], atol=1e-5, rtol=0)
    np.testing.assert_allclose(stats.entropy, entropy64(attn), atol=1e-5, rtol=0)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    hf = make_hf_model(SPECS["odd"])
    d = tmp_path_factory.mktemp("stats")
    save_hf(hf, d)
    return hf, sl.load(d)


@pytest.mark.parametrize("T", [1, 2, 64, 65, 200])
def test_stats_match_hf_attention(tiny, T):
    hf, model = tiny
    ids = np.random.default_rng(T).integers(3, model.config.vocab_size, T)
    ref = hf_forward(hf, ids)["attn"]
    tr = model.run(ids, capture=("stats",))
    assert tr.attn is None and tr.stats.importance.shape == ref.shape[:-1]
    check_stats(tr.stats, ref)


def test_stats_layers_and_batch(tiny):
    _, model = tiny
    ids = np.random.default_rng(0).integers(3, model.config.vocab_size, (2, 30))
    tr = model.run(ids, capture=("stats", "attn"), layers=[1, 3], progress=False)
    assert tr.stats.entropy.shape == (2, 2, model.config.n_heads, 30)
    check_stats(tr.stats, tr.attn)


def test_stats_on_smollm2(smollm2_gguf):
    model = sl.load(smollm2_gguf)
    ids = np.random.default_rng(1).integers(0, model.config.vocab_size, 512)
    ids[0] = model.config.bos_token_id
    full = model.run(ids, capture=("attn", "logits"))
    lean = model.run(ids, capture=("stats", "logits"))
    check_stats(lean.stats, full.attn)
    assert np.array_equal(lean.logits, full.logits)  # capture does not change the computation
