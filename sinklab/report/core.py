"""What every section of the report shares: sizes, the models and their roles, a section's
parts, and number formatting. Nothing here computes a result."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..analysis.sinks import check_eps
from ..analysis.stats import Interval
from ..analysis.status import Verdict, not_testable

# The study model is the one trained with a fixed ⟨bos⟩ (where the paper's ⟨bos⟩ claims can be
# tested); the others are the contrast (trained without one: the paper predicts no ⟨bos⟩ effect).
DEFAULT_MODELS = ("gemma-3-270m", "smollm2-135m-instruct")


@dataclass
class Settings:
    """Sizes of each experiment; ``Settings.for_run(quick)`` gives the two presets.

    Counts are of independent units (passages, swaps, trials, items): every interval rests on them."""

    sink_prompts: int
    sink_T: int
    long_T: int
    noop_prompts: int
    collapse_passages: int
    collapse_lengths: Tuple[int, ...]
    ppl_texts: int
    ppl_max_tokens: int
    passkey_quick: bool
    perturb_passages: int
    perturb_swaps: int
    retrieval_lengths: Tuple[int, ...] = (256, 1024)
    retrieval_trials: int = 100
    cloze_items: int = 400
    controls_texts: int = 36
    controls_max_tokens: int = 200
    controls_random_draws: int = 5
    squash_T: int = 16
    mixing_passages: int = 10
    mixing_lengths: Tuple[int, ...] = (64, 256, 1024)
    mixing_probes: int = 16
    eps: Tuple[float, ...] = (0.3, 0.8)
    bos: bool = True

    @classmethod
    def for_run(cls, quick: bool, eps: Sequence[float] = (0.3, 0.8), bos: bool = True) -> "Settings":
        eps = tuple(check_eps(e) for e in eps)
        if not eps:
            raise ValueError(f"eps must be one or more thresholds in (0, 1), got {eps}")
        if quick:
            return cls(sink_prompts=32, sink_T=64, long_T=1024, noop_prompts=8, collapse_passages=10,
                       collapse_lengths=(16, 64, 256), ppl_texts=16, ppl_max_tokens=200, passkey_quick=True,
                       perturb_passages=10, perturb_swaps=2, retrieval_lengths=(256,), retrieval_trials=48,
                       cloze_items=200, controls_texts=8, controls_max_tokens=96, controls_random_draws=2,
                       squash_T=8, mixing_passages=10, mixing_lengths=(64, 128), mixing_probes=8, eps=eps, bos=bos)
        return cls(sink_prompts=144, sink_T=64, long_T=8192, noop_prompts=40, collapse_passages=16,
                   collapse_lengths=(16, 64, 256, 1024), ppl_texts=36, ppl_max_tokens=1024, passkey_quick=False,
                   perturb_passages=30, perturb_swaps=3, retrieval_lengths=(256, 1024, 4096), retrieval_trials=100,
                   cloze_items=400, controls_texts=36, controls_max_tokens=200, controls_random_draws=8,
                   squash_T=24, mixing_passages=12, mixing_lengths=(64, 256, 1024), mixing_probes=16, eps=eps,
                   bos=bos)


@dataclass
class ModelRole:
    """A model in the report. ``trained_with_bos``: whether its own tokenizer prepends ⟨bos⟩
    (so it was trained with a fixed one, as Gemma; None when the file does not say)."""

    name: str
    model: Any
    trained_with_bos: Optional[bool]

    @property
    def role(self) -> str:
        return "study" if self.trained_with_bos else "contrast"

    @property
    def bos_token(self) -> str:
        bid = self.model.config.bos_token_id
        return "none" if bid is None else f"id {bid}, {self.model.detokenize([bid])!r}"

    @property
    def note(self) -> str:
        """One sentence: what the paper predicts for this model's ⟨bos⟩."""
        if self.model.config.bidirectional:
            return (f"{self.name} is a bidirectional encoder: every query sees its first token, so a_0 averages over "
                    f"all queries.")
        if self.trained_with_bos is None:
            return f"Whether {self.name} was trained with a fixed ⟨bos⟩ is not recorded in its file."
        if self.trained_with_bos:
            return (f"{self.name}'s tokenizer prepends ⟨bos⟩ ({self.bos_token}): it was trained with a fixed ⟨bos⟩, "
                    f"like the paper's Gemma 7B, so the paper's ⟨bos⟩ claims are tested on it.")
        return (f"{self.name}'s tokenizer prepends nothing; its '⟨bos⟩' here is {self.bos_token}, a token it was not "
                f"trained to rely on, so it stands for Table 2's rows without a fixed ⟨bos⟩, where the paper "
                f"predicts no ⟨bos⟩ effect: a contrast, not a test.")


def as_contrast(m: "ModelRole", v: Verdict) -> Verdict:
    """A ⟨bos⟩ criterion's verdict on a model trained *without* a fixed ⟨bos⟩, where the paper
    predicts no ⟨bos⟩ effect: the directional rule does not apply, so the status is "not testable
    here" and the measurement stays in the reason (the study model carries the test)."""
    if m.trained_with_bos:
        return v
    return not_testable(f"{m.name} was not trained with a fixed ⟨bos⟩, where the paper predicts no ⟨bos⟩ effect; "
                        f"measured: {v.reason}", numbers={"criterion_gave": v.status})


def trained_with_bos(model: Any) -> Optional[bool]:
    """Whether ``model``'s tokenizer prepends its ⟨bos⟩ by default (None when unknown)."""
    tok = getattr(model, "tokenizer", None)
    adds = getattr(tok, "add_bos_default", None)
    return None if adds is None else bool(adds)


@dataclass
class Section:
    """One section of the report.

    ``paper``: the paper element(s) it stands for, with the paper's numbers. ``here``: what is the
    same and what differs. ``body``: tables (one column per model). ``reading``: sentences that
    follow from the intervals. ``verdicts``: {element key: {model name: Verdict}}, from the
    criteria beside the analyses."""

    title: str
    paper: str
    here: str
    body: str
    reading: str
    figures: List[str] = field(default_factory=list)
    numbers: Dict[str, Any] = field(default_factory=dict)
    verdicts: Dict[str, Dict[str, Verdict]] = field(default_factory=dict)
    seconds: float = 0.0


@dataclass
class Context:
    """The models, the settings, where to write, and what earlier sections computed (so nothing
    is computed twice: ``shared[(key, model name)]``)."""

    models: List[ModelRole]
    s: Settings
    out: str
    progress: bool
    done: Dict[str, Section] = field(default_factory=dict)
    shared: Dict[Any, Any] = field(default_factory=dict)
    training_profile: str = "auto"
    training_root: str = "sinklab-experiments"

    def save(self, fig: Any, name: str) -> str:
        fig.savefig(os.path.join(self.out, name), dpi=120)
        try:
            import matplotlib.pyplot as plt

            plt.close(fig)
        except Exception:   # pragma: no cover - a Figure not managed by pyplot
            pass
        return name

    @property
    def study(self) -> Optional[ModelRole]:
        """The first model trained with a fixed ⟨bos⟩ (None when there is none)."""
        return next((m for m in self.models if m.trained_with_bos), None)

    @property
    def decoders(self) -> List[ModelRole]:
        return [m for m in self.models if not m.model.config.bidirectional and m.model.config.has_lm_head]

    def cached(self, key: str, m: ModelRole, compute) -> Any:
        k = (key, m.name)
        if k not in self.shared:
            self.shared[k] = compute()
        return self.shared[k]


# ---------------------------------------------------------------------- formatting
def pct(x: float) -> str:
    return "—" if x is None or not np.isfinite(x) else f"{100 * x:.2f}%"


def num(x: Any, fmt: str = ".3f") -> str:
    """A number for a table, "—" when absent (None or NaN)."""
    if isinstance(x, Interval):
        return x.fmt(fmt)
    return "—" if x is None or not np.isfinite(x) else format(x, fmt)


def pct_ci(iv: Interval, spec: str = ".1f") -> str:
    """An interval of a fraction as percentages: "79.4% [76.0, 82.1]"."""
    return iv.scaled(100).fmt(spec, "%")


def signed(x: float, fmt: str = ".3f") -> str:
    """``x`` with its sign, rounding to zero without a minus sign ("+0.000", not "-0.000")."""
    text = format(x, "+" + fmt)
    return "+" + text[1:] if text.startswith("-") and float(text) == 0 else text


def and_list(items: Sequence[str]) -> str:
    """"a, b and c"."""
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table."""
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def verdict_line(v: Verdict) -> str:
    return f"**{v.status}**: {v.reason}"


def verdict_rows(verdicts: Dict[str, Dict[str, Verdict]], labels: Dict[str, str]) -> str:
    """A table: one row per element, one column per model, each cell a status and its reason."""
    names = list(dict.fromkeys(n for per in verdicts.values() for n in per))
    rows = [[labels.get(k, k)] + [(f"**{per[n].status}**: {per[n].reason}" if n in per else "—") for n in names]
            for k, per in verdicts.items()]
    return table(["claim"] + names, rows)
