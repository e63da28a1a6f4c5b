"""``sinklab reproduce``: every analysis of the paper that runs on a trained model, in one report.

Writes ``report.md`` (Markdown with PNG figures) and ``results.json`` (every number, with the
model file's sha256, the BOS token used, eps, T, prompt counts and library versions) to ``out``.
``quick=True`` uses smaller prompt sets and lengths so the whole report takes a few minutes on
two cores; the full run follows the paper's protocol (all passages, contexts up to the model's).
"""
from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Tuple

import numpy as np

from . import figures_mixing, figures_sinks, plots
from .collapse import collapse_vs_length
from .interventions import Intervention
from .noop import find_conditional_heads, noop_analysis
from .perturbation import perturb
from .prompts import load_passages
from .quality import compare_bos_quality, perplexity
from .results import to_jsonable
from .sinkset import compare_bos

# The paper's example (Fig. 2): a word replaced by one of the same token length.
PERTURBATION = ("The greatest thing about living in this city is the food, which is cheap and always fresh, "
                "and the people are kind to strangers who ask for directions.", "greatest", "best")
# Sentence pairs with and without the trigger "'s", for the search for conditional heads (§3).
APOSTROPHE = [
    ("John's car is parked outside the old house by the river.",
     "The car is parked outside the old house by the river."),
    ("The dog's bone was buried deep in the garden behind the shed.",
     "A bone was buried deep in the garden behind the shed."),
    ("My sister's new job starts next week in the city centre.",
     "My sister starts a new job next week in the city centre."),
    ("The company's profits rose sharply during the last quarter of the year.",
     "The profits of the company rose sharply during the last quarter of the year."),
    ("We borrowed Maria's bicycle to ride along the coast road.",
     "We borrowed a bicycle from Maria to ride along the coast road."),
    ("The teacher's voice echoed through the empty classroom after school.",
     "The voice of the teacher echoed through the empty classroom after school."),
    ("Our neighbour's cat sleeps on the warm roof every afternoon.",
     "The cat of our neighbour sleeps on the warm roof every afternoon."),
    ("The book's cover was torn, but the pages were still clean.",
     "The cover of the book was torn, but the pages were still clean."),
]


@dataclass
class Settings:
    """Sizes of each experiment; ``Settings.for_run(quick)`` gives the two presets."""

    sink_prompts: int
    sink_T: int
    long_T: int
    noop_prompts: int
    collapse_lengths: Tuple[int, ...]
    ppl_texts: int
    ppl_max_tokens: int
    passkey_quick: bool
    eps: Tuple[float, ...] = (0.3, 0.8)

    @classmethod
    def for_run(cls, quick: bool) -> "Settings":
        if quick:
            return cls(sink_prompts=32, sink_T=64, long_T=1024, noop_prompts=8, collapse_lengths=(16, 64, 256),
                       ppl_texts=12, ppl_max_tokens=256, passkey_quick=True)
        return cls(sink_prompts=144, sink_T=64, long_T=8192, noop_prompts=40,
                   collapse_lengths=(16, 64, 256, 1024, 4096), ppl_texts=36, ppl_max_tokens=1024,
                   passkey_quick=False)


@dataclass
class Section:
    title: str
    text: str
    figures: List[str] = field(default_factory=list)
    numbers: Dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0


def _save(fig, out: str, name: str) -> str:
    fig.savefig(os.path.join(out, name), dpi=120)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return name


# ---------------------------------------------------------------------- sections
def section_sinks(model, s: Settings, out: str, progress: bool) -> Section:
    prompts = load_passages("sinks")[: s.sink_prompts]
    cmp = compare_bos(model, prompts, T=s.sink_T, eps=s.eps, progress=progress)
    figs = [_save(figures_sinks.bos_comparison_figure(cmp.with_bos, cmp.without_bos, eps=s.eps[0]), out,
                  "sinks_bos.png")]
    text = (f"First-token importance a_0 (Gu et al.; PAPER.md §1) over {len(prompts)} passages cut to their "
            f"first {s.sink_T} tokens, with and without the BOS token.\n\n" + cmp.table())
    return Section("Attention sinks (sink rate)", text, figs, cmp.summary())


def _long_text(model, T: int) -> np.ndarray:
    ids: List[int] = []
    for p in load_passages("all"):
        ids.extend(int(i) for i in model.tokenize(p + "\n\n", bos=False))
        if len(ids) >= T:
            break
    return np.asarray(ids[:T], np.int64)


def section_long_context(model, s: Settings, out: str, progress: bool) -> Section:
    T = min(s.long_T, model.config.context_length - 1)
    text_ids = _long_text(model, T)
    T = len(text_ids)
    stats, secs = {}, {}
    for key, bos in (("with_bos", True), ("without_bos", False)):
        ids = np.concatenate([[model.config.bos_token_id], text_ids[:-1]]) if bos else text_ids
        t0 = time.perf_counter()
        stats[key] = model.run(ids, capture=("stats",), logits_from=-1, progress=False).stats
        secs[key] = time.perf_counter() - t0
    to_first = {k: v.to_first[:, :, 1:].mean(axis=(1, 2)) for k, v in stats.items()}  # (L,)
    entropy = {k: v.entropy[:, :, 1:].mean(axis=(1, 2)) for k, v in stats.items()}
    rate = {k: {str(e): float((v.importance[:, :, 0] > e).mean()) for e in s.eps} for k, v in stats.items()}
    fig = plots.layer_lines({"attention to position 0": to_first, "row entropy (nats)": entropy},
                            title=f"{model.name}: T={T} tokens, attention statistics computed in C (no T×T buffer)")
    figs = [_save(fig, out, "long_context.png")]
    text = (f"One sequence of {T} tokens (passages concatenated), attention statistics streamed from the C "
            f"kernel. Mean attention to position 0 and mean row entropy over heads and queries 1..T-1, "
            f"per layer.\n\n| | with BOS | without BOS |\n|---|---|---|\n"
            f"| mean attention to position 0 | {to_first['with_bos'].mean():.3f} | {to_first['without_bos'].mean():.3f} |\n"
            f"| mean row entropy (nats) | {entropy['with_bos'].mean():.3f} | {entropy['without_bos'].mean():.3f} |\n"
            + "".join(f"| sink rate eps={e:g} at T={T} | {100 * rate['with_bos'][str(e)]:.2f}% | "
                      f"{100 * rate['without_bos'][str(e)]:.2f}% |\n" for e in s.eps)
            + f"| forward seconds | {secs['with_bos']:.1f} | {secs['without_bos']:.1f} |")
    return Section(f"Long context (T={T})", text, figs,
                   {"T": T, "to_first_per_layer": to_first, "entropy_per_layer": entropy, "sink_rate": rate,
                    "seconds": secs})


def section_interventions(model, s: Settings, out: str, progress: bool) -> Section:
    texts = load_passages("heldout")[: s.ppl_texts]
    runs = {"BOS, no intervention": (True, None),
            "BOS, value of position 0 zeroed (all heads)": (True, Intervention(zero_first_value=True)),
            "BOS, attention to position 0 masked (all heads)": (True, Intervention(mask_first=True)),
            "no BOS": (False, None)}
    res = {name: perplexity(model, texts, bos=bos, max_tokens=s.ppl_max_tokens, intervene=iv, progress=progress)
           for name, (bos, iv) in runs.items()}
    rows = "".join(f"| {name} | {r.perplexity:.2f} | {r.mean_nll:.4f} |\n" for name, r in res.items())
    text = (f"Held-out perplexity on {len(texts)} passages (≤ {s.ppl_max_tokens} tokens) under interventions "
            f"applied inside the C forward. If the sink is an approximate no-op (§3), zeroing the value of "
            f"position 0 should cost little, while forbidding attention to it forces heads to mix.\n\n"
            f"| condition | perplexity | mean NLL (nats) |\n|---|---|---|\n{rows}")
    return Section("Interventions on the first token", text, [],
                   {name: {"perplexity": r.perplexity, "mean_nll": r.mean_nll} for name, r in res.items()})


def section_noop(model, s: Settings, out: str, progress: bool) -> Section:
    prompts = load_passages("sinks")[: s.noop_prompts]
    res = noop_analysis(model, prompts, bos=True, max_tokens=s.sink_T, progress=progress)
    summ = res.summary(0.5)
    summ.pop("per_head", None)
    cond = find_conditional_heads(model, [a for a, _ in APOSTROPHE], [b for _, b in APOSTROPHE], trigger="'s",
                                  top=8, progress=progress)
    figs = [_save(figures_mixing.noop_figure(res), out, "noop.png"),
            _save(figures_mixing.conditional_heads_figure(cond), out, "conditional_heads.png")]
    g = lambda k: summ.get(k, float("nan"))  # noqa: E731
    text = (f"Do sink heads write little to the residual stream (PAPER.md §3)? {len(prompts)} passages, "
            f"{s.sink_T} tokens, with BOS; a head is a sink head when its mean attention to position 0 exceeds 0.5.\n\n"
            f"| | sink heads | other heads |\n|---|---|---|\n"
            f"| heads | {g('n_sink_heads')} | {g('n_heads') - g('n_sink_heads')} |\n"
            f"| median head-output norm / residual norm | {g('median_rel_out_norm_sink_heads'):.4f} | "
            f"{g('median_rel_out_norm_other_heads'):.4f} |\n"
            f"| median value norm of position 0 / median of other tokens | {g('median_first_value_ratio_sink_heads'):.3f} | "
            f"{g('median_first_value_ratio_other_heads'):.3f} |\n"
            f"| median correlation over queries (attention to 0 vs output norm) | "
            f"{g('median_query_corr_to_first_vs_out_norm_sink_heads'):.3f} | "
            f"{g('median_query_corr_to_first_vs_out_norm_other_heads'):.3f} |\n\n"
            f"Spearman correlation across heads, sink mass vs relative output norm: "
            f"{g('spearman_sink_mass_vs_rel_out_norm_across_heads'):.3f}.\n\n"
            f"Search for conditional heads (attend to \"'s\" when present, to position 0 otherwise), "
            f"{len(APOSTROPHE)} sentence pairs:\n\n" + cond.table())
    return Section("Sinks as approximate no-ops", text, figs, {"noop": summ, "conditional_heads": cond.summary()})


def section_perturbation(model, s: Settings, out: str, progress: bool) -> Section:
    text_, old, new = PERTURBATION
    r = perturb(model, text_, old, new, bos="both", progress=progress)
    ratio = np.asarray(r.spread_ratio(), np.float64)
    ent = {k: float(np.mean(r.mean_entropy(k))) for k in ("bos", "nobos")}
    figs = [_save(figures_mixing.perturbation_heatmaps(r), out, "perturbation_heatmaps.png"),
            _save(figures_mixing.perturbation_lines(r), out, "perturbation_lines.png")]
    text = (f"\"{old}\" → \"{new}\" in: _{text_}_\n\nPer layer and position, ||v − ṽ|| / ||v|| (PAPER.md §4), "
            f"with and without BOS (positions aligned). Spread ratio without/with BOS over layers 1..L: "
            f"mean {np.nanmean(ratio[1:]):.3f}, min {np.nanmin(ratio[1:]):.3f}, max {np.nanmax(ratio[1:]):.3f}, "
            f"last layer {ratio[-1]:.3f}. Mean attention entropy over layers: {ent['bos']:.3f} nats with BOS, "
            f"{ent['nobos']:.3f} without.")
    return Section("Perturbation propagation", text, figs, {"summary": r.summary(), "spread_ratio": ratio,
                                                            "mean_entropy": ent})


def section_collapse(model, s: Settings, out: str, progress: bool) -> Section:
    passage = " ".join(load_passages("all"))
    lengths = tuple(T for T in s.collapse_lengths if T < model.config.context_length)
    c = collapse_vs_length(model, passage, lengths=lengths, bos="both", progress=progress)
    figs = [_save(figures_mixing.collapse_figure(c), out, "collapse.png")]
    summ = c.summary()
    rows = "".join(f"| {T} | " + " | ".join(f"{c.rank[k][i, -1]:.3f} | {c.repr_rel[k][i, -1]:.3f}" for k in c.settings)
                   + " |\n" for i, T in enumerate(c.lengths))
    head = " | ".join(f"rank residual ({k}) | repr. distance ({k})" for k in c.settings)
    text = (f"Rank-collapse residual ||V − 1μᵀ||_F/||V||_F and representational-collapse distance "
            f"(last token vs the same sequence with it repeated, relative) at the last layer (PAPER.md §2).\n\n"
            f"| T | {head} |\n|---" + "|---" * (2 * len(c.settings)) + "|\n" + rows)
    return Section("Rank and representational collapse", text, figs, summ)


def section_quality(model, s: Settings, out: str, progress: bool) -> Section:
    q = compare_bos_quality(model, quick=s.passkey_quick, texts=load_passages("heldout")[: s.ppl_texts],
                            max_tokens=s.ppl_max_tokens, progress=progress)
    figs = [_save(figures_sinks.passkey_figure(q.passkey["with_bos"], q.passkey["without_bos"]), out, "passkey.png")]
    text = ("Held-out perplexity and synthetic passkey retrieval with and without BOS (PAPER.md §8 stand-in; "
            "BOS removed at inference only).\n\n" + q.table())
    return Section("Quality with and without BOS", text, figs, q.to_dict())


SECTIONS: List[Tuple[str, Callable]] = [
    ("sinks", section_sinks), ("long_context", section_long_context), ("interventions", section_interventions),
    ("noop", section_noop), ("perturbation", section_perturbation), ("collapse", section_collapse),
    ("quality", section_quality)]


# ---------------------------------------------------------------------- report
def _versions() -> Dict[str, str]:
    import matplotlib
    import numpy

    from . import __version__, _core

    return {"sinklab": __version__, "numpy": numpy.__version__, "matplotlib": matplotlib.__version__,
            "python": platform.python_version(), "platform": platform.platform(), "simd": _core.simd(),
            "threads": str(_core.get_num_threads())}


def reproduce(model_name: str = "smollm2-135m-instruct", out: str = "sinklab-report", quick: bool = False,
              progress: bool = True) -> Dict[str, Any]:
    """Runs every section, writes ``out/report.md``, the figures and ``out/results.json``; returns the JSON."""
    from . import load
    from .registry import sha256_file

    os.makedirs(out, exist_ok=True)
    s = Settings.for_run(quick)
    t_all = time.perf_counter()
    model = load(model_name, quiet=not progress)
    c = model.config
    bos_id = c.bos_token_id
    bos_str = model.tokenizer.decode([bos_id]) if (model.tokenizer is not None and bos_id is not None) else None
    meta = {"model": model.name, "source": model.source,
            "sha256": sha256_file(model.source) if os.path.isfile(model.source) else None,
            "config": c.to_dict(), "bos_token_id": bos_id, "bos_token": bos_str, "eps": list(s.eps),
            "quick": quick, "settings": vars(s), "versions": _versions(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S %z")}
    sections: Dict[str, Section] = {}
    for key, fn in SECTIONS:
        t0 = time.perf_counter()
        sec = fn(model, s, out, progress)
        sec.seconds = time.perf_counter() - t0
        sections[key] = sec
    meta["seconds_total"] = time.perf_counter() - t_all
    results = to_jsonable({"meta": meta, **{k: {"title": v.title, "seconds": v.seconds, "figures": v.figures,
                                                "numbers": v.numbers} for k, v in sections.items()}})
    with open(os.path.join(out, "results.json"), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)
    with open(os.path.join(out, "report.md"), "w", encoding="utf-8") as f:
        f.write(_markdown(meta, sections))
    return results


def _markdown(meta: Dict[str, Any], sections: Dict[str, Section]) -> str:
    c = meta["config"]
    lines = [f"# sinklab report: {meta['model']}", "",
             f"Reproduction of Barbero et al., *Why do LLMs attend to the first token?* (arXiv 2504.02732) on "
             f"`{os.path.basename(meta['source'])}` (sha256 `{meta['sha256']}`): {c['n_layers']} layers × "
             f"{c['n_heads']} heads ({c['n_kv_heads']} KV heads), d={c['d_model']}, context {c['context_length']}.",
             f"BOS token: id {meta['bos_token_id']} ({meta['bos_token']!r}); 'with BOS' means it was prepended, "
             f"'without' that the text starts at its first token. eps = {', '.join(map(str, meta['eps']))}. "
             f"{'Quick settings' if meta['quick'] else 'Full settings'}; total {meta['seconds_total']:.0f} s "
             f"({meta['versions']['threads']} threads, {meta['versions']['simd']} kernels). Every number is in "
             f"`results.json`.", ""]
    for sec in sections.values():
        lines += [f"## {sec.title}", "", sec.text, ""]
        lines += [f"![{name}]({name})" for name in sec.figures]
        lines += ["", f"_{sec.seconds:.1f} s_", ""]
    return "\n".join(lines)
