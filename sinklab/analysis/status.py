"""Statuses computed from numbers: the vocabulary of every verdict sinklab prints.

A paper element's status is one of

* ``reproduced``: the measured effect has the paper's sign (or magnitude) and its interval
  excludes the null;
* ``contradicted``: the interval excludes the null on the *other* side (or excludes the
  paper's effect where the paper predicts one);
* ``inconclusive``: the interval includes the null, or the measure cannot separate the
  hypotheses (a bound that holds but is too loose to test anything);
* ``not testable here``: nothing here can test it (no model or scale where the paper predicts
  the effect), or the analysis does not apply to this architecture;
* ``consistency check``: a mathematical fact checked on the numbers (it cannot fail short of a
  bug), shown as such and never as a reproduction.

The criteria live beside their analyses (``criterion_*`` functions in each analysis module);
this module gives them the shared rules, so that "reproduced" means the same everywhere.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from .stats import Interval

REPRODUCED = "reproduced"
CONTRADICTED = "contradicted"
INCONCLUSIVE = "inconclusive"
NOT_TESTABLE = "not testable here"
CONSISTENCY = "consistency check"
STATUSES = (REPRODUCED, CONTRADICTED, INCONCLUSIVE, NOT_TESTABLE, CONSISTENCY)


@dataclass(frozen=True)
class Verdict:
    """A status and the one-line reason that follows from the numbers.

    Attributes:
        status: one of :data:`STATUSES`.
        reason: one sentence naming the measured effect, its interval and the rule applied.
        criterion: the rule in words (what would have given each status).
        numbers: the numbers the verdict rests on (JSON-able).
    """

    status: str
    reason: str
    criterion: str = ""
    numbers: Dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status {self.status!r}: expected one of {STATUSES}")

    def to_dict(self) -> Dict[str, Any]:
        return {"status": self.status, "reason": self.reason, "criterion": self.criterion,
                "numbers": {k: (v.to_dict() if isinstance(v, Interval) else v) for k, v in self.numbers.items()}}


def directional(effect: Interval, predicted: int, what: str, null: float = 0.0, spec: str = ".3f",
                criterion: str = "") -> Verdict:
    """The paper predicts ``effect`` > ``null`` (``predicted=+1``) or < ``null`` (``-1``).

    reproduced when the interval lies wholly on the predicted side, contradicted when it lies
    wholly on the other side, inconclusive otherwise (or when it has no interval)."""
    if predicted not in (1, -1):
        raise ValueError("predicted must be +1 or -1")
    side = ">" if predicted > 0 else "<"
    rule = criterion or (f"reproduced if the 95% interval of {what} lies {'above' if predicted > 0 else 'below'} "
                         f"{null:g}, contradicted if it lies on the other side, else inconclusive")
    shown = effect.fmt(spec)
    nums = {"effect": effect}
    if not effect.defined:
        return Verdict(INCONCLUSIVE, f"{what} = {shown} has no interval ({effect.n} units)", rule, nums)
    if (predicted > 0 and effect.above(null)) or (predicted < 0 and effect.below(null)):
        return Verdict(REPRODUCED, f"{what} = {shown}, {side} {null:g} as the paper predicts", rule, nums)
    if (predicted > 0 and effect.below(null)) or (predicted < 0 and effect.above(null)):
        other = "<" if predicted > 0 else ">"
        return Verdict(CONTRADICTED, f"{what} = {shown}, {other} {null:g}: the opposite of the paper's prediction",
                       rule, nums)
    return Verdict(INCONCLUSIVE, f"{what} = {shown}: the interval includes {null:g}", rule, nums)


def threshold(effect: Interval, predicted_at_least: float, null: float, what: str, spec: str = ".3f",
              criterion: str = "") -> Verdict:
    """The paper predicts a large effect, at least ``predicted_at_least`` (a magnitude rule, e.g.
    a perplexity ratio ≥ 1.5 or a sink rate ≥ 30 %), against ``null`` (no effect).

    reproduced when the whole interval is ≥ ``predicted_at_least``; contradicted when the whole
    interval is < ``predicted_at_least`` *and* it does not exclude the null on the predicted side
    by much either (i.e. its upper end is below the threshold); inconclusive when it straddles
    the threshold."""
    side = "at or above" if predicted_at_least >= null else "at or below"
    rule = criterion or (f"reproduced if the 95% interval of {what} lies {side} {predicted_at_least:g} (the paper's "
                         f"size of effect), contradicted if it lies wholly on the other side, else inconclusive")
    shown = effect.fmt(spec)
    nums = {"effect": effect, "threshold": predicted_at_least, "null": null}
    if not effect.defined:
        return Verdict(INCONCLUSIVE, f"{what} = {shown} has no interval ({effect.n} units)", rule, nums)
    up = predicted_at_least >= null
    beyond, short = (("≥", "<") if up else ("≤", ">"))
    if (up and effect.lo >= predicted_at_least) or (not up and effect.hi <= predicted_at_least):
        return Verdict(REPRODUCED, f"{what} = {shown}, {beyond} {predicted_at_least:g} as the paper reports", rule, nums)
    if (up and effect.hi < predicted_at_least) or (not up and effect.lo > predicted_at_least):
        return Verdict(CONTRADICTED, f"{what} = {shown}, {short} {predicted_at_least:g}: short of the paper's effect",
                       rule, nums)
    return Verdict(INCONCLUSIVE, f"{what} = {shown}: the interval straddles {predicted_at_least:g}", rule, nums)


def equivalence(effect: Interval, margin: float, what: str, spec: str = ".3f", criterion: str = "") -> Verdict:
    """The paper predicts *no* effect (e.g. removing a ⟨bos⟩ the model was not trained with).

    reproduced when the whole interval lies within ±``margin`` (an equivalence test, TOST-like);
    contradicted when it lies wholly outside; inconclusive otherwise. A null result only counts
    as a reproduction when the interval is narrow enough to rule out an effect of the margin."""
    rule = criterion or (f"reproduced if the 95% interval of {what} lies within ±{margin:g} (no effect, as "
                         f"predicted), contradicted if it lies wholly outside, else inconclusive")
    shown = effect.fmt(spec)
    nums = {"effect": effect, "margin": margin}
    if not effect.defined:
        return Verdict(INCONCLUSIVE, f"{what} = {shown} has no interval ({effect.n} units)", rule, nums)
    if -margin <= effect.lo and effect.hi <= margin:
        return Verdict(REPRODUCED, f"{what} = {shown}, within ±{margin:g}: no effect, as predicted", rule, nums)
    if effect.lo > margin or effect.hi < -margin:
        return Verdict(CONTRADICTED, f"{what} = {shown}, beyond ±{margin:g}: an effect where the paper predicts none",
                       rule, nums)
    return Verdict(INCONCLUSIVE, f"{what} = {shown}: too wide to rule out an effect of ±{margin:g}", rule, nums)


NOT_TESTABLE_RULE = ("not testable here where nothing here can test the claim: no model or scale at which the paper "
                     "predicts the effect, or a measurement that does not apply")


def not_testable(reason: str, criterion: str = "", numbers: Optional[Dict[str, Any]] = None) -> Verdict:
    """A claim nothing here can test, with the reason (the measurement, if any, kept in ``numbers``)."""
    return Verdict(NOT_TESTABLE, reason, criterion or NOT_TESTABLE_RULE, dict(numbers or {}))


def consistency(holds: int, cases: int, what: str, criterion: str = "") -> Verdict:
    """A mathematical identity or bound checked on the numbers: it can only fail through a bug,
    so it is a check of the measurement, not a test of the paper. A failure is reported as
    contradicted (a bug or a wrong constant)."""
    rule = criterion or f"{what} must hold in every case; a failure means a bug, not a finding"
    if holds == cases:
        return Verdict(CONSISTENCY, f"{what} holds in {holds} of {cases} cases", rule,
                       {"holds": holds, "cases": cases})
    return Verdict(CONTRADICTED, f"{what} fails in {cases - holds} of {cases} cases: a bug or a wrong constant", rule,
                   {"holds": holds, "cases": cases})


def combine(*verdicts: Verdict, what: str = "") -> Verdict:
    """All parts of a claim must be reproduced for the claim to be; any contradicted part
    contradicts it; else the weakest status wins (inconclusive before not testable)."""
    if not verdicts:
        raise ValueError("combine: no verdicts")
    st = [v.status for v in verdicts]
    reason = "; ".join(v.reason for v in verdicts)
    rule = "every part reproduced → reproduced; any part contradicted → contradicted; else inconclusive"
    nums = {f"part{i}": v.to_dict() for i, v in enumerate(verdicts)}
    if CONTRADICTED in st:
        status = CONTRADICTED
    elif all(s == REPRODUCED for s in st):
        status = REPRODUCED
    elif all(s == NOT_TESTABLE for s in st):
        status = NOT_TESTABLE
    else:
        status = INCONCLUSIVE
    return Verdict(status, (what + ": " if what else "") + reason, rule, nums)
