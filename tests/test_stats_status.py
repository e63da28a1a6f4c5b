"""Intervals (sinklab.analysis.stats) against SciPy and against their coverage on simulated data,
and the status rules (sinklab.analysis.status) fed synthetic intervals: every outcome, including
"contradicted", is reachable and each is given for the documented reason."""
import math

import numpy as np
import pytest

from sinklab.analysis import bos_removal as R
from sinklab.analysis import stats as S
from sinklab.analysis import status as V

scipy_stats = pytest.importorskip("scipy.stats")


def test_t_and_z_quantiles_match_scipy():
    for df in (1, 2, 3, 5, 10, 30, 200):
        assert S._t(0.95, df) == pytest.approx(scipy_stats.t.ppf(0.975, df), rel=1e-9)
    for level in (0.5, 0.9, 0.95, 0.99):
        assert S._z(level) == pytest.approx(scipy_stats.norm.ppf((1 + level) / 2), rel=1e-12)


@pytest.mark.parametrize("k,n", [(0, 10), (3, 10), (10, 10), (45, 50), (200, 400), (1, 1000)])
def test_wilson_matches_scipy(k, n):
    ref = scipy_stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    iv = S.wilson(k, n)
    assert (iv.lo, iv.hi) == pytest.approx((ref.low, ref.high), abs=1e-12)
    assert iv.value == k / n


def test_bootstrap_mean_matches_scipy_percentile():
    x = np.random.default_rng(1).gamma(2.0, 1.0, size=60)
    ref = scipy_stats.bootstrap((x,), np.mean, n_resamples=20000, method="percentile",
                                random_state=np.random.default_rng(2)).confidence_interval
    iv = S.mean_ci(x, n_boot=20000)
    assert iv.value == pytest.approx(x.mean(), rel=1e-15)
    # two independent Monte Carlo estimates of the same percentiles
    assert iv.lo == pytest.approx(ref.low, abs=0.03) and iv.hi == pytest.approx(ref.high, abs=0.03)


def test_bootstrap_coverage_of_the_mean():
    """Over 300 simulated samples of 40 normal draws, the 95% interval covers the true mean in
    about 95% of them (the binomial 99.9% band around 0.95 for 300 trials is about [0.90, 0.99])."""
    rng = np.random.default_rng(7)
    hits = sum(S.mean_ci(rng.normal(2.0, 1.5, 40), n_boot=600, seed=i).excludes(2.0) is False for i in range(300))
    assert 0.89 <= hits / 300 <= 0.99


def test_paired_difference_and_ratio():
    rng = np.random.default_rng(3)
    a = rng.normal(0, 1, 80)
    b = a + 0.5 + rng.normal(0, 0.1, 80)              # a strong paired shift, hidden by the spread of a
    d = S.paired_difference(a, b)
    assert d.value == pytest.approx(0.5 + (b - a - 0.5).mean(), rel=1e-12) and d.above(0.4) and d.below(0.6)
    r = S.ratio_of_means(np.full(10, 3.0) + rng.normal(0, 0.01, 10), np.full(10, 1.5))
    assert r.value == pytest.approx(2.0, abs=0.01) and not r.excludes(2.0)
    with pytest.raises(ValueError, match="paired units differ"):
        S.paired_difference(a, b[:-1])


def test_seed_summary_matches_numpy_and_t_interval():
    v = [0.10, 0.14, 0.19]
    s = S.over_seeds(v)
    assert s.mean == pytest.approx(np.mean(v)) and s.sd == pytest.approx(np.std(v, ddof=1))
    h = scipy_stats.t.ppf(0.975, 2) * np.std(v, ddof=1) / math.sqrt(3)
    assert (s.interval.lo, s.interval.hi) == pytest.approx((np.mean(v) - h, np.mean(v) + h), rel=1e-9)
    assert not S.over_seeds([1.0]).interval.defined


def test_describe_difference_names_only_what_excludes_zero():
    assert S.describe_difference(S.Interval(0.02, -0.01, 0.05, 30)).startswith("no detectable")
    assert "95% CI +0.010 to +0.050" in S.describe_difference(S.Interval(0.03, 0.01, 0.05, 30))


iv = S.Interval


@pytest.mark.parametrize("effect,predicted,status", [
    (iv(0.3, 0.2, 0.4, 20), +1, V.REPRODUCED), (iv(-0.3, -0.4, -0.2, 20), +1, V.CONTRADICTED),
    (iv(0.1, -0.1, 0.3, 20), +1, V.INCONCLUSIVE), (iv(-0.3, -0.4, -0.2, 20), -1, V.REPRODUCED),
    (iv(0.3, float("nan"), float("nan"), 1), +1, V.INCONCLUSIVE)])
def test_directional(effect, predicted, status):
    assert V.directional(effect, predicted, "x").status == status


@pytest.mark.parametrize("effect,status", [
    (iv(3.0, 2.0, 5.0, 20), V.REPRODUCED), (iv(1.1, 1.0, 1.2, 20), V.CONTRADICTED), (iv(1.6, 1.2, 2.0, 20), V.INCONCLUSIVE)])
def test_threshold_upward(effect, status):
    assert V.threshold(effect, 1.5, 1.0, "ppl ratio").status == status


@pytest.mark.parametrize("effect,status", [
    (iv(0.1, 0.0, 0.3, 20), V.REPRODUCED), (iv(0.9, 0.8, 1.0, 20), V.CONTRADICTED), (iv(0.5, 0.3, 0.7, 20), V.INCONCLUSIVE)])
def test_threshold_downward(effect, status):
    assert V.threshold(effect, 0.5, 1.0, "sink-rate ratio").status == status


@pytest.mark.parametrize("effect,status", [
    (iv(0.01, -0.02, 0.03, 50), V.REPRODUCED), (iv(0.3, 0.2, 0.4, 50), V.CONTRADICTED),
    (iv(0.05, -0.1, 0.2, 50), V.INCONCLUSIVE)])
def test_equivalence(effect, status):
    assert V.equivalence(effect, 0.1, "delta").status == status


def test_consistency_and_combine():
    assert V.consistency(10, 10, "Prop. 3.1").status == V.CONSISTENCY
    assert V.consistency(9, 10, "Prop. 3.1").status == V.CONTRADICTED
    r, c, i = (V.Verdict(s, "x") for s in (V.REPRODUCED, V.CONTRADICTED, V.INCONCLUSIVE))
    assert V.combine(r, r).status == V.REPRODUCED and V.combine(r, c).status == V.CONTRADICTED
    assert V.combine(r, i).status == V.INCONCLUSIVE
    with pytest.raises(ValueError):
        V.Verdict("reproduced here", "literal text is not a status")


class _Ppl:
    def __init__(self, nll, n):
        self.nll, self.n_predicted = np.asarray(nll, float), np.asarray(n)


def _imp(rate, P=30, L=4, H=4, seed=0):
    """(P, L, H) importances with about ``rate`` of entries above 0.3."""
    rng = np.random.default_rng(seed)
    return np.where(rng.random((P, L, H)) < rate, 0.9, 0.05)


def test_bos_removal_criteria_every_outcome():
    n = np.full(30, 100)
    base = _Ppl(np.random.default_rng(0).normal(3.0, 0.2, 30), n)
    worse = _Ppl(base.nll + 1.5, n)                       # ×4.5 perplexity
    same = _Ppl(base.nll + np.random.default_rng(1).normal(0, 0.01, 30), n)
    better = _Ppl(base.nll - 0.5, n)
    assert R.criterion_quality_removed(base, worse, True).status == V.REPRODUCED
    assert R.criterion_quality_removed(base, better, True).status == V.CONTRADICTED
    assert R.criterion_quality_removed(base, same, False).status == V.REPRODUCED      # no effect, as predicted
    assert R.criterion_quality_removed(base, worse, False).status == V.CONTRADICTED   # an effect where none is
    assert R.criterion_quality_removed(base, worse, None).status == V.NOT_TESTABLE
    w = _imp(0.8)
    assert R.criterion_sinks_removed(w, _imp(0.0, seed=1), 0.3, True).status == V.REPRODUCED
    assert R.criterion_sinks_removed(w, _imp(0.8, seed=2), 0.3, True).status == V.CONTRADICTED
    assert R.criterion_sinks_removed(_imp(0.0), _imp(0.0, seed=3), 0.3, True).status == V.NOT_TESTABLE
    assert R.criterion_sinks_removed(w, w, 0.3, False).status == V.REPRODUCED
    assert R.criterion_sinks(w).status == V.REPRODUCED and R.criterion_sinks(_imp(0.0)).status == V.INCONCLUSIVE
    right, wrong = np.ones(100), np.r_[np.ones(30), np.zeros(70)]
    assert R.criterion_task_removed(right, wrong, True, "task").status == V.REPRODUCED
    assert R.criterion_task_removed(wrong, right, True, "task").status == V.CONTRADICTED
    assert R.criterion_task_removed(right, right, True, "task").status == V.INCONCLUSIVE   # at ceiling: no test
    with pytest.raises(ValueError, match="same predicted tokens"):
        R.nll_change(base, _Ppl(base.nll, n + 1))


def test_paired_proportions_newcombe():
    """Newcombe's paired interval: its coverage on simulated correlated pairs (400 samples of 60
    pairs; the binomial 99.9% band around 0.95 is about [0.92, 0.98]), and wide at ceiling."""
    at_ceiling = S.paired_proportion_difference([1, 1], [1, 1])
    assert at_ceiling.value == 0 and at_ceiling.lo < -0.5 and at_ceiling.hi > 0.5
    rng = np.random.default_rng(11)
    hits = 0
    for _ in range(400):
        x = rng.random(60) < 0.7
        y = np.where(rng.random(60) < 0.8, x, rng.random(60) < 0.5)   # correlated with x
        # true difference: P(y) - P(x) = 0.8 * 0.7 + 0.2 * 0.5 - 0.7 = -0.04
        hits += not S.paired_proportion_difference(x.astype(float), y.astype(float)).excludes(-0.04)
    assert 0.92 <= hits / 400 <= 0.99
    with pytest.raises(ValueError, match="0/1"):
        S.paired_proportion_difference([0.5], [1])
