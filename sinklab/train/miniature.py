"""The search for the miniature: the cheapest training setting on a small CPU machine where a
model trained with a fixed ⟨bos⟩ (causal packing) comes to depend on it.

The paper's Table 2 and Fig. 5 train ~120M-parameter models on billions of tokens; at the size
this project first trained (1.9M parameters, 4.1M tokens) no head becomes a sink and removing a
fixed ⟨bos⟩ costs +0.013 nats (the paper: +4.87). The search trains one model per setting with
``sinklab sweep`` (``analysis = ["train"]``: each run resumable, the sweep's store keeps what has
finished) and reads every finished run back into one table (:func:`search_rows`,
:func:`search_markdown`): the setting, its cost (parameters, tokens, epochs of the training
split, wall time and threads) and its result:

* ``delta_loss``: the validation loss without ⟨bos⟩ minus with it, the same targets (the
  document's text tokens after its first), per held-out document, with its 95 % bootstrap
  interval over documents (:func:`bos_dependence`, on the run's last checkpoint);
* ``sink_bos``: the sink rate at ε 0.3 with ⟨bos⟩ (fraction of (document, layer, head) with
  a_0 > 0.3 on the first 64 tokens, Gu et al.'s metric, :mod:`.evaluate`), and ``a0_ratio``, the
  mean a_0 over the value of a head attending uniformly (1.0: no lean on position 0 at all);
* ``verdict`` (:func:`dependence_verdict`): ``"meets the targets"`` when the sink rate is at
  least :data:`TARGET_SINK` and the whole loss interval lies above :data:`TARGET_LOSS` nats (the
  issue's targets for the fixed-⟨bos⟩ causal model of Table 2), ``"depends, below the targets"``
  when the interval excludes zero on the positive side, ``"does not depend"`` otherwise.

One seed per setting: the search ranks settings; the found one is then trained with seeds
(:mod:`.experiments`).
"""
from __future__ import annotations

import argparse
import json
import math
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..analysis.quality import perplexity
from ..analysis.stats import bootstrap, paired_difference
from ..progress import progress_bar
from ..viz.reference import uniform_first_importance
from . import checkpoint as ckpt_io
from .corpus import corpus_for
from .evaluate import SINK_TOKENS, eval_documents
from .run import read_log

TARGET_SINK = 0.30     # sink rate at eps 0.3 with <bos> (the Table 2 target)
TARGET_LOSS = 0.5      # nats the loss must rise by when <bos> is removed, the whole interval
SETTING_KEYS = ("d_model", "n_layers", "n_heads", "context", "vocab_size", "lr", "min_lr", "weight_decay",
                "tokens_per_step", "warmup_steps", "masking", "fixed_bos", "seed", "attention")


def bos_dependence(run_dir: str, corpus: Any = None, n_docs: Optional[int] = None, seed: int = 0) -> Dict[str, Any]:
    """What removing ⟨bos⟩ costs the run's newest checkpoint, per held-out document.

    Args:
        run_dir: a training run's folder (``sinklab train`` or a sweep's ``runs/train-*``).
        corpus: the prepared corpus (default: the one the run's vocabulary names).
        n_docs: held-out documents (default: the run's ``eval_docs``).
        seed: the bootstrap's seed.

    Returns:
        ``{"step", "n_docs", "loss_bos", "loss_text" (token-weighted means, nats),
        "per_doc_bos", "per_doc_text" ((N,) each document's mean NLL), "delta" (Interval of the
        mean over documents of text-only minus ⟨bos⟩+text, nats)}``.
    """
    latest = ckpt_io.latest_checkpoint(run_dir)
    if latest is None:
        raise ValueError(f"{run_dir} has no checkpoint to evaluate")
    ck = ckpt_io.load_checkpoint(latest)
    cfg = ck.state.get("run_config", {})
    if corpus is None:
        corpus = corpus_for(cfg)
    model = ckpt_io.trainer_from_checkpoint(ck).model
    docs = eval_documents(corpus.heldout_documents(), int(n_docs or cfg.get("eval_docs", 64)))
    C = int(cfg.get("context", model.config.context_length))
    texts: List[Any] = list(docs)         # token-id arrays, which perplexity takes as id sequences
    res = {m: perplexity(model, texts, bos=m == "bos", max_tokens=C - 1, progress=False) for m in ("bos", "text")}
    return {"step": ck.step, "n_docs": len(docs), "loss_bos": res["bos"].mean_nll, "loss_text": res["text"].mean_nll,
            "per_doc_bos": res["bos"].nll, "per_doc_text": res["text"].nll,
            "delta": paired_difference(res["bos"].nll, res["text"].nll, seed=seed)}


def dependence_verdict(sink_bos: float, delta_lo: float) -> str:
    """The search's reading of one run (module docstring)."""
    if sink_bos >= TARGET_SINK and delta_lo >= TARGET_LOSS:
        return "meets the targets"
    if delta_lo > 0:
        return "depends, below the targets"
    return "does not depend"


def token_trend(curve: Sequence[Sequence[float]], delta_now: float, target: float = TARGET_LOSS,
                linear: bool = False) -> Tuple[Optional[float], Optional[float]]:
    """How far a run is from the loss target along its own training: the least-squares slope of
    Δ loss (text only − ⟨bos⟩+text, nats, the log's evaluations) against log2(tokens) (nats per
    doubling of the tokens; ``linear``: against tokens, nats per million tokens, the optimistic
    reading) over the evaluations in the last two thirds of the run, and the tokens at which that
    line would reach ``target`` from ``delta_now`` at the last evaluation (None when the slope is
    not positive). An extrapolation of a trend, not a prediction: the learning rate decays over a
    run, and a longer run would have a longer schedule."""
    pts = [(float(t), float(d)) for t, d in curve if t > 0]
    if len(pts) < 3:
        return None, None
    last = pts[-1][0]
    pts = [p for p in pts if p[0] >= last / 3]
    if len(pts) < 2:
        return None, None
    t = np.array([p[0] for p in pts])
    x = t / 1e6 if linear else np.log2(t)
    y = np.array([p[1] for p in pts])
    slope = float(np.polyfit(x, y, 1)[0])
    if slope <= 0:
        return slope, None
    if linear:
        return slope, float(last + 1e6 * (target - delta_now) / slope)
    doublings = (target - delta_now) / slope
    return slope, (float(last * 2.0 ** doublings) if doublings < 1000 else math.inf)  # inf: past any float


def _run_dirs(sweep_dirs: Sequence[str]) -> List[str]:
    out = []
    for s in sweep_dirs:
        runs = os.path.join(s, "runs")
        if os.path.isdir(runs):
            out += [os.path.join(runs, r) for r in sorted(os.listdir(runs))]
    return out


def search_row(run_dir: str, corpus: Any = None, threads: Optional[int] = None) -> Optional[Dict[str, Any]]:
    """One finished run as a row of the search table (None when it has not finished);
    ``threads`` stands for the OpenMP threads of a run whose config did not record them."""
    latest = ckpt_io.latest_checkpoint(run_dir)
    if latest is None:
        return None
    state = ckpt_io.read_state(latest)
    cfg = state.get("run_config", {})
    log = read_log(run_dir)
    steps = int(cfg["total_tokens"]) // int(cfg["tokens_per_step"]) if cfg.get("steps") is None else int(cfg["steps"])
    if not log or log[-1]["step"] != steps:
        return None
    if corpus is None:
        corpus = corpus_for(cfg)
    dep = bos_dependence(run_dir, corpus)
    last = [x for x in log if x.get("val_loss_bos") is not None][-1]
    T = min(SINK_TOKENS, int(cfg["context"]))
    train_tokens = int(len(corpus.train_tokens))
    d = dep["delta"]
    row: Dict[str, Any] = {k: cfg.get(k) for k in SETTING_KEYS}
    row.update({
        "run": os.path.basename(run_dir), "attention": cfg.get("attention", "softmax"),
        "n_params": int(state["n_params"]),
        "tokens": int(log[-1]["tokens"]), "epochs": int(log[-1]["tokens"]) / train_tokens,
        "wall_s": float(log[-1]["wall_s"]), "threads": cfg.get("threads") or threads,
        "val_loss_bos": dep["loss_bos"], "val_loss_text": dep["loss_text"],
        "delta_loss": d.value, "delta_lo": d.lo, "delta_hi": d.hi, "n_docs": dep["n_docs"],
        "per_doc_bos": [float(x) for x in dep["per_doc_bos"]], "per_doc_text": [float(x) for x in dep["per_doc_text"]],
        "sink_bos": float(last["sink_bos_0.3"]), "sink_text": float(last["sink_text_0.3"]),
        "a0_bos": float(last["importance_bos"]), "a0_uniform": uniform_first_importance(T),
        "a0_curve": [[int(x["tokens"]), float(x["importance_bos"])] for x in log if x.get("importance_bos") is not None],
    })
    row["a0_ratio"] = row["a0_bos"] / row["a0_uniform"]
    row["delta_curve"] = [[int(x["tokens"]), float(x["val_loss_text"]) - float(x["val_loss_bos"])] for x in log
                          if x.get("val_loss_bos") is not None and x.get("val_loss_text") is not None]
    row["delta_per_doubling"], row["tokens_to_target"] = token_trend(row["delta_curve"], row["delta_loss"])
    row["delta_per_mtok"], row["tokens_to_target_linear"] = token_trend(row["delta_curve"], row["delta_loss"],
                                                                        linear=True)
    row["verdict"] = dependence_verdict(row["sink_bos"], row["delta_lo"])
    return row


def search_rows(sweep_dirs: Sequence[str], corpus: Any = None, progress: bool = True,
                threads: Optional[int] = None) -> List[Dict[str, Any]]:
    """Every finished run of the given sweep folders, as :func:`search_row` rows."""
    rows = []
    for r in progress_bar(_run_dirs(sweep_dirs), progress, desc="search runs", unit="run"):
        row = search_row(r, corpus, threads)
        if row is not None:
            rows.append(row)
    return rows


def _fmt_tokens(n: int) -> str:
    return f"{n / 1e6:.1f}M"


def search_markdown(rows: Sequence[Dict[str, Any]]) -> str:
    """The committed table: one line per run, cheapest first."""
    head = ("| model (d × L × H) | params | C | lr | wd | tokens (epochs) | wall (threads) | val loss ⟨bos⟩ | "
            "Δ loss w/o ⟨bos⟩ [95 % CI over docs] | Δ per doubling of tokens | sink % ε 0.3 | a₀ / uniform | "
            "reading |\n|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---|\n")
    lines = []
    for r in sorted(rows, key=lambda r: (r["tokens"] * (r["n_params"] or 0), r["run"])):
        wall = f"{r['wall_s'] / 60:.0f} min ({r['threads'] or '?'})"
        lines.append(
            f"| {r['d_model']} × {r['n_layers']} × {r['n_heads']}{_run_label(r)} | "
            f"{(r['n_params'] or 0) / 1e6:.2f}M | {r['context']} | {r['lr']:g} | {r['weight_decay']:g} | "
            f"{_fmt_tokens(r['tokens'])} ({r['epochs']:.1f}) | {wall} | {r['val_loss_bos']:.3f} | "
            f"{r['delta_loss']:+.3f} [{r['delta_lo']:+.3f}, {r['delta_hi']:+.3f}] | "
            f"{'–' if r.get('delta_per_doubling') is None else format(r['delta_per_doubling'], '+.4f')} | "
            f"{100 * r['sink_bos']:.1f} | "
            f"{r['a0_ratio']:.2f} | {r['verdict']} |")
    return head + "\n".join(lines) + "\n\n" + search_reading(rows) + "\n"


def _run_label(r: Dict[str, Any]) -> str:
    """What sets a run apart beyond its shape: a variant attention, no fixed ⟨bos⟩, a seed other than 0."""
    parts = [] if r.get("attention") in (None, "softmax") else [r["attention"]]
    if r.get("fixed_bos") is False:
        parts.append("no fixed ⟨bos⟩")
    if r.get("seed"):
        parts.append(f"seed {r['seed']}")
    return "".join(" " + p for p in parts)


def search_reading(rows: Sequence[Dict[str, Any]]) -> str:
    """The search's conclusion, computed from the rows: the runs that meet the targets (the
    cheapest named), else the closest run and how far its own trend says it is."""
    if not rows:
        return "No run has finished."
    met = [r for r in rows if r["verdict"] == "meets the targets"]
    if met:
        r = min(met, key=lambda r: r["tokens"] * r["n_params"])
        return (f"{len(met)} of {len(rows)} runs meet the targets; the cheapest is {r['d_model']} × {r['n_layers']} × "
                f"{r['n_heads']} ({r['n_params'] / 1e6:.2f}M parameters, {_fmt_tokens(r['tokens'])} tokens): sink rate "
                f"{100 * r['sink_bos']:.1f} %, Δ loss {r['delta_loss']:+.3f} [{r['delta_lo']:+.3f}, {r['delta_hi']:+.3f}].")
    best = max(rows, key=lambda r: r["delta_lo"])
    top_sink = max(rows, key=lambda r: r["sink_bos"])
    out = (f"None of the {len(rows)} runs meets the targets (sink rate ≥ {100 * TARGET_SINK:.0f} % and the Δ loss "
           f"interval above {TARGET_LOSS} nats). The largest Δ loss is {best['delta_loss']:+.3f} "
           f"[{best['delta_lo']:+.3f}, {best['delta_hi']:+.3f}] nats ({best['d_model']} × {best['n_layers']} × "
           f"{best['n_heads']}, wd {best['weight_decay']:g}, {_fmt_tokens(best['tokens'])} tokens); the highest sink rate "
           f"{100 * top_sink['sink_bos']:.1f} % (wd {top_sink['weight_decay']:g}, a₀ {top_sink['a0_ratio']:.2f}× uniform).")
    t = best.get("tokens_to_target")
    if t is not None:
        out += (f" Along its own run Δ loss grew {best['delta_per_doubling']:+.4f} nats per doubling of tokens; "
                + (f"on that line it would reach {TARGET_LOSS} nats at ~{t:.1e} tokens "
                   f"({t / best['tokens']:.1e}× its budget)" if math.isfinite(t) else
                   f"on that line it would take more than 2^1000 times its budget to reach {TARGET_LOSS} nats"))
        tl = best.get("tokens_to_target_linear")
        if tl is not None:
            out += (f"; even read as linear in tokens ({best['delta_per_mtok']:+.4f} nats per million) it would take "
                    f"~{tl:.1e} tokens, {tl / best['tokens']:.0f}× its budget")
        out += ": the targets are out of reach at this size on this machine."
    return out


VARIANT_KEYS = tuple(k for k in SETTING_KEYS if k != "attention") + ("tokens",)


def _same_setting(a: Dict[str, Any], b: Dict[str, Any]) -> bool:
    return all(a.get(k) == b.get(k) for k in VARIANT_KEYS)


def _direction(iv: Any, less: str, more: str) -> str:
    if iv.hi < 0:
        return less
    if iv.lo > 0:
        return more
    return "no difference resolved"


def variant_rows(rows: Sequence[Dict[str, Any]], seed: int = 0) -> List[Dict[str, Any]]:
    """Issue item "attention variants": each variant run beside the softmax run of the same
    setting (model, data, schedule, tokens, seed), on the same held-out documents. Per variant:
    the change of the ⟨bos⟩ loss gap (variant's Δ loss − softmax's, paired over documents, 95 %
    bootstrap) and of the validation loss with ⟨bos⟩ (the same pairing), the sink rates at ε 0.3
    with ⟨bos⟩ side by side, and readings from the intervals: ``dependence`` is ``"less on
    ⟨bos⟩"`` when the gap's change lies wholly below zero, ``"more on ⟨bos⟩"`` wholly above,
    else ``"no difference resolved"``; ``loss`` likewise ``"lower"`` / ``"higher"``. Variants
    without a softmax run of their setting are left out."""
    out = []
    for v in rows:
        if v.get("attention") in (None, "softmax") or "per_doc_bos" not in v:
            continue
        base = [r for r in rows if r.get("attention") in (None, "softmax") and _same_setting(r, v)
                and len(r.get("per_doc_bos", ())) == len(v["per_doc_bos"])]
        if not base:
            continue
        b = base[0]
        gap_v = np.subtract(v["per_doc_text"], v["per_doc_bos"])
        gap_b = np.subtract(b["per_doc_text"], b["per_doc_bos"])
        gap = paired_difference(gap_b, gap_v, seed=seed)
        loss = paired_difference(b["per_doc_bos"], v["per_doc_bos"], seed=seed)
        out.append({"attention": v["attention"], "run": v["run"], "softmax_run": b["run"],
                    "setting": {k: v.get(k) for k in VARIANT_KEYS},
                    "sink_bos": v["sink_bos"], "sink_bos_softmax": b["sink_bos"],
                    "a0_ratio": v["a0_ratio"], "a0_ratio_softmax": b["a0_ratio"],
                    "delta_loss": v["delta_loss"], "delta_lo": v["delta_lo"], "delta_hi": v["delta_hi"],
                    "delta_loss_softmax": b["delta_loss"], "delta_lo_softmax": b["delta_lo"],
                    "delta_hi_softmax": b["delta_hi"],
                    "gap_change": gap.value, "gap_change_lo": gap.lo, "gap_change_hi": gap.hi,
                    "val_loss_bos": v["val_loss_bos"], "val_loss_bos_softmax": b["val_loss_bos"],
                    "loss_change": loss.value, "loss_change_lo": loss.lo, "loss_change_hi": loss.hi,
                    "dependence": _direction(gap, "less on ⟨bos⟩", "more on ⟨bos⟩"),
                    "loss": _direction(loss, "lower", "higher")})
    return out


def variants_markdown(vrows: Sequence[Dict[str, Any]]) -> str:
    """The variants table and its computed reading (:func:`variant_rows`)."""
    if not vrows:
        return "No attention-variant run has a finished softmax run of the same setting.\n"
    head = ("| attention | sink % ε 0.3 (softmax) | a₀ / uniform (softmax) | Δ loss w/o ⟨bos⟩ (softmax) | "
            "change of the gap [95 % CI] | val loss ⟨bos⟩ (softmax) | change [95 % CI] | reading |\n"
            "|---|---:|---:|---|---|---:|---|---|\n")
    lines = []
    for r in vrows:
        lines.append(
            f"| {r['attention']} | {100 * r['sink_bos']:.1f} ({100 * r['sink_bos_softmax']:.1f}) | "
            f"{r['a0_ratio']:.2f} ({r['a0_ratio_softmax']:.2f}) | {r['delta_loss']:+.3f} "
            f"[{r['delta_lo']:+.3f}, {r['delta_hi']:+.3f}] ({r['delta_loss_softmax']:+.3f}) | "
            f"{r['gap_change']:+.3f} [{r['gap_change_lo']:+.3f}, {r['gap_change_hi']:+.3f}] | "
            f"{r['val_loss_bos']:.3f} ({r['val_loss_bos_softmax']:.3f}) | "
            f"{r['loss_change']:+.3f} [{r['loss_change_lo']:+.3f}, {r['loss_change_hi']:+.3f}] | "
            f"{r['dependence']}; loss {r['loss']} |")
    return head + "\n".join(lines) + "\n\n" + variants_reading(vrows) + "\n"


def variants_reading(vrows: Sequence[Dict[str, Any]]) -> str:
    """One sentence per variant from its intervals (no verdict is written by hand)."""
    parts = []
    for r in vrows:
        dep = {"less on ⟨bos⟩": "depends less on ⟨bos⟩ than softmax attention",
               "more on ⟨bos⟩": "depends more on ⟨bos⟩ than softmax attention",
               "no difference resolved": "depends on ⟨bos⟩ as much as softmax attention, within the interval"}
        zero = r["delta_lo"] <= 0 <= r["delta_hi"]
        parts.append(
            f"{r['attention']}: sink rate {100 * r['sink_bos']:.1f} % against softmax's {100 * r['sink_bos_softmax']:.1f} %; "
            f"it {dep[r['dependence']]} (gap {r['gap_change']:+.3f} nats [{r['gap_change_lo']:+.3f}, "
            f"{r['gap_change_hi']:+.3f}]{'; its own gap is not distinguishable from zero' if zero else ''}), "
            f"and its validation loss with ⟨bos⟩ is "
            f"{'the same within the interval' if r['loss'] == 'no difference resolved' else r['loss']} "
            f"({r['loss_change']:+.3f} [{r['loss_change_lo']:+.3f}, {r['loss_change_hi']:+.3f}]).")
    return " ".join(parts)


SCALE_KEYS = tuple(k for k in SETTING_KEYS if k not in ("d_model", "n_heads")) + ("tokens",)


def _scale_key(r: Dict[str, Any]) -> Tuple[Any, ...]:
    return tuple(r.get(k) for k in SCALE_KEYS) + (r["d_model"] // r["n_heads"],)


def scale_groups(rows: Sequence[Dict[str, Any]], min_sizes: int = 3) -> List[List[Dict[str, Any]]]:
    """Softmax runs that differ only in width (the head dimension, depth, data, schedule, tokens
    and seed the same), by parameters: the groups with at least ``min_sizes`` widths."""
    groups: Dict[Tuple[Any, ...], Dict[int, Dict[str, Any]]] = {}
    for r in rows:
        if r.get("attention") in (None, "softmax") and "per_doc_bos" in r:
            groups.setdefault(_scale_key(r), {}).setdefault(int(r["d_model"]), r)
    out = [sorted(g.values(), key=lambda r: r["n_params"]) for g in groups.values()]
    return [g for g in out if len(g) >= min_sizes and len({len(r["per_doc_bos"]) for r in g}) == 1]


def _slope(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least-squares slope of each row of ``y`` (r, n) against ``x`` (n,)."""
    xc = x - x.mean()
    return (y - y.mean(axis=-1, keepdims=True)) @ xc / float(xc @ xc)


def _other_seeds(r: Dict[str, Any], rows: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Runs of ``r``'s setting and width with another seed (softmax, the same documents)."""
    key = [k for k in SCALE_KEYS if k != "seed"]
    return [o for o in rows if o is not r and o.get("attention") in (None, "softmax") and "per_doc_bos" in o
            and o.get("seed") != r.get("seed") and o["d_model"] == r["d_model"] and o["n_heads"] == r["n_heads"]
            and all(o.get(k) == r.get(k) for k in key) and len(o["per_doc_bos"]) == len(r["per_doc_bos"])]


def seed_spread(group: Sequence[Dict[str, Any]], rows: Sequence[Dict[str, Any]], seed: int = 0) -> List[Dict[str, Any]]:
    """For each width of a scale group that has a run with another seed: that run's ⟨bos⟩ loss gap
    minus the group's run's (paired over documents, 95 % bootstrap) and the sink rates' difference:
    what one seed more moves, beside what one width more moves."""
    out = []
    for r in group:
        for o in _other_seeds(r, rows):
            iv = paired_difference(np.subtract(r["per_doc_text"], r["per_doc_bos"]),
                                   np.subtract(o["per_doc_text"], o["per_doc_bos"]), seed=seed)
            out.append({"n_params": r["n_params"], "seeds": [r.get("seed"), o.get("seed")], "value": iv.value,
                        "lo": iv.lo, "hi": iv.hi, "sink_difference": o["sink_bos"] - r["sink_bos"]})
    return out


def scale_trend(group: Sequence[Dict[str, Any]], target: float = TARGET_LOSS, seed: int = 0,
                rows: Sequence[Dict[str, Any]] = ()) -> Dict[str, Any]:
    """Issue fallback "the trend with scale": the ⟨bos⟩ loss gap (text only − ⟨bos⟩+text, nats)
    of each width against log2(parameters), the least-squares slope (nats per doubling of the
    parameters) with a 95 % bootstrap interval over the held-out documents (the same documents
    for every run, resampled together); with ``rows`` (all runs), what another seed of a width
    moves (:func:`seed_spread`), which these intervals over documents do not contain; each step from one width to the next (``steps``: the
    paired change of the gap over documents), and the parameters at which the fitted line reaches
    ``target`` (None unless the slope's interval lies above zero and no step's interval lies below
    zero: a line through points that fall somewhere extrapolates nothing). An extrapolation of
    three or more points of one seed, not a prediction: the token budget is fixed, so a larger
    model is also a less-trained one."""
    x = np.log2([float(r["n_params"]) for r in group])
    gaps = np.stack([np.subtract(r["per_doc_text"], r["per_doc_bos"]) for r in group])  # (sizes, docs)
    means = gaps.mean(axis=1)
    slope_iv = bootstrap(lambda i: float(_slope(x, gaps[:, i].mean(axis=1)[None])[0]), gaps.shape[1], seed=seed,
                         rows=lambda idx: _slope(x, gaps[:, idx].mean(axis=2).T))
    fit_at_top = float(means.mean() + slope_iv.value * (x[-1] - x.mean()))
    steps = [paired_difference(gaps[i], gaps[i + 1], seed=seed) for i in range(len(group) - 1)]
    monotone = not any(s.below(0) for s in steps)
    to_target = (float(2.0 ** (x[-1] + (target - fit_at_top) / slope_iv.value))
                 if slope_iv.above(0) and monotone else None)
    sink = np.array([r["sink_bos"] for r in group])
    return {"runs": [r["run"] for r in group], "d_model": [r["d_model"] for r in group],
            "n_heads": [r["n_heads"] for r in group], "n_params": [r["n_params"] for r in group],
            "setting": {k: group[0].get(k) for k in SCALE_KEYS}, "delta_loss": means.tolist(),
            "delta_lo": [r["delta_lo"] for r in group], "delta_hi": [r["delta_hi"] for r in group],
            "sink_bos": sink.tolist(), "a0_ratio": [r["a0_ratio"] for r in group],
            "val_loss_bos": [r["val_loss_bos"] for r in group],
            "slope": slope_iv.value, "slope_lo": slope_iv.lo, "slope_hi": slope_iv.hi,
            "sink_slope": float(_slope(x, sink[None])[0]), "params_to_target": to_target,
            "steps": [{"value": s.value, "lo": s.lo, "hi": s.hi} for s in steps], "monotone": monotone,
            "seed_spread": seed_spread(group, rows, seed),
            "trend": _direction(slope_iv, "shrinks with scale", "grows with scale")}


def scale_markdown(trends: Sequence[Dict[str, Any]]) -> str:
    """One table per group of widths and its computed reading (:func:`scale_trend`)."""
    out = []
    for t in trends:
        st = t["setting"]
        out.append(f"Widths at {st['n_layers']} layers, head dim {t['d_model'][0] // t['n_heads'][0]}, C {st['context']}, "
                   f"lr {st['lr']:g}, wd {st['weight_decay']:g}, {_fmt_tokens(st['tokens'])} tokens, seed {st['seed']}:\n")
        out.append("| d × H | params | val loss ⟨bos⟩ | Δ loss w/o ⟨bos⟩ [95 % CI over docs] | sink % ε 0.3 | a₀ / uniform |\n"
                   "|---|---:|---:|---|---:|---:|")
        for i in range(len(t["runs"])):
            out.append(f"| {t['d_model'][i]} × {t['n_heads'][i]} | {t['n_params'][i] / 1e6:.2f}M | "
                       f"{t['val_loss_bos'][i]:.3f} | {t['delta_loss'][i]:+.3f} [{t['delta_lo'][i]:+.3f}, "
                       f"{t['delta_hi'][i]:+.3f}] | {100 * t['sink_bos'][i]:.1f} | {t['a0_ratio'][i]:.2f} |")
        out.append("\n" + scale_reading(t) + "\n")
    return "\n".join(out) + "\n"


def scale_reading(t: Dict[str, Any]) -> str:
    """The trend's sentence, from the slope's interval."""
    n = len(t["runs"])
    s = (f"Across {n} widths ({t['n_params'][0] / 1e6:.2f}M to {t['n_params'][-1] / 1e6:.2f}M parameters) the ⟨bos⟩ loss "
         f"gap {t['trend']}: {t['slope']:+.4f} nats per doubling of the parameters [{t['slope_lo']:+.4f}, "
         f"{t['slope_hi']:+.4f}] (95 % over documents, one seed); the sink rate moves {100 * t['sink_slope']:+.1f} points "
         f"per doubling (no interval: one number per run).")
    for sp in t.get("seed_spread", []):
        biggest = max(abs(st["value"]) for st in t["steps"])
        s += (f" Seeds: at {sp['n_params'] / 1e6:.2f}M, seed {sp['seeds'][1]}'s gap differs from seed {sp['seeds'][0]}'s by "
              f"{sp['value']:+.3f} nats [{sp['lo']:+.3f}, {sp['hi']:+.3f}] and its sink rate by "
              f"{100 * sp['sink_difference']:+.1f} points, "
              + ("as much as or more than" if abs(sp["value"]) >= biggest else "less than")
              + f" the largest step between widths ({biggest:.3f} nats): the intervals over documents leave this "
              "seed-to-seed spread out, and one seed per width cannot resolve a trend smaller than it.")
    falls = [i for i, s in enumerate(t["steps"]) if s["hi"] < 0]
    if falls:
        s += " It does not grow steadily: " + "; ".join(
            f"from {t['n_params'][i] / 1e6:.2f}M to {t['n_params'][i + 1] / 1e6:.2f}M it falls by "
            f"{-t['steps'][i]['value']:.3f} nats [{-t['steps'][i]['hi']:.3f}, {-t['steps'][i]['lo']:.3f}]" for i in falls) + "."
    if t["params_to_target"] is not None:
        s += (f" On that line the gap would reach {TARGET_LOSS} nats at ~{t['params_to_target']:.1e} parameters "
              f"({t['params_to_target'] / t['n_params'][-1]:.0e}× the largest here) at the same tokens, an extrapolation "
              f"of {n} points, not a prediction.")
    elif falls:
        s += " A line through points that fall somewhere extrapolates nothing, so no size at which the targets would be met follows from it."
    else:
        s += " The slope's interval does not lie above zero, so no size at which the targets would be met follows from it."
    return s


def write_search(sweep_dirs: Sequence[str], out_prefix: str, progress: bool = True,
                 threads: Optional[int] = None) -> List[Dict[str, Any]]:
    """Rows of every finished run written to ``out_prefix.json``, and the tables and figure of
    :func:`write_search_outputs`."""
    rows = search_rows(sweep_dirs, progress=progress, threads=threads)
    with open(out_prefix + ".json", "w") as f:
        json.dump({"targets": {"sink_bos": TARGET_SINK, "delta_loss": TARGET_LOSS}, "rows": rows}, f, indent=1,
                  default=lambda o: None if isinstance(o, float) and math.isnan(o) else str(o))
    write_search_outputs(rows, out_prefix)
    return rows


def read_search(path: str) -> List[Dict[str, Any]]:
    """The rows of a search's ``PREFIX.json`` (:func:`write_search`): the committed record of
    the search, from which its tables and figure are made again without the runs."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise ValueError(f"{path} is not a miniature search's JSON (a dict with 'rows')")
    return data["rows"]


def write_search_outputs(rows: Sequence[Dict[str, Any]], out_prefix: str) -> List[str]:
    """``out_prefix.md`` (every run), ``-variants.md`` and ``-variants.png`` (when a variant has a
    softmax run of its setting) and ``-scale.md`` (when a setting was run at three sizes) from the
    search's rows. Returns the files written."""
    from ..viz.figures_training import variants_figure

    written = [out_prefix + ".md"]
    with open(written[0], "w") as f:
        f.write(search_markdown(rows))
    vrows = variant_rows(rows)
    if vrows:
        with open(out_prefix + "-variants.md", "w") as f:
            f.write(variants_markdown(vrows))
        variants_figure(vrows).savefig(out_prefix + "-variants.png", dpi=120)
        written += [out_prefix + "-variants.md", out_prefix + "-variants.png"]
    trends = [scale_trend(g, rows=rows) for g in scale_groups(rows)]
    if trends:
        with open(out_prefix + "-scale.md", "w") as f:
            f.write(scale_markdown(trends))
        written.append(out_prefix + "-scale.md")
    return written


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sinklab.train.miniature",
                                description="Read the miniature search's sweeps into one table.")
    p.add_argument("sweeps", nargs="*", help="sweep folders (each with runs/train-*)")
    p.add_argument("--out", required=True, help="output prefix: writes PREFIX.json and PREFIX.md")
    p.add_argument("--from-json", default=None, metavar="JSON",
                   help="make the tables and figure again from a search's PREFIX.json instead of its runs")
    p.add_argument("--threads", type=int, default=None,
                   help="OpenMP threads of the runs whose config does not record them (the sweep's threads)")
    a = p.parse_args(argv)
    if bool(a.sweeps) == bool(a.from_json):
        p.error("give sweep folders or --from-json, not both or neither")
    if a.from_json:
        for path in write_search_outputs(read_search(a.from_json), a.out):
            print(f"wrote {path}")
        return 0
    rows = write_search(a.sweeps, a.out, threads=a.threads)
    print(f"{len(rows)} finished run(s) -> {a.out}.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
