"""Report section: windowed attention with and without kept sink tokens (StreamingLLM) per model,
from :func:`sinklab.analysis.windowed.windowed_perplexity`."""
from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any, Dict

from ..analysis.stats import Interval
from ..analysis.windowed import windowed_perplexity
from ..viz.figure import Figure, subplots
from ..viz.figures_beyond import windowed_figure
from .core import table

TITLE = "Windowed attention with and without sink tokens (StreamingLLM)"
SUMMARY = "windowed attention: perplexity ratio, k first tokens kept"

EXPLODES = math.log(2.0)   # ΔNLL above this over the whole interval: perplexity more than doubles
NEAR_FULL = math.log(1.1)  # ΔNLL below this over the whole interval: within 10 % of full attention


def settings(quick: bool) -> Dict[str, Any]:
    if quick:
        return {"T": 512, "windows": (64, 128), "keeps": (0, 1, 4), "n_texts": 3, "n_scored": 128}
    return {"T": 8192, "windows": (256, 512, 1024), "keeps": (0, 1, 4), "n_texts": 4, "n_scored": 256}


def compute(model: Any, quick: bool, progress: bool) -> Dict[str, Any]:
    """The windowed NLLs of ``model`` (its own ⟨bos⟩ rule) and, per (w, k), the intervals of
    ΔNLL against full attention and of what the k kept tokens win back."""
    s = settings(quick)
    r = windowed_perplexity(model, T=s["T"], windows=s["windows"], keeps=s["keeps"], n_texts=s["n_texts"],
                            n_scored=s["n_scored"], progress=progress)
    out = r.to_dict()
    out["delta"] = {str(w): {str(k): r.delta(w, k).to_dict() for k in r.keeps} for w in r.windows}
    out["gain"] = {str(w): {str(k): r.sink_gain(w, k).to_dict() for k in r.keeps if k} for w in r.windows}
    return out


def _iv(res: Dict[str, Any], what: str, w: Any, k: Any) -> Interval:
    return Interval.from_dict(res[what][str(w)][str(k)])


def _ratio(iv: Interval) -> str:
    return f"×{math.exp(iv.value):.2f} [{math.exp(iv.lo):.2f}, {math.exp(iv.hi):.2f}]" if iv.defined else "—"


def plain_window(iv: Interval) -> str:
    """What a window without kept tokens does: "explodes" (the ΔNLL interval above ln 2), "rises"
    (above 0), "no detectable change" or "falls"."""
    return ("explodes" if iv.above(EXPLODES) else "rises" if iv.above(0) else
            "falls" if iv.below(0) else "no detectable change")


def kept(delta: Interval, gain: Interval) -> str:
    """What k kept tokens do: "restores" (they win back NLL and end within 10 % of full
    attention), "helps" (they win back NLL), "no detectable help"."""
    if gain.above(0):
        return "restores" if delta.below(NEAR_FULL) else "helps"
    return "hurts" if gain.below(0) else "no detectable help"


def reading(name: str, res: Dict[str, Any]) -> str:
    first = "⟨bos⟩" if res["bos"] else "first text token"
    parts = []
    for w in res["windows"]:
        d0 = _iv(res, "delta", w, 0)
        ks = [f"first {k} kept ({first if k == 1 else 'incl. the ' + first}): "
              f"{kept(_iv(res, 'delta', w, k), _iv(res, 'gain', w, k))} ({_ratio(_iv(res, 'delta', w, k))})"
              for k in res["keeps"] if k]
        parts.append(f"w = {w}: without kept tokens perplexity {plain_window(d0)} ({_ratio(d0)}); " + "; ".join(ks))
    return f"{name} (position 0 = {first}): " + ". ".join(parts) + "."


def summary(res: Dict[str, Any]) -> str:
    """The reading in one table cell (the report's summary table): the smallest window."""
    w = min(res["windows"])
    d0 = _iv(res, "delta", w, 0)
    ks = [f"k {k}: {_ratio(_iv(res, 'delta', w, k))}, {kept(_iv(res, 'delta', w, k), _iv(res, 'gain', w, k))}"
          for k in res["keeps"] if k]
    return f"w = {w}, T = {res['T']}: k 0: {_ratio(d0)}, {plain_window(d0)}; " + "; ".join(ks)

def markdown(results: Dict[str, Dict[str, Any]]) -> str:
    rows = []
    for name, r in results.items():
        for w in r["windows"]:
            for k in r["keeps"]:
                d = _iv(r, "delta", w, k)
                g = _iv(r, "gain", w, k).fmt(".3f") if k else "—"
                rows.append([name, "⟨bos⟩ + text" if r["bos"] else "text only", str(r["T"]), str(w), str(k),
                             d.fmt(".3f"), _ratio(d), g, plain_window(d) if not k else
                             kept(d, _iv(r, "gain", w, k))])
    own = {n: r.get("extra", {}).get("own_windows", []) for n, r in results.items()}
    own_txt = "; ".join(f"{n}: own sliding windows {[x for x in o if x] or 'none'}" for n, o in own.items())
    return "\n\n".join([
        "**Question.** When every query sees only its w most recent keys, how much does next-token loss rise, and "
        "how much do the first k tokens, kept visible to every query, win back? StreamingLLM (Xiao et al., 2024) "
        "reports that perplexity explodes without them and recovers with about 4 kept tokens, the attention sinks; "
        "the paper (§3) explains why models need such a sink.",
        f"**Here.** Stretches of the shipped passages (joined; each starts at another passage, the intervals' units) "
        f"with each model's own ⟨bos⟩ rule, so Gemma 3 sees a ⟨bos⟩ at position 0 and SmolLM2 / Qwen2.5 (trained "
        f"without a fixed ⟨bos⟩) a text token. The mask is applied in one forward (`Model.run(window=w, "
        f"keep_first=k)`), not with StreamingLLM's rolling KV cache and re-assigned positions: positions keep their "
        f"absolute RoPE angles. A layer's own smaller window is kept ({own_txt}); the kept k are added in every "
        f"layer. Scored: the last {', '.join(sorted({str(r['n_scored']) for r in results.values()}))} predictions "
        f"of each stretch. ΔNLL is paired against full attention on the same tokens (nats, 95 % bootstrap over "
        f"stretches); 'explodes' means the interval of the perplexity ratio lies above ×2, 'restores' that the "
        f"kept tokens win back loss and the ratio's interval lies below ×1.1.",
        table(["model", "input", "T", "w", "k kept", "ΔNLL vs full (nats)", "perplexity ratio",
               "won back by k (nats)", "reading"], rows),
        "**Reading.** " + " ".join(reading(n, r) for n, r in results.items())])


def figures(results: Dict[str, Dict[str, Any]]) -> Dict[str, Figure]:
    n = len(results)
    fig, axes = subplots(1, n, figsize=(4.2 * n, 3.4), layout="constrained", squeeze=False)
    for ax, (name, r) in zip(axes[0], results.items()):
        view = SimpleNamespace(windows=tuple(r["windows"]), keeps=tuple(r["keeps"]), model=name, T=r["T"],
                               delta=lambda w, k, r=r: _iv(r, "delta", w, k))
        windowed_figure(view, ax=ax, title=f"{name} (T={r['T']})")
    return {"beyond_windowed.png": fig}

