"""Report section: secondary sinks (attention mass beyond position 0, by token class, and each
head's top keys) per model, from :func:`sinklab.analysis.secondary.secondary_sinks`."""
from __future__ import annotations

from typing import Any, Dict, List

import numpy as np

from ..analysis.secondary import TOKEN_CLASSES, secondary_sinks
from ..analysis.stats import Interval
from ..viz.figure import Figure, subplots
from ..viz.figures_secondary import class_enrichment_figure, secondary_map_figure
from .core import and_list, num, pct_ci, table

TITLE = "Secondary sinks: attention mass beyond the first token"
SUMMARY = "secondary sinks"

EPS = 0.3        # a secondary sink head: some key k >= 1 has a_k above this (Gu et al.'s ε)
N_EXAMPLES = 3   # strongest secondary heads listed per model


def settings(quick: bool) -> Dict[str, int]:
    return {"n_prompts": 6, "T": 512} if quick else {"n_prompts": 6, "T": 8192}


def _examples(r: Any) -> List[Dict[str, Any]]:
    """The N_EXAMPLES heads with the largest mean secondary a_k: their top keys in prompt 0."""
    m = r.a_max2.mean(axis=0)
    flat = np.argsort(-m, axis=None, kind="stable")[:N_EXAMPLES]
    out = []
    for f in flat:
        l, h = int(f // m.shape[1]), int(f % m.shape[1])
        out.append({"layer": l, "head": h, "a_max2": float(m[l, h]), "top": r.head_top(l, h, 0)[:3]})
    return out


def compute(model: Any, quick: bool, progress: bool) -> Dict[str, Any]:
    """Secondary sinks of ``model`` on stretches of the shipped passages joined by blank lines,
    with the model's own ⟨bos⟩ rule (its tokenizer's default)."""
    s = settings(quick)
    r = secondary_sinks(model, T=s["T"], n_prompts=s["n_prompts"], progress=progress)
    top = r.top_class[..., 0]
    modal = np.stack([(top == c).sum(axis=0) for c in range(len(TOKEN_CLASSES))]).argmax(axis=0)
    sm = r.summary()
    return {"settings": {**s, "bos": r.bos, "eps": EPS, "min_queries": r.min_queries}, "T": r.T,
            "first_share": sm["first_share"], "secondary_rate": r.secondary_sink_rate(EPS).to_dict(),
            "classes": sm["classes"], "a_max2_map": r.a_max2.mean(axis=0), "top_class_map": modal,
            "examples": _examples(r), "windows": sorted(set(r.windows)), "n_layers": int(r.a_max2.shape[1]),
            "n_heads": int(r.a_max2.shape[2])}


def _iv(d: Dict[str, Any]) -> Interval:
    return Interval.from_dict(d)


def enriched(res: Dict[str, Any], key: str = "enrich_pos") -> Dict[str, List[str]]:
    """Classes whose enrichment interval lies above 1 (``"more"``), below 1 (``"less"``), or
    contains it (``"as expected"``); classes absent from every prompt are left out."""
    out: Dict[str, List[str]] = {"more": [], "less": [], "as expected": []}
    for name, c in res["classes"].items():
        iv = _iv(c[key])
        if not iv.defined:
            continue
        out["more" if iv.above(1.0) else "less" if iv.below(1.0) else "as expected"].append(name)
    return out


def reading(name: str, res: Dict[str, Any]) -> str:
    e, ef = enriched(res), enriched(res, "enrich_freq")
    cls = res["classes"]
    more = [f"{c} ×{_iv(cls[c]['enrich_pos']).fmt('.2f')}" for c in e["more"]]
    text = (f"{name}: position 0 takes {pct_ci(_iv(res['first_share']))} of all attention mass at T = {res['T']}; "
            f"{pct_ci(_iv(res['secondary_rate']))} of heads have a secondary key with a_k > {EPS}")
    text += (f"; beyond position 0, {and_list(more)} get more mass than uniform attention would give their "
             "positions" if more else "; no class gets more mass than uniform attention would give its positions")
    if e["less"]:
        text += f", {and_list(e['less'])} less"
    if ef["more"]:
        text += f" (over frequency alone: {and_list(ef['more'])} enriched)"
    ex = res["examples"][0] if res["examples"] else None
    if ex and ex["top"]:
        t = ex["top"][0]
        text += (f". Strongest secondary head L{ex['layer']}H{ex['head']} (mean max a_k {ex['a_max2']:.2f}): its top "
                 f"key in prompt 0 is {t['token']!r} ({t['class']}, a = {t['a']:.2f})")
    return text + "."


def summary(res: Dict[str, Any]) -> str:
    """The reading in one table cell (the report's summary table)."""
    more = enriched(res)["more"]
    return (f"T = {res['T']}: position 0 {pct_ci(_iv(res['first_share']))} of the mass; {pct_ci(_iv(res['secondary_rate']))} of heads "
            f"with a secondary a_k > {EPS}; more than uniform: {and_list(more) if more else 'none'}")

def markdown(results: Dict[str, Dict[str, Any]]) -> str:
    rows = []
    for name, r in results.items():
        for c in TOKEN_CLASSES[1:]:
            d = r["classes"][c]
            rows.append([name, c, pct_ci(_iv(d["freq"]), ".2f"), pct_ci(_iv(d["share"]), ".2f"),
                         num(_iv(d["enrich_freq"]), ".2f"), num(_iv(d["enrich_pos"]), ".2f"),
                         pct_ci(_iv(d["top_heads"]), ".0f")])
    head = []
    for name, r in results.items():
        head.append([name, "⟨bos⟩ + text" if r["settings"]["bos"] else "text only", str(r["T"]),
                     str(r["settings"]["n_prompts"]), ", ".join(str(w) for w in r["windows"]),
                     pct_ci(_iv(r["first_share"])), pct_ci(_iv(r["secondary_rate"]))])
    ex = []
    for name, r in results.items():
        for e in r["examples"]:
            ex.append([name, f"L{e['layer']}H{e['head']}", f"{e['a_max2']:.3f}",
                       "; ".join(f"{t['token']!r} @{t['pos']} ({t['class']}, {t['a']:.2f})".replace("|", "\\|")
                                 for t in e["top"])])
    return "\n\n".join([
        "**Question.** Is position 0 the only sink, or do other keys, newlines, full stops, brackets, "
        "collect attention too, and more than their frequency and their position would give them? Sun et al. "
        "(2024) find massive activations on the first token and on delimiters such as '.' and '\\n'; studies of "
        "sinks beyond the first token (e.g. Yu et al., 2024) report them on tokens of little meaning. Gu et al.'s "
        "importance a_k (the paper's sink metric) is defined for every key; the paper reports it for k = 0 only.",
        "**Here.** Stretches of the shipped passages joined by blank lines (so newlines occur between passages), "
        "each model with its own ⟨bos⟩ rule. a_k for every key is streamed by the C kernel (no T × T matrix; "
        "under a sliding window converted exactly to the mean over the queries that see k). Token classes from "
        "each key's decoded string (a token holding a line break is a newline: Qwen2.5 merges '.\\n\\n' into one "
        "token, SmolLM2 splits '\\n\\n' in two). Per head, the class's share of the mass on keys k ≥ 1, over its "
        "frequency and over its share under uniform attention (which carries only the positional advantage of "
        "early keys); "
        f"means over heads within each prompt, intervals over prompts. Secondary sink heads: some key "
        f"1 ≤ k ≤ T − {next(iter(results.values()))['settings']['min_queries']} with a_k > {EPS}. Differs from "
        "the literature: literary prose only (no code, no chat), few long prompts, small models.",
        table(["model", "input", "T", "prompts", "windows (0: full)", "mass on position 0", "secondary sink heads"],
              head),
        table(["model", "class", "frequency (keys ≥ 1)", "mass share", "enrichment over frequency",
               "enrichment over position", "heads whose top key"], rows),
        table(["model", "head", "mean max a_k", "top keys in prompt 0 (token @position (class, a_k))"], ex),
        "**Reading.** " + " ".join(reading(n, r) for n, r in results.items())])


def figures(results: Dict[str, Dict[str, Any]]) -> Dict[str, Figure]:
    n = len(results)
    fig, axes = subplots(1, n, figsize=(5.0 * n, 3.6), layout="constrained", squeeze=False)
    for ax, (name, r) in zip(axes[0], results.items()):
        class_enrichment_figure(r["classes"], ax=ax, title=f"{name} (T={r['T']})")
    H = max(r["n_heads"] for r in results.values())
    L = max(r["n_layers"] for r in results.values())
    fig2, axes2 = subplots(1, n, figsize=(n * (1.6 + 0.45 * H), 1.4 + 0.22 * L), layout="constrained", squeeze=False)
    for ax, (name, r) in zip(axes2[0], results.items()):
        secondary_map_figure(np.asarray(r["a_max2_map"]), np.asarray(r["top_class_map"]), TOKEN_CLASSES, ax=ax,
                             title=f"{name}: max secondary a_k")
    return {"beyond_secondary_classes.png": fig, "beyond_secondary_heads.png": fig2}
