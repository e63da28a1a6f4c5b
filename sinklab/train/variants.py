"""Attention variants that need no ⟨bos⟩ sink, trained with seeds at a profile's setting (issue
26 item 5; beyond the paper).

The paper (§3-4) reads a sink as the model's way to let a head do nothing: softmax must put its
mass somewhere, so a head that should not mix parks it on ⟨bos⟩. Three variants give a head
another way out, and recent open-weight models ship them: a learned per-head sink logit in the
softmax's denominator (``"sink_logit"``), softmax-plus-one (``"softmax1"``, a fixed logit 0) and
a sigmoid gate on each head's output (``"gated"``). Each is trained here with the recipe of Table
2's fixed-⟨bos⟩ causal condition (causal packing, ⟨bos⟩ at position 0 of every window, the
profile's context, model and tokens), beside softmax attention with the same seeds: softmax's
runs *are* Table 2's (the same folders), so they are trained once.

Measured at the end of training, over seeds: the ε 0.3 sink rate with ⟨bos⟩, mean a₀ over
uniform attention's, the validation loss with ⟨bos⟩ and what removing ⟨bos⟩ costs (text-only
minus ⟨bos⟩+text loss, the same model and targets), and each variant's change from softmax,
seed with seed (the same seed is the same initial weights where the shapes agree and the same
data order). The criterion (:func:`criterion_variant`) reads the claim "the variant needs no
⟨bos⟩ sink" as "removing ⟨bos⟩ costs it less than it costs softmax attention": the paired change
of that cost, t interval over seeds, *reproduced* below 0, *contradicted* above, else
inconclusive; when softmax attention itself does not depend on ⟨bos⟩ (its cost's interval
includes 0) there is nothing to remove, and the claim is inconclusive.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from ..analysis import status as S
from ..analysis.stats import describe_difference
from ..viz.reference import sink_T, uniform_first_importance
from .criteria import mean_pm_sd, seed_interval, seed_stats, seeds_phrase
from .experiments import (clean, common_tokens, finish_summary, profile, run_config, run_with_records, save_figure,
                          seed_list, seed_summary)
from .run import TrainConfig

VARIANTS = ("softmax", "sink_logit", "softmax1", "gated")   # softmax first: the baseline
EPS = 0.3
# (summary field, log field) of each final number
FIELDS = (("sink_0.3", "sink_bos_0.3"), ("sink_0.8", "sink_bos_0.8"), ("importance", "importance_bos"),
          ("val_loss", "val_loss_bos"), ("val_loss_text", "val_loss_text"))
PAIRED = ("bos_gap", "val_loss", "val_loss_text", "sink_0.3", "importance_over_uniform")
VARIANT_RULE = ("reproduced if the 95% t interval over seeds of the variant's cost of removing ⟨bos⟩ minus softmax "
                "attention's (text-only minus ⟨bos⟩+text validation loss, seed with seed) lies below 0, contradicted "
                "if above 0, else inconclusive; inconclusive too when softmax attention's own cost has an interval "
                "that includes 0 (no ⟨bos⟩ dependence to remove)")


def variant_configs(profile_name: str, root: str = "sinklab-experiments",
                    seeds: Union[None, int, Sequence[int]] = None, threads: Optional[int] = None,
                    variants: Sequence[str] = VARIANTS) -> List[TrainConfig]:
    """One causal, fixed-⟨bos⟩ run per attention variant and seed at the profile's Table 2
    context, variant-major (softmax's are Table 2's runs)."""
    if not variants or variants[0] != "softmax":
        raise ValueError(f"variants must start with the baseline 'softmax', got {list(variants)!r}")
    C = profile(profile_name)["table2_context"]
    return [run_config(profile_name, C, "causal", True, root=root, seed=s, threads=threads, attention=a)
            for a in variants for s in seed_list(profile_name, seeds)]


def _final(log: List[Dict[str, Any]]) -> Dict[str, Any]:
    evs = [r for r in log if r.get("val_loss_text") is not None and r.get("val_loss_bos") is not None]
    if not evs:
        raise ValueError("a run has no evaluation with and without ⟨bos⟩")
    return evs[-1]


def variants_summary(configs: Sequence[TrainConfig], logs: Sequence[List[Dict[str, Any]]]) -> Dict[str, Any]:
    """Per attention variant (softmax first), over its seeds: the final value of each of
    :data:`FIELDS`, ``importance_over_uniform`` and ``bos_gap`` (text-only minus ⟨bos⟩+text loss,
    nats) per seed and as mean ± sd with the t interval (``final``), the largest ε 0.3 sink rate
    at any evaluation (``peak_sink_0.3``); and for every variant but softmax, ``vs_softmax``: per
    seed both have, the variant minus softmax of each of :data:`PAIRED`, over seeds."""
    by: Dict[str, List[Tuple[TrainConfig, List[Dict[str, Any]]]]] = {}
    for cfg, log in zip(configs, logs):
        by.setdefault(cfg.attention, []).append((cfg, log))
    if "softmax" not in by:
        raise ValueError("the variants summary needs softmax attention's runs (the baseline)")
    rows = []
    for a in sorted(by, key=lambda v: (VARIANTS.index(v) if v in VARIANTS else len(VARIANTS), v)):
        g = sorted(by[a], key=lambda cl: cl[0].seed)
        u = uniform_first_importance(sink_T(g[0][0].context))
        finals = [_final(log) for _, log in g]
        vals: Dict[str, List[Optional[float]]] = {k: [f.get(field) for f in finals] for k, field in FIELDS}
        vals["importance_over_uniform"] = [None if v is None else v / u for v in vals["importance"]]
        vals["bos_gap"] = [None if t is None or b is None else t - b for t, b in zip(vals["val_loss_text"], vals["val_loss"])]
        peak = [float(r["sink_bos_0.3"]) for _, log in g for r in log if r.get("sink_bos_0.3") is not None]
        rows.append({"attention": a, "seeds": [c.seed for c, _ in g], "out_dirs": [c.out_dir for c, _ in g],
                     "tokens": finals[0]["tokens"], "final_per_seed": vals,
                     "final": {k: seed_summary(v) for k, v in vals.items()},
                     "peak_sink_0.3": max(peak) if peak else None})
    base = rows[0]
    for r in rows[1:]:
        paired = [s for s in r["seeds"] if s in base["seeds"]]
        d: Dict[str, Any] = {"seeds": paired}
        for k in PAIRED:
            a_, b_ = dict(zip(base["seeds"], base["final_per_seed"][k])), dict(zip(r["seeds"], r["final_per_seed"][k]))
            per = [None if a_[s] is None or b_[s] is None else b_[s] - a_[s] for s in paired]
            d[f"{k}_per_seed"], d[k] = per, seed_summary(per)
        r["vs_softmax"] = d
    return clean({"variants": rows, "seeds": sorted({s for r in rows for s in r["seeds"]})})


def criterion_variant(summary: Dict[str, Any], attention: str) -> S.Verdict:
    """"``attention`` needs no ⟨bos⟩ sink", by :data:`VARIANT_RULE`."""
    rows = {r["attention"]: r for r in summary["variants"]}
    if attention not in rows or attention == "softmax":
        raise ValueError(f"no variant {attention!r} beside softmax in the summary (have {sorted(rows)})")
    base_gap = seed_interval(rows["softmax"]["final_per_seed"]["bos_gap"])
    iv = seed_interval(rows[attention]["vs_softmax"]["bos_gap_per_seed"])
    what = f"{attention}'s cost of removing ⟨bos⟩ minus softmax's (nats, seed with seed)"
    if not base_gap.defined:
        return S.Verdict(S.INCONCLUSIVE, f"softmax attention's cost of removing ⟨bos⟩ has no interval "
                         f"({base_gap.n} seed{'s' if base_gap.n != 1 else ''})", VARIANT_RULE, {"effect": iv})
    if not base_gap.above(0):
        return S.Verdict(S.INCONCLUSIVE, f"softmax attention's own cost of removing ⟨bos⟩ is {base_gap.fmt('+.3f')} "
                         "nats: no ⟨bos⟩ dependence to remove, so this tests nothing",
                         VARIANT_RULE, {"effect": iv, "softmax_cost": base_gap})
    return S.directional(iv, -1, what, spec="+.3f", criterion=VARIANT_RULE)


def _pm(per_seed: Sequence[Optional[float]], scale: float = 1.0, spec: str = ".3f", unit: str = "") -> str:
    return mean_pm_sd(seed_stats(per_seed, scale), spec, unit)


def variants_markdown(summary: Dict[str, Any]) -> str:
    """The table: one row per variant, mean ± sd over seeds, and its change from softmax with the
    t interval over seeds."""
    lines = ["| attention | seeds | sink % ε 0.3 (⟨bos⟩) | a₀ / uniform | val loss ⟨bos⟩ | removing ⟨bos⟩ (nats) "
             "| Δ cost vs softmax [95 % CI] | Δ val loss vs softmax [95 % CI] |", "|---|---|---|---|---|---|---|---|"]
    for r in summary["variants"]:
        v, d = r["final_per_seed"], r.get("vs_softmax")
        dc = "–" if d is None else seed_interval(d["bos_gap_per_seed"]).fmt("+.3f")
        dl = "–" if d is None else seed_interval(d["val_loss_per_seed"]).fmt("+.3f")
        lines.append(f"| {r['attention']} | {len(r['seeds'])} | {_pm(v['sink_0.3'], 100, '.1f')} | "
                     f"{_pm(v['importance_over_uniform'], 1, '.2f')} | {_pm(v['val_loss'])} | "
                     f"{_pm(v['bos_gap'], 1, '+.3f')} | {dc} | {dl} |")
    return "\n".join(lines)


def variants_reading(summary: Dict[str, Any]) -> Tuple[str, Dict[str, S.Verdict]]:
    """Sentences on the numbers (a change named only where its interval excludes 0) and each
    variant's :func:`criterion_variant` verdict."""
    rows = summary["variants"]
    base = rows[0]
    seeds = seeds_phrase([(r["attention"], len(r["seeds"])) for r in rows])
    parts = [f"Over {seeds} (mean ± sd), softmax attention: sink rate "
             f"{_pm(base['final_per_seed']['sink_0.3'], 100, '.1f', '%')}, removing ⟨bos⟩ costs "
             + describe_difference(seed_interval(base["final_per_seed"]["bos_gap"]), "cost", ".3f", " nats") + "."]
    verdicts = {}
    for r in rows[1:]:
        a, d = r["attention"], r["vs_softmax"]
        verdicts[a] = criterion_variant(summary, a)
        parts.append(f"{a}: sink rate {_pm(r['final_per_seed']['sink_0.3'], 100, '.1f', '%')}; its cost of removing "
                     "⟨bos⟩ against softmax's, seed with seed, "
                     + describe_difference(seed_interval(d["bos_gap_per_seed"]), "change", ".3f", " nats")
                     + "; validation loss with ⟨bos⟩ "
                     + describe_difference(seed_interval(d["val_loss_per_seed"]), "change", ".3f", " nats")
                     + f"; \"needs no ⟨bos⟩ sink\": {verdicts[a].status}.")
    return " ".join(parts), verdicts


def variants_figure(summary: Dict[str, Any], path: str) -> str:
    """Sink rate, cost of removing ⟨bos⟩ and validation loss per variant, each seed a dot and the
    mean a bar (:func:`sinklab.viz.figures_training.variants_seeds_figure`), saved to ``path``."""
    from ..viz.figures_training import variants_seeds_figure as draw  # matplotlib, only to draw

    return save_figure(draw(summary), path)


def run_variants(profile_name: str = "miniature", root: str = "sinklab-experiments", out: Optional[str] = None,
                 progress: bool = True, threads: Optional[int] = None, seeds: Union[None, int, Sequence[int]] = None,
                 adopt: Sequence[str] = (), records_dir: Optional[str] = None, jobs: int = 1,
                 train_missing: bool = True) -> Dict[str, Any]:
    """Trains (or resumes, or skips when finished) every variant and seed of a profile and writes
    ``variants-{profile}.json`` (summary, table, reading, verdicts) and ``variants-{profile}.png``
    into ``out`` (default ``root``). ``adopt``, ``records_dir``, ``jobs``, ``train_missing``: as
    for :func:`.experiments.run_experiment`. Returns the summary."""
    wanted = variant_configs(profile_name, root=root, seeds=seeds, threads=threads)
    configs, logs = run_with_records(wanted, root, adopt, records_dir, common_tokens(profile_name), progress, jobs,
                                     train_missing)
    summary = variants_summary(configs, logs)
    out = out or root
    os.makedirs(out, exist_ok=True)
    summary["profile"] = profile_name
    summary["markdown"] = variants_markdown(summary)
    summary["figure"] = variants_figure(summary, os.path.join(out, f"variants-{profile_name}.png"))
    text, verdicts = variants_reading(summary)
    summary["verdicts"] = {a: clean(v.to_dict()) for a, v in verdicts.items()}
    return finish_summary(summary, wanted, configs, text, os.path.join(out, f"variants-{profile_name}.json"))
