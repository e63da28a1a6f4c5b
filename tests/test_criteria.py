"""The criteria beside the perturbation and no-op analyses, fed synthetic results: every outcome
(reproduced, contradicted, inconclusive, not testable) is reachable, and each for its reason."""
import numpy as np
import pytest

from sinklab.analysis import status as V
from sinklab.analysis.noop import NoopResult, criterion_noop, noop_log_ratios
from sinklab.analysis.perturbation import criterion_fig23, entropy_change_by_passage, spread_log_ratio_by_passage


class FakeStudy:
    """What criterion_fig23 reads of a PerturbationStudy: per-swap spread ratios, the passage of
    each swap, per-passage entropies."""

    def __init__(self, log_ratio, entropy_change, P=12, swaps=3, L=6, seed=0):
        rng = np.random.default_rng(seed)
        self.passage = np.repeat(np.arange(P), swaps)
        lr = log_ratio + 0.05 * rng.standard_normal((P * swaps, L + 1))
        self._ratios = np.exp(lr)
        self._ratios[:, 0] = np.nan                          # layer 0: no spread in either setting
        base = 2.0 + 0.1 * rng.standard_normal((P, L))
        self._ent = {"bos_all_keys": base - 1.0, "bos_text_keys": base,
                     "nobos": base + entropy_change + 0.01 * rng.standard_normal((P, L))}

    def spread_ratios(self, relative=True):
        return self._ratios

    def entropies(self):
        return self._ent


@pytest.mark.parametrize("log_ratio,ent,spread_status,ent_status", [
    (0.5, 0.3, V.REPRODUCED, V.REPRODUCED), (-0.5, -0.3, V.CONTRADICTED, V.CONTRADICTED),
    (0.0, 0.0, V.INCONCLUSIVE, V.INCONCLUSIVE)])
def test_fig23_outcomes(log_ratio, ent, spread_status, ent_status):
    st = FakeStudy(log_ratio, ent)            # (0, 0): noise around no effect, the interval covers 0
    v = criterion_fig23(st, trained_with_bos=True)
    assert (v["spread"].status, v["entropy"].status) == (spread_status, ent_status)
    # the passage is the unit: 12 values, each the mean of its swaps and layers >= 1, in float64
    lr = spread_log_ratio_by_passage(st)
    ref = [np.log(st._ratios[st.passage == p, 1:]).mean() for p in range(12)]
    np.testing.assert_allclose(lr, ref, rtol=1e-12)
    np.testing.assert_allclose(entropy_change_by_passage(st), (st._ent["nobos"] - st._ent["bos_text_keys"]).mean(1))


def test_fig23_on_a_model_without_a_fixed_bos_is_not_testable():
    v = criterion_fig23(FakeStudy(0.5, 0.3), trained_with_bos=False)
    assert v["spread"].status == v["entropy"].status == V.NOT_TESTABLE
    assert "not trained with a fixed" in v["spread"].reason and v["spread_log_ratio"].above(0)


def _noop(out_sink, value0, P=10, L=3, H=4, G=2, T=20, seed=0):
    """A NoopResult whose heads (l, h) with h < 2 are sink heads; their output norm relative to the
    residual stream is ``out_sink`` times the others', and position 0's value norm ``value0``
    times the median token's."""
    rng = np.random.default_rng(seed)
    ids, vn, on, tf, rn = [], [], [], [], []
    for _ in range(P):
        to_first = np.full((L, H, T), 0.1)
        to_first[:, :2] = 0.9
        out = 1.0 + 0.05 * rng.random((L, H, T))
        out[:, :2] *= out_sink
        val = 1.0 + 0.05 * rng.random((L, H, T))
        val[:, :, 0] = value0
        ids.append(np.arange(T))
        vn.append(val)
        on.append(out)
        tf.append(to_first)
        rn.append(np.full((L, T), 10.0))
    return NoopResult(ids, vn, on, tf, rn, meta={"n_kv_heads": G})


@pytest.mark.parametrize("out_sink,value0,s_out,s_val", [
    (0.3, 0.2, V.REPRODUCED, V.REPRODUCED), (3.0, 5.0, V.CONTRADICTED, V.CONTRADICTED)])
def test_noop_outcomes(out_sink, value0, s_out, s_val):
    v = criterion_noop(_noop(out_sink, value0))
    assert (v["out_norm"].status, v["first_value"].status) == (s_out, s_val)
    lr = noop_log_ratios(_noop(out_sink, value0))
    assert lr["out_norm"].shape == (10,) and np.all(np.sign(lr["out_norm"]) == np.sign(np.log(out_sink)))


def test_noop_without_sink_heads_is_not_testable():
    res = _noop(0.3, 0.2)
    for tf in res.to_first:
        tf[:] = 0.1                                   # no head puts more than 0.5 on position 0
    v = criterion_noop(res)
    assert v["out_norm"].status == v["first_value"].status == V.NOT_TESTABLE
