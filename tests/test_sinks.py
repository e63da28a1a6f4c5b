"""Sink metrics against an independent float64 implementation of Gu et al.'s definition, written here
with explicit loops over the formula, applied to attention captured from Hugging Face."""
import numpy as np
import pytest

import sinklab as sl
from tests.support.reference_models import SPECS, hf_forward, make_hf_model, random_ids


def importance_loops(A: np.ndarray, k: int) -> float:
    """a_k = 1/(T-k) * sum_{i=k}^{T-1} A[i, k], term by term in float64 (0-based positions)."""
    T = A.shape[0]
    total = 0.0
    for i in range(k, T):
        total += float(A[i, k])
    return total / (T - k)


def sink_rate_loops(attn: np.ndarray, eps: float, k: int = 0) -> float:
    """Sink_k^eps = mean over (prompt, layer, head) of 1[a_k > eps]."""
    a = attn.reshape((-1,) + attn.shape[-4:]) if attn.ndim == 5 else attn[None]
    hits, n = 0, 0
    for p in range(a.shape[0]):
        for l in range(a.shape[1]):
            for h in range(a.shape[2]):
                hits += importance_loops(a[p, l, h].astype(np.float64), k) > eps
                n += 1
    return hits / n


@pytest.fixture(scope="module")
def hf_attn():
    model = make_hf_model(SPECS["gqa_tied"])
    return np.stack([hf_forward(model, random_ids(model.config.vocab_size, 40, seed=s))["attn"]
                     for s in range(3)])  # (3, L, H, T, T)


def test_importance_matches_formula_on_hf_attention(hf_attn):
    attn = hf_attn[0]
    got = sl.key_importance(attn)
    L, H, T, _ = attn.shape
    for l in range(L):
        for h in range(H):
            for k in (0, 1, T // 2, T - 1):
                assert got[l, h, k] == pytest.approx(importance_loops(attn[l, h].astype(np.float64), k), rel=1e-12)
    np.testing.assert_allclose(sl.first_token_importance(attn), got[..., 0], rtol=1e-12)
    np.testing.assert_allclose(sl.first_token_importance(attn, k=5), got[..., 5], rtol=1e-12)


@pytest.mark.parametrize("eps", [0.05, 0.1, 0.3, 0.8])
def test_sink_rate_matches_formula(hf_attn, eps):
    assert sl.sink_rate(hf_attn[0], eps=eps) == pytest.approx(sink_rate_loops(hf_attn[0], eps), abs=1e-12)
    # several prompts: the indicator averaged over (prompt, layer, head)
    assert sl.sink_rate(hf_attn, eps=eps) == pytest.approx(sink_rate_loops(hf_attn, eps), abs=1e-12)
    assert sl.sink_rate(hf_attn, eps=eps, k=3) == pytest.approx(sink_rate_loops(hf_attn, eps, k=3), abs=1e-12)


def test_sink_rate_known_patterns():
    T = 8
    sink = np.zeros((1, 2, T, T))
    sink[..., :, 0] = 1.0             # every query attends only to token 0
    uniform = np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]
    attn = np.concatenate([sink, uniform[None, None].repeat(2, axis=1)], axis=0)  # (2 layers, 2 heads)
    assert sl.sink_rate(attn, eps=0.5) == 0.5   # uniform heads have a_0 = H_8/8 = 0.34
    assert sl.sink_rate(attn, eps=0.3) == 1.0
    # uniform causal attention: a_0 = mean_i 1/(i+1) = H_T / T
    assert sl.first_token_importance(attn)[1, 0] == pytest.approx(sum(1 / (i + 1) for i in range(T)) / T)


@pytest.mark.parametrize("eps", [0.0, 1.0, -0.1, 1.5])
def test_eps_outside_unit_interval_is_rejected(hf_attn, eps):
    with pytest.raises(ValueError, match="eps"):
        sl.sink_rate(hf_attn[0], eps=eps)


def test_bad_attention_shapes_are_rejected():
    with pytest.raises(ValueError, match="shape"):
        sl.sink_rate(np.zeros((2, 3, 4, 5)))
    with pytest.raises(ValueError, match="shape"):
        sl.key_importance(np.zeros((3, 4, 4)))
    with pytest.raises(ValueError, match="outside"):
        sl.first_token_importance(np.zeros((1, 1, 4, 4)), k=4)
