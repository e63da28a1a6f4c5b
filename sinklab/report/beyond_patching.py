"""Report section: activation patching of the residual stream per (layer, position) on IOI-style
name swaps, from :func:`sinklab.analysis.patching_experiment.patching_experiment`."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Dict, List, Optional

import numpy as np

from ..analysis.patching_experiment import name_swap_pairs, patching_experiment
from ..analysis.stats import Interval, mean_ci
from ..viz.figure import Figure, subplots
from ..viz.figures_patching import patching_figure
from .core import num, table

TITLE = "Activation patching: where the answer's information sits"
SUMMARY = "patching (IOI name swap)"

THRESHOLD = 0.5  # a cell "carries" the answer when its interval lies above this recovered share
NONE_BELOW = 0.05  # position 0 carries none of it when every layer's interval lies within ±this


def settings(quick: bool) -> Dict[str, Any]:
    """Pairs and layers of each preset: quick patches every second layer of 4 pairs."""
    return {"n_pairs": 4, "layer_step": 2} if quick else {"n_pairs": 12, "layer_step": 1}


def compute(model: Any, quick: bool, progress: bool) -> Dict[str, Any]:
    """Clean/corrupted name-swap pairs (the subject's second mention swapped, so the answer flips),
    the clean residual stream patched into the corrupted run at each (layer, position); intervals
    over pairs."""
    s = settings(quick)
    clean, corr, ans, wr = name_swap_pairs(model, s["n_pairs"])
    layers = list(range(0, model.config.n_layers, s["layer_step"]))
    r = patching_experiment(model, clean, corr, ans, wr, over="resid", layers=layers, progress=progress)
    diff_pos = sorted({int(p) for p in np.flatnonzero((clean != corr).any(axis=0))})
    return {"settings": {**s, "T": r.T, "over": "resid", "bos": bool(clean[0, 0] == model.config.bos_token_id)},
            "layers": r.layers, "tokens": r.tokens, "differing_positions": diff_pos,
            "mean": r.mean, "lo": r.lo, "hi": r.hi, "recovered": r.recovered,
            "clean_diff": mean_ci(r.clean_diff, seed=0).to_dict(),
            "corrupted_diff": mean_ci(r.corrupted_diff, seed=0).to_dict(),
            "pos0": [mean_ci(r.recovered[:, li, 0], seed=0).to_dict() for li in range(len(layers))],
            "last": [mean_ci(r.recovered[:, li, -1], seed=0).to_dict() for li in range(len(layers))]}


def first_above(res: Dict[str, Any]) -> Optional[Dict[str, int]]:
    """The first cell, in (layer, position) order, whose interval lies above :data:`THRESHOLD`."""
    lo = np.asarray(res["lo"], np.float64)
    for li in range(lo.shape[0]):
        for p in range(lo.shape[1]):
            if np.isfinite(lo[li, p]) and lo[li, p] > THRESHOLD:
                return {"layer": int(res["layers"][li]), "position": p}
    return None


def last_position_layer(res: Dict[str, Any]) -> Optional[int]:
    """The first patched layer at which the last position's interval lies above :data:`THRESHOLD`:
    from there on the answer's information has been moved to the token that predicts."""
    for layer, iv in zip(res["layers"], res["last"]):
        if Interval.from_dict(iv).above(THRESHOLD):
            return int(layer)
    return None


def sink_share(res: Dict[str, Any]) -> str:
    """What position 0 carries: ``"none"`` (every layer's interval within ±NONE_BELOW), ``"some"``
    (some layer's interval above NONE_BELOW) or ``"undetermined"``."""
    ivs = [Interval.from_dict(d) for d in res["pos0"]]
    if any(iv.above(NONE_BELOW) for iv in ivs):
        return "some"
    if all(iv.defined and iv.lo >= -NONE_BELOW and iv.hi <= NONE_BELOW for iv in ivs):
        return "none"
    return "undetermined"


def reading(name: str, res: Dict[str, Any]) -> str:
    first, last = first_above(res), last_position_layer(res)
    toks = res["tokens"]
    where = (f"the first cell whose recovered share is above {THRESHOLD} with its interval is layer {first['layer']}, "
             f"position {first['position']} ({toks[first['position']]!r})" if first else
             f"no cell's interval lies above {THRESHOLD}")
    moved = (f"the last position ({toks[-1]!r}) carries it from layer {last} on" if last is not None else
             "the last position never carries it with its interval above the threshold at the layers patched")
    share = sink_share(res)
    top = max(Interval.from_dict(d).value for d in res["pos0"])
    sink = {"none": f"position 0 ({toks[0]!r}) carries none of it (every layer's interval within ±{NONE_BELOW}, "
                    f"largest mean {top:.3f})",
            "some": f"position 0 ({toks[0]!r}) carries some of it (largest mean {top:.3f}, interval above "
                    f"{NONE_BELOW})",
            "undetermined": f"whether position 0 carries any of it is undetermined at this number of pairs "
                            f"(largest mean {top:.3f})"}[share]
    return f"{name}: {where}; {moved}; {sink}."


def summary(res: Dict[str, Any]) -> str:
    """The reading in one table cell (the report's summary table)."""
    last = last_position_layer(res)
    at = (f"from layer {last} (layers {res['layers'][0]}–{res['layers'][-1]} patched)" if last is not None
          else "at no patched layer")
    return f"last position carries the answer {at}; position 0: {sink_share(res)}"

def markdown(results: Dict[str, Dict[str, Any]]) -> str:
    rows = []
    for name, r in results.items():
        s, first, last = r["settings"], first_above(r), last_position_layer(r)
        rows.append([name, str(s["n_pairs"]), str(s["T"]), num(Interval.from_dict(r["clean_diff"]), ".2f"),
                     num(Interval.from_dict(r["corrupted_diff"]), ".2f"),
                     f"{first['layer']}, {first['position']}" if first else "—",
                     str(last) if last is not None else "—", sink_share(r)])
    return "\n\n".join([
        "**Question.** Which (layer, position) of the residual stream carries the information the model uses to "
        "pick its answer, and does the attention sink at position 0 carry any of it?",
        "**Literature.** Activation patching (denoising) as in causal tracing (Meng et al. 2022, ROME) and the "
        "indirect-object-identification study (Wang et al. 2022); TransformerLens's `patching` module computes "
        "the same grid. **What differs.** Clean and corrupted prompts differ by a name swap of the subject's "
        "second mention (ROME corrupts the subject with Gaussian noise); the whole residual stream entering a "
        "layer is replaced at one position (`resid`, TransformerLens's `hook_resid_pre`); each model uses its own "
        "tokenizer and ⟨bos⟩ rule, and only pairs of equal token length; the quick preset patches every second "
        "layer of 4 pairs. Recovered share = (ld_patched − ld_corrupted) / (ld_clean − ld_corrupted), ld the "
        "logit difference answer − wrong name at the last position; 95 % bootstrap intervals over pairs.",
        table(["model", "pairs", "T", "clean ld", "corrupted ld", f"first cell > {THRESHOLD} (layer, pos)",
               f"last position > {THRESHOLD} from layer", "position 0 carries"], rows),
        "**Reading.** " + " ".join(reading(n, r) for n, r in results.items()) + _why_pos0(results)])


def _why_pos0(results: Dict[str, Dict[str, Any]]) -> str:
    """The structural reason when position 0 is the same token in every pair of every model."""
    if any(0 in r["differing_positions"] for r in results.values()):
        return ""
    return (" Position 0 holds the same token in both prompts of every pair, so in a causal model its stream is "
            "the same in both runs at every layer: a patch there cannot move the answer, and the sink's role, if "
            "any, is in how other positions read it, not in what it stores about the names.")


def figures(results: Dict[str, Dict[str, Any]]) -> Dict[str, Figure]:
    n = len(results)
    X = max(len(r["tokens"]) for r in results.values())
    Lp = max(len(r["layers"]) for r in results.values())
    fig, axes = subplots(1, n, figsize=(n * (2.0 + 0.35 * X), 1.6 + 0.22 * Lp), layout="constrained", squeeze=False)
    for ax, (name, r) in zip(axes[0], results.items()):
        view = _view(name, r)
        patching_figure(view, ax=ax, title=f"{name}: resid patching ({r['settings']['n_pairs']} pairs)")
    return {"beyond_patching.png": fig}


def _view(name: str, r: Dict[str, Any]) -> SimpleNamespace:
    T = int(r["settings"]["T"])
    idx: List[int] = list(range(T))
    return SimpleNamespace(mean=np.asarray(r["mean"], np.float64), lo=np.asarray(r["lo"], np.float64),
                           layers=list(r["layers"]), index=idx, axis="position", over="resid", tokens=r["tokens"],
                           model=name, recovered=np.asarray(r["recovered"], np.float64))
