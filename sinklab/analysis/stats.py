"""Uncertainty for every headline number: bootstrap intervals over prompts, Wilson intervals for
accuracies, mean ± sd over seeds, and the one wording rule the report uses for a difference.

The unit of resampling is always the independent draw: a prompt (passage, swap, trial), never a
(prompt, layer, head) entry, since the heads of one forward pass are not independent of each
other. A statistic over heads is computed per prompt first and the prompts are resampled
(:func:`bootstrap`), or, where the heads themselves are the population sampled (a per-head
comparison across a model's heads), rows and columns are resampled together
(:func:`bootstrap_crossed`).

Intervals are percentile bootstrap intervals (Efron & Tibshirani 1993, §13.3), 2,000 resamples,
seeded, so the same inputs give the same interval on every machine.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Sequence, Union

import numpy as np

LEVEL = 0.95
N_BOOT = 2000
SEED = 20250402           # the paper's arXiv number, so that intervals are reproducible


@dataclass(frozen=True)
class Interval:
    """A point estimate with its confidence interval.

    Attributes:
        value: the estimate on the whole sample.
        lo, hi: the interval's ends (``lo <= hi``; NaN when undefined, e.g. ``n < 2``).
        n: number of independent units (prompts, trials, seeds) it rests on.
        level: coverage of the interval (0.95).
        method: ``"bootstrap"``, ``"wilson"``, ``"t"`` (mean ± t·sd/√n over seeds) or ``"exact"``.
    """

    value: float
    lo: float
    hi: float
    n: int
    level: float = LEVEL
    method: str = "bootstrap"

    @property
    def defined(self) -> bool:
        return bool(np.isfinite(self.lo) and np.isfinite(self.hi))

    def excludes(self, x: float = 0.0) -> bool:
        """True when ``x`` lies outside the interval (an effect detectably different from ``x``)."""
        return self.defined and (self.lo > x or self.hi < x)

    def above(self, x: float) -> bool:
        """The whole interval lies above ``x``."""
        return self.defined and self.lo > x

    def below(self, x: float) -> bool:
        """The whole interval lies below ``x``."""
        return self.defined and self.hi < x

    @property
    def half_width(self) -> float:
        return 0.5 * (self.hi - self.lo) if self.defined else float("nan")

    def map(self, f: Callable[[float], float]) -> "Interval":
        """The interval of a monotone increasing transform (e.g. ``math.exp`` of a mean NLL)."""
        return Interval(f(self.value), f(self.lo) if self.defined else float("nan"),
                        f(self.hi) if self.defined else float("nan"), self.n, self.level, self.method)

    def scaled(self, k: float) -> "Interval":
        """``k`` times the interval (``k > 0``; e.g. 100 for percentages)."""
        return self.map(lambda v: k * v)

    def fmt(self, spec: str = ".3f", unit: str = "") -> str:
        """``"0.123 [0.100, 0.150]"``; without an interval just the value."""
        v = format(self.value, spec) + unit
        if not self.defined:
            return v
        return f"{v} [{format(self.lo, spec)}, {format(self.hi, spec)}]"

    def to_dict(self) -> Dict[str, Any]:
        return {"value": self.value, "lo": self.lo, "hi": self.hi, "n": self.n, "level": self.level,
                "method": self.method}

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Interval":
        nan = float("nan")
        g = lambda k: nan if d.get(k) is None else float(d[k])  # noqa: E731  (JSON wrote NaN as None)
        return cls(g("value"), g("lo"), g("hi"), int(d.get("n", 0)), float(d.get("level", LEVEL)),
                   str(d.get("method", "bootstrap")))

    def __str__(self) -> str:
        return self.fmt()


def _rng(seed: Optional[int]) -> np.random.Generator:
    return np.random.default_rng(SEED if seed is None else seed)


def _percentile(boot: np.ndarray, level: float) -> tuple:
    boot = boot[np.isfinite(boot)]
    if boot.size == 0:
        return float("nan"), float("nan")
    a = (1 - level) / 2
    return float(np.quantile(boot, a)), float(np.quantile(boot, 1 - a))


# resamples evaluated together by a row-wise statistic: at most this many indices at a time
_ROWS_CHUNK = 1 << 22


def bootstrap(stat: Callable[[np.ndarray], float], n: int, n_boot: int = N_BOOT, level: float = LEVEL,
              seed: Optional[int] = None,
              rows: Optional[Callable[[np.ndarray], np.ndarray]] = None) -> Interval:
    """Percentile bootstrap of ``stat`` over ``n`` independent units.

    Args:
        stat: maps an int array of unit indices (length ``n``, with repeats) to a number; it is
            called once on ``arange(n)`` for the estimate and ``n_boot`` times on resamples.
        n: number of units (prompts, trials).
        rows: optional, the same statistic for many resamples at once: maps an (r, n) index array
            to (r,) numbers, row k equal to ``stat(idx[k])`` (it replaces the ``n_boot`` Python
            calls; the resamples, and so the interval, are the same).

    Returns:
        An :class:`Interval` (``lo = hi = NaN`` when ``n < 2``).
    """
    n = int(n)
    if n < 1:
        raise ValueError("bootstrap needs at least one unit")
    value = float(stat(np.arange(n)))
    if n < 2:
        return Interval(value, float("nan"), float("nan"), n, level)
    rng = _rng(seed)
    idx = rng.integers(0, n, size=(int(n_boot), n))
    if rows is None:
        boot = np.fromiter((stat(i) for i in idx), float, count=len(idx))
    else:
        step = max(1, _ROWS_CHUNK // n)
        boot = np.concatenate([np.asarray(rows(idx[a:a + step]), np.float64) for a in range(0, len(idx), step)])
    lo, hi = _percentile(boot, level)
    return Interval(value, lo, hi, n, level)


def _as_units(x: Any, name: str = "values") -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if a.ndim == 0 or a.shape[0] == 0:
        raise ValueError(f"{name}: need a non-empty array with the units (prompts) on axis 0, got shape {a.shape}")
    return a


def mean_ci(x: Any, n_boot: int = N_BOOT, level: float = LEVEL, seed: Optional[int] = None) -> Interval:
    """Bootstrap interval of the mean over axis 0 of ``x`` (units on axis 0; any further axes are
    averaged within each unit first, e.g. (prompts, layers, heads) for a sink rate). NaNs are
    left out of the mean."""
    a = _as_units(x)
    per_unit = a.reshape(a.shape[0], -1)
    per_unit = np.nanmean(per_unit, axis=1) if per_unit.shape[1] > 1 else per_unit[:, 0]
    ok = np.isfinite(per_unit)
    per_unit = per_unit[ok]
    if per_unit.size == 0:
        return Interval(float("nan"), float("nan"), float("nan"), 0, level)
    return bootstrap(lambda i: per_unit[i].mean(), per_unit.size, n_boot, level, seed,
                     rows=lambda idx: per_unit[idx].mean(axis=1))


def paired_difference(a: Any, b: Any, n_boot: int = N_BOOT, level: float = LEVEL,
                      seed: Optional[int] = None) -> Interval:
    """Interval of mean(b) − mean(a) where ``a[i]`` and ``b[i]`` were measured on the same unit
    (the same prompt in two conditions); units are resampled in pairs."""
    x, y = _as_units(a, "a"), _as_units(b, "b")
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"paired units differ in number: {x.shape[0]} and {y.shape[0]}")
    d = y.reshape(y.shape[0], -1).mean(axis=1) - x.reshape(x.shape[0], -1).mean(axis=1)
    return mean_ci(d, n_boot, level, seed)


def ratio_of_means(num: Any, den: Any, log: bool = False, n_boot: int = N_BOOT, level: float = LEVEL,
                   seed: Optional[int] = None) -> Interval:
    """Interval of mean(num) / mean(den) (or its natural log), units resampled in pairs."""
    x, y = _as_units(num, "num").reshape(-1), _as_units(den, "den").reshape(-1)
    if x.shape != y.shape:
        raise ValueError(f"paired units differ in number: {x.shape[0]} and {y.shape[0]}")

    def stat(i: np.ndarray) -> float:
        r = x[i].mean() / y[i].mean()
        return math.log(r) if log else r

    def rows(idx: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            r = x[idx].mean(axis=1) / y[idx].mean(axis=1)
            return np.log(r) if log else r

    return bootstrap(stat, x.size, n_boot, level, seed, rows=rows)


def weighted_mean_ci(values: Any, weights: Any, n_boot: int = N_BOOT, level: float = LEVEL,
                     seed: Optional[int] = None) -> Interval:
    """Interval of Σ values / Σ weights over units (e.g. a perplexity's mean NLL: per text the
    summed NLL and its number of predicted tokens), units resampled."""
    v, w = _as_units(values).reshape(-1), _as_units(weights).reshape(-1)
    return bootstrap(lambda i: v[i].sum() / w[i].sum(), v.size, n_boot, level, seed,
                     rows=lambda idx: v[idx].sum(axis=1) / w[idx].sum(axis=1))


def bootstrap_crossed(x: Any, stat: Optional[Callable[[np.ndarray], float]] = None, n_boot: int = N_BOOT,
                      level: float = LEVEL, seed: Optional[int] = None) -> Interval:
    """Interval for a (units, items) table whose rows (prompts) and columns (heads) are both
    samples: rows and columns are resampled independently (the crossed bootstrap, conservative
    for crossed random effects). ``stat`` maps the resampled table to a number (default mean)."""
    a = _as_units(x)
    if a.ndim != 2:
        raise ValueError(f"bootstrap_crossed takes a (units, items) table, got shape {a.shape}")
    stat = stat or (lambda t: float(np.nanmean(t)))
    value = float(stat(a))
    P, H = a.shape
    if P < 2 or H < 2:
        return Interval(value, float("nan"), float("nan"), P, level)
    rng = _rng(seed)
    boot = np.empty(int(n_boot))
    for b in range(int(n_boot)):
        boot[b] = stat(a[rng.integers(0, P, P)][:, rng.integers(0, H, H)])
    lo, hi = _percentile(boot, level)
    return Interval(value, lo, hi, P, level)


def wilson(k: int, n: int, level: float = LEVEL) -> Interval:
    """Wilson score interval of a proportion k / n (accuracy over n independent trials)."""
    k, n = int(k), int(n)
    if n < 1 or not 0 <= k <= n:
        raise ValueError(f"wilson: need 0 <= k <= n and n >= 1, got k={k}, n={n}")
    z = _z(level)
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return Interval(p, max(0.0, mid - half), min(1.0, mid + half), n, level, "wilson")


def paired_proportion_difference(a: Any, b: Any, level: float = LEVEL) -> Interval:
    """Interval of p_b − p_a for two accuracies measured on the same items (0/1 per item), by
    Newcombe's hybrid score method for paired proportions (Newcombe 1998, Stat. Med. 17:2635,
    method 10). Unlike a bootstrap it stays wide when few items agree perfectly (two trials both
    right in both conditions give ±0.66, not [0, 0]), so a task at ceiling cannot pass as "no
    effect"."""
    x, y = np.asarray(a, float).reshape(-1), np.asarray(b, float).reshape(-1)
    if x.shape != y.shape or x.size == 0:
        raise ValueError(f"paired proportions need the same non-zero number of items, got {x.size} and {y.size}")
    if not (np.isin(x, (0, 1)).all() and np.isin(y, (0, 1)).all()):
        raise ValueError("paired proportions take 0/1 outcomes")
    n = x.size
    both, only_a, only_b = int((x * y).sum()), int((x * (1 - y)).sum()), int(((1 - x) * y).sum())
    neither = n - both - only_a - only_b
    pa, pb = (both + only_a) / n, (both + only_b) / n
    wa, wb = wilson(both + only_a, n, level), wilson(both + only_b, n, level)
    den = (both + only_a) * (only_b + neither) * (both + only_b) * (only_a + neither)
    phi = (both * neither - only_a * only_b) / math.sqrt(den) if den > 0 else 0.0
    d = pb - pa
    lo = d - math.sqrt(max(0.0, (pb - wb.lo) ** 2 - 2 * phi * (pb - wb.lo) * (wa.hi - pa) + (wa.hi - pa) ** 2))
    hi = d + math.sqrt(max(0.0, (wb.hi - pb) ** 2 - 2 * phi * (wb.hi - pb) * (pa - wa.lo) + (pa - wa.lo) ** 2))
    return Interval(d, max(-1.0, lo), min(1.0, hi), n, level, "newcombe")


def _z(level: float) -> float:
    """The standard normal quantile at (1 + level) / 2, by bisection on erf (no SciPy needed)."""
    target = (1 + level) / 2
    lo, hi = 0.0, 10.0
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        if 0.5 * (1 + math.erf(mid / math.sqrt(2))) < target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def _t(level: float, df: int) -> float:
    """Student's t quantile at (1 + level) / 2 with ``df`` degrees of freedom, by bisection on
    its CDF (regularised incomplete beta through a continued fraction)."""
    target = (1 + level) / 2
    lo, hi = 0.0, 1000.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if _t_cdf(mid, df) < target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def _t_cdf(t: float, df: int) -> float:
    x = df / (df + t * t)
    return 1 - 0.5 * _betainc(df / 2, 0.5, x)


def _betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta I_x(a, b) (Numerical Recipes' continued fraction)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    lbeta = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
    front = math.exp(lbeta + a * math.log(x) + b * math.log(1 - x))
    if x > (a + 1) / (a + b + 2):
        return 1 - _betainc(b, a, 1 - x)
    f, c, d = 1.0, 1.0, 0.0
    for i in range(300):
        m = i // 2
        if i == 0:
            num = 1.0
        elif i % 2 == 0:
            num = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        else:
            num = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        d = 1 + num * d
        d = 1 / (d if abs(d) > 1e-300 else 1e-300)
        c = 1 + num / (c if abs(c) > 1e-300 else 1e-300)
        f *= c * d
        if abs(1 - c * d) < 1e-15:
            break
    return front * (f - 1) / a


@dataclass(frozen=True)
class SeedSummary:
    """A quantity measured once per training seed: mean, sample sd and the t interval of the mean."""

    mean: float
    sd: float
    n: int
    values: tuple

    @property
    def interval(self) -> Interval:
        if self.n < 2:
            return Interval(self.mean, float("nan"), float("nan"), self.n, LEVEL, "t")
        h = _t(LEVEL, self.n - 1) * self.sd / math.sqrt(self.n)
        return Interval(self.mean, self.mean - h, self.mean + h, self.n, LEVEL, "t")

    def fmt(self, spec: str = ".3f") -> str:
        return f"{format(self.mean, spec)} ± {format(self.sd, spec)}" if self.n > 1 else format(self.mean, spec)

    def to_dict(self) -> Dict[str, Any]:
        return {"mean": self.mean, "sd": self.sd, "n": self.n, "values": list(self.values),
                "interval": self.interval.to_dict()}


def over_seeds(values: Sequence[float]) -> SeedSummary:
    """Mean ± sample sd (ddof 1) of one number per seed."""
    v = np.asarray([float(x) for x in values], np.float64)
    if v.size == 0:
        raise ValueError("over_seeds: no values")
    sd = float(v.std(ddof=1)) if v.size > 1 else float("nan")
    return SeedSummary(float(v.mean()), sd, int(v.size), tuple(float(x) for x in v))


def describe_difference(iv: Interval, what: str = "difference", spec: str = ".3f", unit: str = "") -> str:
    """The report's one wording rule: a difference is named only when its interval excludes zero.

    ``"+0.120 (95% CI +0.050 to +0.200)"`` or ``"no detectable effect (±0.030)"``."""
    if not iv.defined:
        return f"{format(iv.value, '+' + spec)}{unit} (no interval: {iv.n} unit{'s' if iv.n != 1 else ''})"
    if not iv.excludes(0.0):
        return f"no detectable {what} ({format(iv.value, '+' + spec)}{unit}, ±{format(iv.half_width, spec)})"
    return (f"{format(iv.value, '+' + spec)}{unit} ({int(round(100 * iv.level))}% CI {format(iv.lo, '+' + spec)} "
            f"to {format(iv.hi, '+' + spec)})")


Number = Union[float, Interval]
