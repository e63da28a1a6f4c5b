"""``sinklab reproduce``: the paper's analyses that run on a trained model, in one report.

Writes ``report.md`` (Markdown with PNG figures) and ``results.json`` (every number, with the
model's sha256, the BOS token used, eps, T, prompt counts and library versions) to ``out``.

The report opens with a table of every element of Barbero et al. (2025) — its definitions,
Prop. 3.1, Thm. 3.2, Fig. 2, 3 and 5, Tables 1 and 2, and the ⟨bos⟩-removal benchmarks — with
its status here: *reproduced here* (same measurement, another model), *in miniature* (the
paper's pre-training protocol on small models trained here, :mod:`sinklab.train.experiments`),
*stand-in* (a cheaper or local measurement of the same question) or *not yet*. Each section
then says which paper element it stands for, what is the same and what differs, the paper's
number beside ours where the paper gives one, and a reading that follows from its numbers
(including where they disagree).

``quick=True`` uses smaller prompt sets and lengths (the README gives the measured times of both
presets); the full run follows the paper's protocol as far as one CPU allows.

The last section, *Pre-training in miniature*, is the only one that does not use ``model_name``:
it trains (``quick``: the smoke-test profile, seconds) or reads (the cpu profile's summaries,
when ``sinklab experiment ... --profile cpu`` has written them under ``training_root``) the
paper's Fig. 5 and Table 2 experiments; its files go to ``out/training/``.
"""
from __future__ import annotations

import math
import os
import platform
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from .viz import figures_mixing, figures_oversquashing, figures_sensitivity, figures_sinks, plots
from .viz.figures_training import fig5_miniature_figure, sink_T, table2_miniature_figure, uniform_first_importance
from .analysis.squashing_study import squashing_study
from .analysis.collapse import collapse_vs_length
from .interventions import Intervention
from .analysis.noop import find_conditional_heads, noop_analysis
from .analysis.perturbation import perturbation_study
from .prompts import load_passages
from .analysis.quality import compare_bos_quality, perplexity
from .inputs import BOS, LABELS, NOBOS, prepare
from .results import save_json, to_jsonable
from .analysis.sinkset import compare_bos, sink_study

# Sentence pairs with and without the trigger "'s", for the search for conditional heads: the
# paper's "apostrophe head" in Gemma 7B attends to an apostrophe when one is present and to
# ⟨bos⟩ otherwise. These sentences are ours; the paper's prompts are not published.
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

# The paper's numbers quoted beside ours.
TABLE1 = {"LLaMA 3.1 8B": (45.97, "32 × 32"), "LLaMA 3.1 70B": (73.49, "80 × 64"),
          "LLaMA 3.1 405B": (78.29, "126 × 128")}
TABLE2_NO_FIXED_BOS = {"⟨bos⟩+text": (65.10, 2.69), "text only": (65.15, 2.70)}
TABLE2_FIXED_BOS = {"⟨bos⟩+text": (90.84, 2.69), "text only": (0.05, 7.56)}
GEMMA_BOS_REMOVAL = {"ARC-e": (80.77, 28.49), "ARC-c": (53.50, 22.53), "PIQA": (81.72, 52.77),
                     "SIQA": (48.26, 34.70), "HellaSwag": (80.61, 27.35), "Winogrande": (72.85, 49.41),
                     "RULER (4096 ctx)": (82.57, 0.00)}

# Every element of the paper, with its status here. Sections fill in "where".
PAPER_ELEMENTS: List[Tuple[str, str, str, str]] = [
    ("Sink metric and sink rate (Gu et al.'s a_k, eps = 0.3 / 0.8)", "used throughout", "reproduced here", "sinks"),
    ("Table 1: sink rate grows with model size (LLaMA 3.1 8B/70B/405B, eps = 0.8)",
     "45.97 / 73.49 / 78.29 %", "stand-in: four decoders of three families (135M–1.5B) and an encoder in the "
     "families report (`sinklab reproduce --families`); this model's eps = 0.8 rate is shown beside Table 1",
     "sinks"),
    ("Prop. 3.1: rank collapse implies representational collapse", "a bound",
     "reproduced here: checked on every layer", "collapse"),
    ("Rank and representational collapse grow with depth and context length", "qualitative",
     "reproduced here", "collapse"),
    ("Thm. 3.2: multi-head over-squashing bound vs the measured Jacobian", "a bound",
     "reproduced here: the bound with constants derived for this architecture, against exact Jacobians",
     "oversquashing"),
    ("Fig. 2–3: a one-word perturbation spreads further without ⟨bos⟩; attention is smoother",
     "Gemma 7B, one prompt", "stand-in: many word swaps on another model", "perturbation"),
    ("Sinks as approximate no-ops; the 'apostrophe head' of Gemma 7B", "qualitative",
     "stand-in: head-output norms, ⟨bos⟩ value norms, a conditional-head search, and a no-op intervention",
     "noop"),
    ("Fig. 5: sinks grow with the pre-training context length", "~120M LLaMA-2-style models, contexts 128–2048, "
     "5B tokens each",
     "in miniature: small LLaMA-style models trained here at several contexts with equal tokens per step and in "
     "total (`sinklab experiment fig5`); the report's long-context section varies the inference context instead",
     "training"),
    ("Table 2: data packing and a fixed ⟨bos⟩ in pre-training", "sink % and val. loss, e.g. 90.84% → 0.05%, "
     "2.69 → 7.56",
     "in miniature: the four training conditions trained here, seven rows beside the paper's (`sinklab experiment "
     "table2`); its inference rows are also measured on Gemma-3-270M and Qwen2.5-0.5B in the families report",
     "training"),
    ("Removing ⟨bos⟩ at inference hurts Gemma 7B (ARC, PIQA, HellaSwag, RULER, …)", "e.g. RULER 82.57 → 0.00",
     "stand-in: perplexity and a local passkey task, on this model and, in the families report, on "
     "Gemma-3-270M (trained with a fixed ⟨bos⟩)", "quality"),
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
    perturb_passages: int
    perturb_swaps: int
    squash_T: int = 64
    squash_lengths: Tuple[int, ...] = (64, 256, 1024)
    squash_probes: int = 32
    eps: Tuple[float, ...] = (0.3, 0.8)
    bos: bool = True

    @classmethod
    def for_run(cls, quick: bool, eps: Sequence[float] = (0.3, 0.8), bos: bool = True) -> "Settings":
        eps = tuple(float(e) for e in eps)
        if not eps or not all(0 < e < 1 for e in eps):
            raise ValueError(f"eps must be one or more thresholds in (0, 1), got {eps}")
        if quick:
            return cls(sink_prompts=32, sink_T=64, long_T=1024, noop_prompts=8, collapse_lengths=(16, 64, 256),
                       ppl_texts=12, ppl_max_tokens=256, passkey_quick=True, perturb_passages=10,
                       perturb_swaps=3, squash_T=16, squash_lengths=(32, 128), squash_probes=16, eps=eps, bos=bos)
        return cls(sink_prompts=144, sink_T=64, long_T=8192, noop_prompts=40,
                   collapse_lengths=(16, 64, 256, 1024, 4096), ppl_texts=36, ppl_max_tokens=1024,
                   passkey_quick=False, perturb_passages=30, perturb_swaps=3, squash_T=64,
                   squash_lengths=(64, 256, 1024), squash_probes=32, eps=eps, bos=bos)


@dataclass
class Section:
    """One section of the report.

    ``paper``: the paper element it stands for, with the paper's number where it gives one.
    ``here``: what is the same and what differs (model, scale, protocol). ``body``: tables.
    ``reading``: one or two sentences that follow from the numbers.
    """

    title: str
    paper: str
    here: str
    body: str
    reading: str
    figures: List[str] = field(default_factory=list)
    numbers: Dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0


@dataclass
class Context:
    """What every section needs: the model, the settings, where to write, and what earlier
    sections computed (so nothing is computed twice)."""

    model: Any
    s: Settings
    out: str
    progress: bool
    done: Dict[str, Section] = field(default_factory=dict)
    shared: Dict[str, Any] = field(default_factory=dict)
    training_profile: str = "auto"        # the pre-training section: see training_results()
    training_root: str = "sinklab-experiments"

    def save(self, fig: Any, name: str) -> str:
        fig.savefig(os.path.join(self.out, name), dpi=120)
        return name

    @property
    def bos_token(self) -> str:
        m = self.model
        bid = m.config.bos_token_id
        return "none" if bid is None else f"id {bid}, {m.detokenize([bid])!r}"

    @property
    def bos_trained_note(self) -> str:
        """Whether the model's own tokenizer prepends ⟨bos⟩, i.e. whether it was trained with a
        fixed ⟨bos⟩ like Gemma (Table 2 says that decides what removing it does)."""
        tok = self.model.tokenizer
        adds = getattr(tok, "add_bos_default", None)
        if self.model.config.bidirectional:
            return (f"{self.model.name} is a bidirectional encoder: its first token ({self.bos_token}) starts every "
                    f"training sequence, and every query sees it, so first-token importance averages over all "
                    f"queries, not only the later ones.")
        if adds is None:
            return "Whether this model was trained with a fixed ⟨bos⟩ is not recorded in its file."
        if adds:
            return ("Its tokenizer prepends ⟨bos⟩ by default, so it was most likely trained with a fixed ⟨bos⟩, "
                    "as Gemma was.")
        return (f"Its tokenizer does not prepend this token ({self.bos_token}) by default: the model was not "
                f"trained to rely on a fixed ⟨bos⟩, so it corresponds to Table 2's rows *without* a fixed "
                f"⟨bos⟩, not to Gemma.")


def _pct(x: float) -> str:
    return f"{100 * x:.2f}%"


def _encoder_skip(c: Context, title: str, paper: str) -> Optional[Section]:
    """The section, skipped with its reason, when the model is an encoder without an LM head
    (no logits: perplexity, passkey and next-token readings do not apply); else None."""
    cfg = c.model.config
    if cfg.has_lm_head and not cfg.bidirectional:
        return None
    return Section(title, paper=paper,
                   here=f"{c.model.name} is a bidirectional encoder without a language-model head: it predicts no "
                        f"next token, so perplexity, passkey retrieval and logit-based measures do not apply.",
                   body="", reading="Skipped.")


def bound_mismatch(cfg: Any) -> Optional[str]:
    """Why Thm. 3.2's bound as derived in :mod:`sinklab.analysis.oversquashing` (pre-norm LLaMA:
    RMSNorm, RoPE, causal GQA softmax attention, SwiGLU, no biases) does not apply to a model of
    configuration ``cfg``, or None when it does."""
    diffs = []
    if cfg.bidirectional:
        diffs.append("bidirectional attention")
    if cfg.norm_kind != "rmsnorm":
        diffs.append(f"{cfg.norm_kind}")
    if tuple(cfg.layer_norms) != ("attn_norm", "ffn_norm"):
        diffs.append(f"norms {', '.join(cfg.layer_norms)}")
    if cfg.act != "swiglu":
        diffs.append(f"{cfg.act} MLP")
    if cfg.biases:
        diffs.append(f"biases on {', '.join(cfg.biases)}")
    if cfg.positions != "rope":
        diffs.append(f"{cfg.positions} positions")
    if cfg.embd_scale != 1.0 or cfg.attn_softcap or cfg.final_softcap:
        diffs.append("embedding scale or soft-capping")
    if not diffs:
        return None
    return (f"the bound's constants are derived for pre-norm LLaMA blocks (RMSNorm, RoPE, causal GQA softmax "
            f"attention, SwiGLU, no biases); {cfg.family} ({cfg.arch}) differs ({'; '.join(diffs)}), so they "
            f"would not bound its Jacobian")


# ---------------------------------------------------------------------- sections
def section_sinks(c: Context) -> Section:
    s, model = c.s, c.model
    prompts = load_passages("sinks")[: s.sink_prompts]
    e_lo = min(s.eps)
    if s.bos:
        cmp = compare_bos(model, prompts, T=s.sink_T, eps=s.eps, progress=c.progress)
        c.shared["sinks"] = cmp
        w, wo = cmp.bos, cmp.nobos
        figs = [c.save(figures_sinks.bos_comparison_figure(w, wo, eps=e_lo), "sinks_bos.png")]
        body = cmp.table()
        nums = cmp.summary()
        d = wo.sink_rate(e_lo) - w.sink_rate(e_lo)  # change when ⟨bos⟩ is removed
        if abs(d) < 0.05:
            bos_reading = (f"Removing the first token changes the eps={e_lo:g} sink rate by only {100 * d:+.1f} points "
                           f"({_pct(w.sink_rate(e_lo))} → {_pct(wo.sink_rate(e_lo))}): without it the sink forms on "
                           f"whatever token comes first, as in Table 2's rows without a fixed ⟨bos⟩ "
                           f"(65.10% → 65.15%), not as in its fixed-⟨bos⟩ rows (90.84% → 0.05%).")
        else:
            bos_reading = (f"Removing the first token moves the eps={e_lo:g} sink rate by {100 * d:+.1f} points "
                           f"({_pct(w.sink_rate(e_lo))} → {_pct(wo.sink_rate(e_lo))}); Table 2 shows 65.10% → 65.15% "
                           f"for a model trained without a fixed ⟨bos⟩ and 90.84% → 0.05% for one trained with it.")
        main = w
    else:
        main = sink_study(model, prompts, T=s.sink_T, eps=s.eps, bos=False, progress=c.progress)
        figs = [c.save(plots.importance_heatmap(main.mean, eps=e_lo,
                                                title=f"{model.name}: first-token importance (no BOS)"), "sinks.png")]
        body = ("| | " + " | ".join(f"sink rate eps={e:g}" for e in s.eps) + " |\n|---" + "|---" * len(s.eps)
                + "|\n| without BOS | " + " | ".join(_pct(main.sink_rate(e)) for e in s.eps) + " |")
        nums = {NOBOS: main.summary()}
        bos_reading = "Run without ⟨bos⟩ (`--no-bos`): position 0 is each passage's first token."
    cfg = model.config
    table1 = "\n".join(f"| {name} (Table 1) | {layout} | {pct:.2f}% |" for name, (pct, layout) in TABLE1.items())
    body += (f"\n\nBeside Table 1 (eps = 0.8, the paper's threshold there):\n\n| model | layers × heads | sink rate |\n"
             f"|---|---|---|\n{table1}\n| {model.name} (here, {'with' if s.bos else 'without'} ⟨bos⟩) | "
             f"{cfg.n_layers} × {cfg.n_heads} | {_pct(main.sink_rate(0.8))} |")
    return Section(
        "Attention sinks (sink rate)",
        paper="Gu et al.'s first-token importance a_0 and sink rate, used throughout the paper; Table 1 reports "
              "45.97 / 73.49 / 78.29 % at eps = 0.8 for LLaMA 3.1 8B / 70B / 405B.",
        here=f"{len(prompts)} shipped public-domain passages cut to their first {s.sink_T} tokens (⟨bos⟩ counted "
             f"among them), eager attention statistics computed in C, query heads counted. One model "
             f"({model.name}) here; `sinklab reproduce --families` puts four decoders of three families and an "
             f"encoder beside Table 1. The first token is {c.bos_token}. " + c.bos_trained_note,
        body=body,
        reading=bos_reading + f" At eps = 0.8 this {cfg.n_layers}-layer model has {_pct(main.sink_rate(0.8))} sink "
                f"heads, against 45.97% for LLaMA 3.1 8B; family, training and size all differ, so this is a "
                f"data point, not a trend.",
        figures=figs, numbers=nums)


def _long_text(model, T: int) -> np.ndarray:
    """The first T text tokens (no BOS) of the shipped passages joined by blank lines."""
    ids: List[int] = []
    for p in load_passages("all"):
        ids.extend(int(i) for i in prepare(model, p + "\n\n", False, T))  # T <= the model's context
        if len(ids) >= T:
            break
    return np.asarray(ids[:T], np.int64)


def section_long_context(c: Context) -> Section:
    s, model = c.s, c.model
    T = min(s.long_T, model.config.context_length - 1)
    text_ids = _long_text(model, T)
    T = len(text_ids)
    conds = [(BOS, True), (NOBOS, False)] if s.bos else [(NOBOS, False)]
    stats, secs = {}, {}
    for key, bos in conds:
        ids = prepare(model, text_ids, bos, T)          # T tokens in both: the BOS counts among them
        t0 = time.perf_counter()
        stats[key] = model.run(ids, capture=("stats",), logits_from=-1, progress=False).stats
        secs[key] = time.perf_counter() - t0
    to_first = {k: v.to_first[:, :, 1:].mean(axis=(1, 2)) for k, v in stats.items()}  # (L,)
    entropy = {k: v.entropy[:, :, 1:].mean(axis=(1, 2)) for k, v in stats.items()}
    rate = {k: {str(e): float((v.importance[:, :, 0] > e).mean()) for e in s.eps} for k, v in stats.items()}
    fig = plots.layer_lines({"attention to position 0": to_first, "row entropy (nats)": entropy},
                            title=f"{model.name}: T={T} tokens, attention statistics computed in C (no T×T buffer)")
    figs = [c.save(fig, "long_context.png")]
    cols = [k for k, _ in conds]
    label = LABELS
    body = (f"| | {' | '.join(label[k] for k in cols)} |\n|---{'|---' * len(cols)}|\n"
            f"| mean attention to position 0 | {' | '.join(f'{to_first[k].mean():.3f}' for k in cols)} |\n"
            f"| mean row entropy (nats) | {' | '.join(f'{entropy[k].mean():.3f}' for k in cols)} |\n"
            + "".join(f"| sink rate eps={e:g} at T={T} | {' | '.join(_pct(rate[k][str(e)]) for k in cols)} |\n"
                      for e in s.eps)
            + f"| forward seconds | {' | '.join(f'{secs[k]:.1f}' for k in cols)} |")
    key = cols[0]
    reading = f"At T = {T} the eps={s.eps[0]:g} sink rate is {_pct(rate[key][str(s.eps[0])])} ({label[key]})"
    sinks = c.shared.get("sinks")
    if sinks is not None:
        short = (sinks.bos if key == BOS else sinks.nobos).sink_rate(s.eps[0])
        reading += (f", against {_pct(short)} on {s.sink_T}-token prompts: "
                    + ("longer inference contexts see more sink heads, in the direction the paper predicts"
                       if rate[key][str(s.eps[0])] > short else
                       "longer inference contexts do not raise the sink rate here")
                    + " — but Fig. 5 varies the *training* context, which one trained model cannot.")
    else:
        reading += "."
    win = [w for w in (model.config.window or ()) if w > 0]
    if win and T > min(win):
        reading += (f" {len(win)} of its {model.config.n_layers} layers attend within a {min(win)}-token sliding "
                    f"window, so at T = {T} {100 * (T - min(win)) / T:.0f}% of their queries cannot see position 0 "
                    f"at all: a_0 there falls by construction.")
    return Section(
        f"Long context (T = {T})",
        paper="Fig. 5 shows sinks growing with the pre-training context length (128 → 2048), and Thm. 3.2 predicts "
              "that longer contexts need stronger sinks.",
        here=f"One sequence of {T} tokens (passages concatenated) run through the trained model; the statistics are "
             f"streamed from the C kernel without a T×T buffer. This varies the inference context of one model, not "
             f"the training context of several, so it is a stand-in, not Fig. 5. " + c.bos_trained_note,
        body=body, reading=reading, figures=figs,
        numbers={"T": T, "to_first_per_layer": to_first, "entropy_per_layer": entropy, "sink_rate": rate,
                 "seconds": secs})


# Perplexity conditions of the intervention section: (label, bos, intervention).
INTERVENTIONS = [
    ("⟨bos⟩ + text, no intervention", True, None),
    ("v_0 zeroed for queries ≥ 1 (all heads; the sink kept, as a no-op)", True,
     Intervention(zero_first_value=True)),
    ("v_0 zeroed for every query (all heads; the sink's own update removed too)", True,
     Intervention(zero_first_value=True, zero_first_value_scope="all")),
    ("attention to position 0 masked (all heads)", True, Intervention(mask_first=True)),
    ("text only (no ⟨bos⟩)", False, None),
]


def _where_the_sink_moves(c: Context) -> Dict[str, Any]:
    """First-token importance of positions 0 and 1 with ⟨bos⟩, with ⟨bos⟩ and attention to it
    masked, and without ⟨bos⟩ (position 0 then being the first text token), on the sink prompts."""
    s, model = c.s, c.model
    prompts = load_passages("sinks")[: s.sink_prompts]
    body = [prepare(model, p, False, s.sink_T - 1) for p in prompts]
    body = np.stack([b for b in body if len(b) == s.sink_T - 1])
    bos = np.full((len(body), 1), model.config.bos_token_id, np.int64)
    runs = {"⟨bos⟩ + text": (np.concatenate([bos, body], 1), None),
            "⟨bos⟩ + text, attention to position 0 masked": (np.concatenate([bos, body], 1),
                                                             Intervention(mask_first=True)),
            "text only": (body, None)}
    out = {}
    for name, (ids, iv) in runs.items():
        imp = model.run(ids, capture=("stats",), logits_from=-1, intervene=iv, progress=False).stats.importance
        first_text = 0 if name == "text only" else 1        # (B, L, H, T) -> key of the first text token
        out[name] = {"importance_pos0": float(imp[..., 0].mean()),
                     "importance_first_text_token": float(imp[..., first_text].mean()),
                     "sink_rate_first_text_token": {str(e): float((imp[..., first_text] > e).mean()) for e in s.eps},
                     "sink_rate_pos0": {str(e): float((imp[..., 0] > e).mean()) for e in s.eps}}
    out["n_prompts"] = len(body)
    return out


def _interventions_encoder(c: Context) -> Section:
    """An encoder has no logits: only where the sink goes when attention to position 0 is masked."""
    s = c.s
    moves = _where_the_sink_moves(c)
    e = str(s.eps[0])
    body = (f"Where the sink goes ({moves['n_prompts']} passages, T = {s.sink_T}; first-token importance over all "
            f"queries, sink rate at eps = {e}):\n\n| run | a_0 (position 0) | a of the first text token | sink rate on "
            f"the first text token |\n|---|---|---|---|\n"
            + "".join(f"| {k} | {v['importance_pos0']:.3f} | {v['importance_first_text_token']:.3f} | "
                      f"{_pct(v['sink_rate_first_text_token'][e])} |\n" for k, v in moves.items() if k != "n_prompts"))
    masked = moves["⟨bos⟩ + text, attention to position 0 masked"]
    return Section(
        "Interventions on the first token",
        paper="The paper reads sinks as approximate no-ops; it gives no intervention numbers.",
        here=(f"{c.model.name} is a bidirectional encoder without a language-model head, so the perplexity rows are "
              f"skipped; masking attention to position 0 is applied to queries ≥ 1 in every head. " + c.bos_trained_note),
        body=body,
        reading=(f"With attention to position 0 masked, the first text token receives a mean importance of "
                 f"{masked['importance_first_text_token']:.3f} ({_pct(masked['sink_rate_first_text_token'][e])} "
                 f"sink heads on it); with learned absolute positions the masked run is not the run without "
                 f"[CLS], so the two rows differ."),
        numbers={"where_the_sink_moves": moves})


def _sink_moves(masked: Dict[str, Any], e: str) -> str:
    """Whether the sink moved to the first text token once position 0 is masked (numbers decide)."""
    imp, rate = masked["importance_first_text_token"], masked["sink_rate_first_text_token"][e]
    if rate > 0.05:
        return (f"the sink moves to the first text token, whose importance rises to {imp:.3f} ({_pct(rate)} sink "
                f"heads at eps = {e}), so it does not force heads to mix.")
    return (f"the sink does not move: the first text token's importance is only {imp:.3f} ({_pct(rate)} sink heads "
            f"at eps = {e}), so without position 0 the heads have no sink to park their attention on.")


def section_interventions(c: Context) -> Section:
    s, model = c.s, c.model
    if model.config.bidirectional or not model.config.has_lm_head:
        return _interventions_encoder(c)
    texts = load_passages("heldout")[: s.ppl_texts]
    conds = INTERVENTIONS if s.bos else [x for x in INTERVENTIONS if not x[1]]
    res = {}
    for name, bos, iv in conds:
        res[name] = perplexity(model, texts, bos=bos, max_tokens=s.ppl_max_tokens, intervene=iv,
                               progress=c.progress, desc=f"perplexity: {name.split(' (')[0]}")
    c.shared["perplexity"] = {k: v for k, v in ((BOS, res.get(INTERVENTIONS[0][0])),
                                                (NOBOS, res[INTERVENTIONS[-1][0]])) if v is not None}
    base = res[conds[0][0]].mean_nll
    rows = "".join(f"| {name} | {r.perplexity:.2f} | {r.mean_nll:.4f} | {r.mean_nll - base:+.4f} |\n"
                   for name, r in res.items())
    body = (f"Held-out perplexity, {len(texts)} passages (≤ {s.ppl_max_tokens} tokens, the same predicted tokens in "
            f"every row):\n\n| condition | perplexity | mean NLL (nats) | Δ NLL vs first row |\n|---|---|---|---|\n{rows}")
    nums: Dict[str, Any] = {name: {"perplexity": r.perplexity, "mean_nll": r.mean_nll} for name, r in res.items()}
    if not s.bos:
        return Section("Interventions on the first token", paper="The no-op reading of sinks.",
                       here="Run without ⟨bos⟩ (`--no-bos`): the interventions act on a ⟨bos⟩ and are skipped.",
                       body=body, reading="Nothing to compare without ⟨bos⟩.", numbers=nums)
    moves = _where_the_sink_moves(c)
    nums["where_the_sink_moves"] = moves
    e = str(s.eps[0])
    body += (f"\nWhere the sink goes when attention to position 0 is masked ({moves['n_prompts']} passages, "
             f"T = {s.sink_T}; mean first-token importance a_k over layers and heads, and sink rate at eps = {e}):\n\n"
             f"| run | a_0 (position 0) | a of the first text token | sink rate on the first text token |\n"
             f"|---|---|---|---|\n"
             + "".join(f"| {k} | {v['importance_pos0']:.3f} | {v['importance_first_text_token']:.3f} | "
                       f"{_pct(v['sink_rate_first_text_token'][e])} |\n"
                       for k, v in moves.items() if k != "n_prompts"))
    names = [n for n, _, _ in INTERVENTIONS]
    d_noop = res[names[1]].mean_nll - base
    d_all = res[names[2]].mean_nll - base
    d_mask, d_nobos = res[names[3]].mean_nll - base, res[names[4]].mean_nll - base
    masked = moves["⟨bos⟩ + text, attention to position 0 masked"]
    reading = (f"Keeping the sink but zeroing what it writes into other tokens costs {d_noop:+.4f} nats/token, "
               f"removing ⟨bos⟩'s value for every query (its own update too) {d_all:+.4f}: "
               + ("the sink's contribution to other tokens is close to a no-op, as the paper argues. "
                  if abs(d_noop) < 0.1 * max(abs(d_all), abs(d_nobos), 1e-9) or abs(d_noop) < 0.02 else
                  "the sink's contribution to other tokens is not negligible here. ")
               + f"Masking attention to position 0 in every head is the no-⟨bos⟩ run in disguise ({d_mask:+.4f} vs "
               f"{d_nobos:+.4f}; with relative positions the rest of the computation is identical): "
               + _sink_moves(masked, e))
    return Section(
        "Interventions on the first token",
        paper="The paper reads sinks as approximate no-ops: a head that attends to ⟨bos⟩, whose value is small, "
              "changes the residual stream little. It gives no intervention numbers; these test that reading.",
        here="Applied inside the C forward to every head of every layer. 'v_0 zeroed for queries ≥ 1' keeps ⟨bos⟩ a "
             "sink (its own row and residual stream are bitwise unchanged) but removes what attending to it adds to "
             "other tokens: the paper's no-op. 'For every query' also removes ⟨bos⟩'s own update, which destroys "
             "the sink in later layers. " + c.bos_trained_note,
        body=body, reading=reading, numbers=nums)


def section_noop(c: Context) -> Section:
    s, model = c.s, c.model
    prompts = load_passages("sinks")[: s.noop_prompts]
    res = noop_analysis(model, prompts, bos=s.bos, max_tokens=s.sink_T, progress=c.progress)
    summ = res.summary(0.5)
    summ.pop("per_head", None)
    cond = find_conditional_heads(model, [a for a, _ in APOSTROPHE], [b for _, b in APOSTROPHE], trigger="'s",
                                  top=8, progress=c.progress)
    figs = [c.save(figures_mixing.noop_figure(res), "noop.png"),
            c.save(figures_mixing.conditional_heads_figure(cond), "conditional_heads.png")]
    g = lambda k: float("nan") if summ.get(k) is None else summ[k]  # noqa: E731  (to_jsonable wrote NaN as None)
    n_sink, n = g("n_sink_heads"), g("n_heads")
    rel_s, rel_o = g("median_rel_out_norm_sink_heads"), g("median_rel_out_norm_other_heads")
    body = (f"| | sink heads | other heads |\n|---|---|---|\n"
            f"| query heads (mean attention to position 0 > 0.5) | {n_sink} | {n - n_sink} |\n"
            f"| median head-output norm / residual norm | {rel_s:.4f} | {rel_o:.4f} |\n"
            f"| median correlation over queries (attention to 0 vs output norm) | "
            f"{g('median_query_corr_to_first_vs_out_norm_sink_heads'):.3f} | "
            f"{g('median_query_corr_to_first_vs_out_norm_other_heads'):.3f} |\n"
            + _kv_value_rows(summ)
            + f"\nSpearman correlation across heads, sink mass vs relative output norm: "
              f"{g('spearman_sink_mass_vs_rel_out_norm_across_heads'):.3f}.\n\n"
              f"Search for conditional heads (attend to \"'s\" when present, to position 0 otherwise), "
              f"{len(APOSTROPHE)} sentence pairs:\n\n" + cond.table())
    top = cond.top[0] if cond.top else None
    ratio_s = summ["median_first_value_ratio_sink_kv_heads"]
    if ratio_s is None or not np.isfinite(ratio_s):   # no KV head counts as a sink KV head
        reading_v = f" No KV head has {summ['kv_rule']} of its query heads sinking, so value norms are not compared. "
    else:
        reading_v = (f" Position 0's value is {ratio_s:.2f}× the median token's in sink KV heads"
                     + (" — small, as the paper's no-op reading needs. " if ratio_s < 1 else
                        " — not smaller than other tokens', so on this model the no-op would have to come from "
                        "W_O or from the attention pattern rather than from a small value. "))
    reading = (f"Sink heads write {rel_s / rel_o:.2f}× as much into the residual stream as other heads (median "
               f"relative output norm {rel_s:.4f} vs {rel_o:.4f})"
               + (", consistent with the no-op reading" if rel_s < rel_o else ", which does not support the no-op "
                  "reading on this model") + "." + reading_v)
    if top is not None:
        reading += (f"The best conditional head, layer {top['layer']} head {top['head']}, is a candidate analogue of "
                    f"the apostrophe head; with {len(APOSTROPHE)} invented sentence pairs this is a lead, not a finding.")
    return Section(
        "Sinks as approximate no-ops",
        paper="The paper's no-op reading and its 'apostrophe head' in an early layer of Gemma 7B, which attends to an "
              "apostrophe when one is present and to ⟨bos⟩ otherwise (qualitative, no numbers).",
        here=f"{len(prompts)} passages, {s.sink_T} tokens, {'with' if s.bos else 'without'} ⟨bos⟩, on {model.name}; "
             f"sentence pairs written for this report (the paper's are not published). Value norms are compared per "
             f"KV head, since query heads that share one (grouped-query attention) share their values.",
        body=body, reading=reading, figures=figs, numbers={"noop": summ, "conditional_heads": cond.summary()})


def _num(x: Any, fmt: str = ".3f") -> str:
    """A number for a table, "—" when absent (None or NaN)."""
    return "—" if x is None or not np.isfinite(x) else format(x, fmt)


def _kv_value_rows(summ: Dict[str, Any]) -> str:
    """Rows comparing position 0's value norm with other tokens', per KV head: query heads that
    share a KV head share its values, so value norms are compared per KV head."""
    return (f"| KV heads (a sink KV head: the {summ['kv_rule']} of its query heads are sink heads) | "
            f"{summ['n_sink_kv_heads']} | {summ['n_other_kv_heads']} |\n"
            f"| median value norm of position 0 / median of other tokens, per KV head | "
            f"{_num(summ['median_first_value_ratio_sink_kv_heads'])} | "
            f"{_num(summ['median_first_value_ratio_other_kv_heads'])} |\n")


def _perturbation_context(c: Context, frac: float) -> str:
    """What the sink section says about this model without ⟨bos⟩, to read the perturbation by."""
    sinks = c.shared.get("sinks")
    if sinks is None:
        return ""
    e = min(c.s.eps)
    w, wo = sinks.bos.sink_rate(e), sinks.nobos.sink_rate(e)
    if wo < 0.5 * w:
        return (f"Without ⟨bos⟩ this model's sinks on position 0 collapse ({_pct(w)} → {_pct(wo)} at eps = {e:g}), "
                f"as for a model trained with a fixed ⟨bos⟩ such as the paper's Gemma"
                + ("; the perturbation's spread follows." if frac > 0.6 else
                   "; even so the perturbation does not spread consistently further."))
    return (f"Without ⟨bos⟩ the first text token takes over as the sink ({_pct(w)} → {_pct(wo)} at eps = {e:g}), as "
            f"in a model trained without a fixed ⟨bos⟩, which is the likely reason the contrast is weak here; the "
            f"paper's Gemma relies on its ⟨bos⟩.")


def section_perturbation(c: Context) -> Section:
    s, model = c.s, c.model
    if model.config.bidirectional:
        return Section("Perturbation propagation", paper="Fig. 2–3 compare a perturbation with and without ⟨bos⟩.",
                       here=f"{model.name} is a bidirectional encoder: a swap reaches every position in the first "
                            f"layer, so Fig. 2–3's causal spread has no counterpart, and the study's swap list (one-"
                            f"token words written with a leading space) does not exist in a WordPiece vocabulary.",
                       body="", reading="Skipped.")
    if not s.bos:
        return Section("Perturbation propagation", paper="Fig. 2–3 compare a perturbation with and without ⟨bos⟩.",
                       here="Run without ⟨bos⟩ (`--no-bos`): nothing to compare.", body="", reading="Skipped.")
    st = perturbation_study(model, n_passages=s.perturb_passages, swaps_per_passage=s.perturb_swaps,
                            T=s.sink_T, progress=c.progress)
    summ = st.summary()
    rs, pooled = st.ratio_stats(True), st.pooled_ratio_stats(True)
    ent = st.mean_entropies()
    L = st.n_layers
    # layer 0 has no ratio; a model of few layers gets fewer bands
    bands = [(max(a, 1), b) for a, b in ((1, L // 3), (L // 3, 2 * L // 3), (2 * L // 3, L + 1)) if b > max(a, 1)]
    rows = "".join(f"| {a}–{b - 1} | {np.nanmean(rs['mean'][a:b]):.3f} | {np.nanmean(rs['q50'][a:b]):.3f} | "
                   f"{np.nanmean(rs['q10'][a:b]):.3f} – {np.nanmean(rs['q90'][a:b]):.3f} | "
                   f"{np.nanmean(rs['frac_gt1'][a:b]):.2f} |\n" for a, b in bands)
    em = {k: float(np.mean(v)) for k, v in ent.items()}
    body = (f"{st.n_swaps} one-word swaps on {st.n_passages} passages ({s.sink_T} text tokens each). Spread ratio = "
            f"(mean relative change ‖v − ṽ‖/‖v‖ over the positions after the swap, without ⟨bos⟩) / (the same with "
            f"⟨bos⟩), per swap and layer; statistics over swaps, averaged over layer bands:\n\n"
            f"| layers | mean ratio | median | 10%–90% | fraction of swaps > 1 |\n|---|---|---|---|---|\n{rows}\n"
            f"Pooled over swaps and layers: mean {pooled['mean']:.3f}, median {pooled['q50']:.3f}, geometric mean "
            f"{pooled['geomean']:.3f}, {100 * pooled['frac_gt1']:.0f}% above 1.\n\n"
            f"Mean attention entropy over layers, heads and text queries 1..T−1 (nats):\n\n"
            f"| with ⟨bos⟩, all keys | with ⟨bos⟩, text keys only (renormalised) | without ⟨bos⟩ |\n|---|---|---|\n"
            f"| {em['bos_all_keys']:.3f} | {em['bos_text_keys']:.3f} | {em['nobos']:.3f} |")
    figs = [c.save(figures_mixing.perturbation_study_figure(st), "perturbation_study.png")]
    frac, med = pooled["frac_gt1"], pooled["q50"]
    if 0.4 <= frac <= 0.6 and abs(med - 1) < 0.05:
        spread = (f"Without ⟨bos⟩ a swap spreads further in {100 * frac:.0f}% of (swap, layer) pairs, with a median "
                  f"ratio of {med:.3f}: no consistent difference, so Fig. 2–3's finding is not reproduced on this model")
    elif med > 1:
        spread = (f"Without ⟨bos⟩ a swap spreads further in {100 * frac:.0f}% of (swap, layer) pairs (median ratio "
                  f"{med:.3f}), the direction of Fig. 2–3")
    else:
        spread = (f"Without ⟨bos⟩ a swap spreads *less* in {100 * (1 - frac):.0f}% of (swap, layer) pairs (median "
                  f"ratio {med:.3f}), against Fig. 2–3's direction")
    smoother = em["nobos"] > em["bos_text_keys"]
    reading = (spread + ". On the same keys, attention without ⟨bos⟩ is "
               + ("smoother, as the paper finds" if smoother else "sharper, not smoother as the paper finds")
               + f" ({em['nobos']:.3f} vs {em['bos_text_keys']:.3f} nats; counting ⟨bos⟩ as a key gives "
               f"{em['bos_all_keys']:.3f}). " + _perturbation_context(c, frac))
    return Section(
        "Perturbation propagation",
        paper="Fig. 2–3 (Gemma 7B, one prompt, 'greatest' → 'best'): without ⟨bos⟩ the perturbation spreads further "
              "and grows faster over depth, and attention maps are smoother.",
        here=f"{model.name}; many swaps of one-token words on the shipped passages instead of one prompt; the change "
             f"is relative to ‖v‖ (the paper's normalisation is not stated); entropy compared on the same keys.",
        body=body, reading=reading, figures=figs, numbers={"study": summ})


def section_collapse(c: Context) -> Section:
    s, model = c.s, c.model
    passage = " ".join(load_passages("all"))
    lengths = tuple(T for T in s.collapse_lengths if T < model.config.context_length)
    bos = "both" if s.bos else False
    res = collapse_vs_length(model, passage, lengths=lengths, bos=bos, progress=c.progress)
    figs = [c.save(figures_mixing.collapse_figure(res), "collapse.png")]
    summ = res.summary()
    rows = "".join(f"| {T} | " + " | ".join(f"{res.rank[k][i, -1]:.3f} | {res.repr_rel[k][i, -1]:.3f}"
                                          for k in res.settings) + " |\n" for i, T in enumerate(res.lengths))
    head = " | ".join(f"rank residual ({k}) | repr. distance ({k})" for k in res.settings)
    body = (f"Last layer, relative measures:\n\n| T | {head} |\n|---" + "|---" * (2 * len(res.settings)) + "|\n" + rows)
    body_p, reading_p, nums_p = _prop31(res)
    k0 = res.settings[0]
    r_first, r_last = res.rank[k0][0, -1], res.rank[k0][-1, -1]
    change = r_last / r_first - 1
    reading = (f"The last-layer rank-collapse residual goes from {r_first:.3f} at T = {int(res.lengths[0])} to "
               f"{r_last:.3f} at T = {int(res.lengths[-1])} ({k0}, {100 * change:+.1f}%)"
               + (": tokens grow more alike with length, as the over-mixing argument predicts. " if change < -0.05 else
                  ": tokens grow less alike with length, against the over-mixing prediction. " if change > 0.05 else
                  ": essentially flat, so no rank collapse with length is visible on this model at these lengths. ")
               + reading_p)
    return Section(
        "Rank and representational collapse (Prop. 3.1)",
        paper="Prop. 3.1: if ‖V − 1μᵀ‖_F < Δ/2 then ‖v_T − v_{T−1}‖ < Δ (rank collapse implies representational "
              "collapse); over-mixing grows with depth and context length.",
        here=f"{model.name}, the shipped passages concatenated and cut to T ∈ {[int(T) for T in res.lengths]}; V is the residual "
             f"stream of the text tokens after the first (no sink row); representational collapse as in Barbero et al. "
             f"2024 (the sequence vs the same with its last token repeated).",
        body=body + body_p, reading=reading, figures=figs, numbers={**summ, "prop31": nums_p})


def _prop31(res: Any) -> Tuple[str, str, Dict[str, Any]]:
    """Prop. 3.1 checked on every (T, layer, setting): table at the last layer, reading, numbers."""
    checks = {k: res.prop31(k) for k in res.settings}
    rows = "".join(f"| {T} | {k} | {p.dev_frob[i, -1]:.1f} | {p.last_two[i, -1]:.1f} | {p.slack[i, -1]:.3f} | "
                   f"{int(p.holds[i].sum())}/{p.holds.shape[1]} |\n"
                   for i, T in enumerate(res.lengths) for k, p in checks.items())
    body = ("\n\nProp. 3.1 on every layer (the table shows the last layer; absolute residual-stream units; "
            "slack = ‖v_T − v_{T−1}‖ / (2‖V − 1μᵀ‖_F), ≤ 1 when the implication holds for every Δ, and ≤ 0.707 "
            "by the triangle inequality):\n\n| T | setting | ‖V − 1μᵀ‖_F | ‖v_T − v_{T−1}‖ | slack | layers where it "
            "holds |\n|---|---|---|---|---|---|\n" + rows)
    n = sum(p.holds.size for p in checks.values())
    n_ok = sum(int(p.holds.sum()) for p in checks.values())
    slack = max(float(np.nanmax(p.slack)) for p in checks.values())
    reading = (f"Prop. 3.1 holds in {n_ok} of {n} (T, layer, setting) cases"
               + ("" if n_ok == n else " — a violation can only be a numerical bug") + f"; the largest slack is "
               f"{slack:.3f}, so the last two tokens never use more than {100 * slack:.0f}% of the distance the bound "
               f"allows" + (": on this model rank collapse is far from forcing them together." if slack < 0.35 else
                            ", so at places the deviation from the mean sits mostly in the last two tokens."))
    return body, reading, {"holds": n_ok, "cases": n, "max_slack": slack}


def _quality_verdict(ppl_ratio: float, acc_w: float, acc_wo: float, trained_with_bos: Optional[bool]) -> str:
    """The reading's second half: does removing ⟨bos⟩ degrade this model the way it degrades Gemma 7B?"""
    collapsed = ppl_ratio >= 1.5 or acc_wo < acc_w - 0.34
    if not collapsed:
        if trained_with_bos:
            return ("nothing like Gemma 7B's collapse (RULER 82.57 → 0.00), although this model's tokenizer prepends "
                    "⟨bos⟩, so it was most likely trained with one: the paper's prediction fails here.")
        return ("nothing like Gemma's collapse (RULER 82.57 → 0.00). This is what Table 2 predicts for a model "
                "trained without a fixed ⟨bos⟩; it is not a reproduction of the Gemma result, which needs a model "
                "trained with one.")
    if trained_with_bos:
        return "a degradation in the direction of Gemma 7B's, on a model that was most likely trained with a fixed ⟨bos⟩."
    return "a degradation in the direction of Gemma's, on a model whose tokenizer does not prepend ⟨bos⟩."


def section_quality(c: Context) -> Section:
    s, model = c.s, c.model
    skip = _encoder_skip(c, "Quality with and without ⟨bos⟩", "⟨bos⟩ removal at inference.")
    if skip is not None:
        return skip
    if not s.bos:
        return Section("Quality with and without ⟨bos⟩", paper="⟨bos⟩ removal at inference.",
                       here="Run without ⟨bos⟩ (`--no-bos`): nothing to compare.", body="", reading="Skipped.")
    q = compare_bos_quality(model, quick=s.passkey_quick, texts=load_passages("heldout")[: s.ppl_texts],
                            max_tokens=s.ppl_max_tokens, progress=c.progress,
                            perplexities=c.shared.get("perplexity"))
    figs = [c.save(figures_sinks.passkey_figure(q.passkey[BOS], q.passkey[NOBOS]), "passkey.png")]
    paper_rows = "".join(f"| {k} | {a:.2f} | {b:.2f} |\n" for k, (a, b) in GEMMA_BOS_REMOVAL.items())
    body = (q.table() + "\n\nThe paper's authors, Gemma 7B (trained with a fixed ⟨bos⟩), accuracy %:\n\n"
            "| benchmark | with ⟨bos⟩ | without |\n|---|---|---|\n" + paper_rows)
    w, wo = q.perplexity[BOS], q.perplexity[NOBOS]
    acc_w = float(np.mean(list(q.passkey[BOS].accuracy.values())))
    acc_wo = float(np.mean(list(q.passkey[NOBOS].accuracy.values())))
    reading = (f"Without ⟨bos⟩ perplexity goes {w.perplexity:.2f} → {wo.perplexity:.2f} "
               f"({(wo.perplexity / w.perplexity - 1) * 100:+.1f}%) and passkey accuracy {100 * acc_w:.0f}% → "
               f"{100 * acc_wo:.0f}%: " +
               _quality_verdict(wo.perplexity / w.perplexity, acc_w, acc_wo,
                                getattr(model.tokenizer, "add_bos_default", None)))
    return Section(
        "Quality with and without ⟨bos⟩",
        paper="The authors report Gemma 7B collapsing when its ⟨bos⟩ is removed at inference (e.g. ARC-e 80.77 → "
              "28.49, RULER at 4096 tokens 82.57 → 0.00).",
        here=f"Offline stand-ins on {model.name}: held-out perplexity on the shipped passages (reused from the "
             f"interventions section, not recomputed) and a locally generated passkey task. " + c.bos_trained_note,
        body=body, reading=reading, figures=figs, numbers=q.to_dict())


def _length_trend(st: Any) -> str:
    """How the no-⟨bos⟩ minus ⟨bos⟩ mixing share at l = 0 changes over the sweep's lengths."""
    ns = [n for n in st.lengths if n in st.length_maps.get("bos", {}) and n in st.length_maps.get("nobos", {})]
    if len(ns) < 2:
        return ""
    gaps = [float(st.share("nobos", n)[0] - st.share("bos", n)[0]) for n in ns]
    listed = ", ".join(f"{g:+.3f} at T = {n}" for g, n in zip(gaps, ns))
    trend = ("grows" if gaps[-1] > gaps[0] + 0.01 else "shrinks" if gaps[-1] < gaps[0] - 0.01 else "stays flat")
    return (f"Over context length ({st.n_probes}-probe estimates) that gap (without minus with ⟨bos⟩) is {listed}: "
            f"it {trend}" + (", as the paper predicts for longer contexts. " if trend == "grows" else
                             ", where the paper predicts it to grow with context length. "))


def section_oversquashing(c: Context) -> Section:
    s, model = c.s, c.model
    title = "Over-squashing: Thm. 3.2's bound against the measured Jacobian"
    paper = ("Thm. 3.2: ||∂v_j^(L)/∂v_i^(0)|| ≤ C^L · Σ_paths Π_l abar^(l), abar^(l) = Σ_h c_{l,h} A^(l,h) + I, "
             "with C, c_{l,h} from Lipschitz constants and weight norms; a sink takes weight off every other path, "
             "so tokens mix less, and longer contexts and deeper models need stronger sinks. No figure of it on "
             "a trained model in the paper.")
    if not s.bos:
        return Section(title, paper=paper, here="Run without ⟨bos⟩ (`--no-bos`): nothing to compare.", body="",
                       reading="Skipped.")
    why = bound_mismatch(model.config)
    if why is not None:
        return Section(title, paper=paper, here=f"Not run on {model.name}: {why}.", body="", reading="Skipped.")
    passage = " ".join(load_passages("all"))
    st = squashing_study(model, passage, T=s.squash_T, lengths=s.squash_lengths, n_probes=s.squash_probes,
                         progress=c.progress)
    summ = st.summary()
    conds = st.conditions
    L = model.config.n_layers
    rows = ""
    for k in conds:
        r = summ["conditions"][k]
        rows += (f"| {st.label(k)} | {r['violations']} | {r['min_ratio']:.3g} | {r['median_ratio']:.3g} | "
                 f"{r['spearman_mean']:.3f} ({r['spearman_min']:.3f}) | {r['share_layer0']:.3f} | "
                 f"{r['text_share_layer0']:.3f} | {r['share_mid']:.3f} |\n")
    sweep = "".join(f"| {st.label(k)} | " + " | ".join(f"{st.share(k, n)[0]:.3f}" for n in st.lengths) + " |\n"
                    for k in conds)
    body = (f"Target: the last token's stream after the last layer (before the final norm), T = {st.T} tokens "
            f"(⟨bos⟩ + {st.T - 1} text tokens; the run without ⟨bos⟩ has the same {st.T - 1} text tokens). "
            f"Measured: exact d×d Jacobian blocks ∂v_last^(L)/∂v_j^(l) for every layer l and source j "
            f"({model.config.d_model} cotangents through the C backward), spectral norms by Lanczos. Bound: the "
            f"path-sum matrix product with entrywise constants. Ratio = bound / measured over all (l < L, j); "
            f"ρ = Spearman rank correlation of bound and measurement over source positions, mean (min) over layers. "
            f"Mixing share = the share of ||J||_F² on the text tokens other than the target; the text-only "
            f"share leaves ⟨bos⟩'s own mass out of the total.\n\n"
            f"| condition | bound violated | min ratio | median ratio | ρ mean (min) | mixing share l=0 | "
            f"text-only share l=0 | mixing share l={L // 2} |\n|---|---|---|---|---|---|---|---|\n{rows}\n"
            f"Mixing share over the whole depth (l = 0) against context length ({st.n_probes}-probe random-sign "
            f"estimates, ⟨bos⟩ counted in T):\n\n| condition | " + " | ".join(f"T = {n}" for n in st.lengths)
            + " |\n|---" + "|---" * len(st.lengths) + "|\n" + sweep)
    figs = [c.save(figures_sensitivity.sensitivity_maps(st), "oversquashing_maps.png"),
            c.save(figures_oversquashing.bound_vs_measured({st.label(k): st.bounds[k] for k in conds}),
                   "oversquashing_bound.png")]
    if st.lengths:
        figs.append(c.save(figures_sensitivity.mixing_vs_length(st), "oversquashing_length.png"))
    r_b, r_n = summ["conditions"]["bos"], summ["conditions"].get("nobos", summ["conditions"]["bos"])
    viol = sum(summ["conditions"][k]["violations"] for k in conds)
    holds = ("The bound holds at every (layer, position) in every condition" if viol == 0 else
             f"The bound is violated at {viol} (layer, position) entries, which would mean a wrong constant")
    d_share = r_n["share_layer0"] - r_b["share_layer0"]
    d_text = r_n["text_share_layer0"] - r_b["text_share_layer0"]
    direction = ("more" if d_share > 0.01 else "less" if d_share < -0.01 else "about as much")
    bound_b = st.bounds["bos"].summary()
    reading = (f"{holds} (smallest ratio {min(summ['conditions'][k]['min_ratio'] for k in conds):.3g}), but over "
               f"depth it is vacuous: its per-layer constants (C_l up to {bound_b['C_max']:.3g}) multiply over "
               f"{L} layers, so the median ratio is {r_b['median_ratio']:.3g} with ⟨bos⟩ and it cannot tell the "
               f"conditions apart. Its shape over source positions follows the measurement only partly (mean ρ "
               f"{r_b['spearman_mean']:.2f} with ⟨bos⟩, {r_n['spearman_mean']:.2f} without; best near the output). "
               f"The measurement itself: without ⟨bos⟩ the last token takes {direction} of its sensitivity from the "
               f"other text tokens ({r_n['share_layer0']:.3f} vs {r_b['share_layer0']:.3f} at l = 0"
               + (", the direction the paper predicts" if d_share > 0.01 else "")
               + f"); leaving ⟨bos⟩'s own mass out, the text-only shares differ by {d_text:+.3f} ("
               f"{r_n['text_share_layer0']:.3f} vs {r_b['text_share_layer0']:.3f}), so "
               + ("the difference is not only the mass ⟨bos⟩ absorbs. " if abs(d_text) > 0.01 and d_text * d_share > 0
                  else "most of the difference is the mass ⟨bos⟩ itself absorbs. ")
               + _length_trend(st)
               + "Masking attention to ⟨bos⟩ in every head gives the run without it (the same numbers to float "
                 f"rounding), as in the interventions section. These are one small model's numbers ({model.name}), "
                 "not a test of the prediction across depth and scale.")
    return Section(
        title, paper=paper,
        here=(f"{model.name}, the shipped passages concatenated; exact Jacobians at T = {st.T} instead of the "
              f"input-to-output pairs of a synthetic model; the theorem's constants, whose form the paper leaves "
              f"open, derived here for this architecture (RMSNorm, RoPE, GQA softmax attention, SwiGLU) as a local "
              f"bound at the input, valid for the spectral norm; three conditions: with ⟨bos⟩, without it, and "
              f"with attention to it masked in every head."),
        body=body, reading=reading, figures=figs,
        numbers={"study": summ, "seconds": st.meta["seconds"]})


# ---------------------------------------------------------------------- pre-training in miniature
# The paper's pre-training experiments (Fig. 5, Table 2), run by sinklab.train.experiments and
# read here. Profiles: "quick" (a smoke test, seconds), "cpu" (about an hour on 2 cores), "full"
# (overnight); "none" skips the section.
TRAINING_PROFILES = ("none", "quick", "cpu", "full")
TRAINING_DIR = "training"                   # the report's subfolder for the section's files
DEFAULT_TRAINING_ROOT = "sinklab-experiments"  # where `sinklab experiment` puts its runs
PAPER_FIG5_TOKENS = 5e9                     # training tokens per Fig. 5 run
PAPER_TABLE2_TOKENS = 30e9                  # training tokens per Table 2 run
PAPER_TRAIN_PARAMS = "~120M"                # the paper's LLaMA-2-style models


def training_model_size(profile: Dict[str, Any], vocab_size: Optional[int] = None) -> Dict[str, int]:
    """Parameters of a profile's model (``profile["model"]``: d_model, n_layers, n_heads, d_ff):
    ``{"params", "non_embedding", "vocab_size"}`` (counts; the embedding and LM head are untied)."""
    from .train.engine import llama_config, param_layout
    from .train.run import TrainConfig

    V = int(vocab_size or TrainConfig.vocab_size)
    slots = param_layout(llama_config(V, **profile["model"], context_length=max(profile["contexts"])))
    total = sum(s.size for s in slots)
    emb = sum(s.size for s in slots if s.name in ("tok_embd", "lm_head"))
    return {"params": int(total), "non_embedding": int(total - emb), "vocab_size": V}


def _summary_paths(folder: str, profile: str) -> Tuple[str, str]:
    return (os.path.join(folder, f"fig5-{profile}.json"), os.path.join(folder, f"table2-{profile}.json"))


def find_training_summaries(root: str, profile: str = "cpu") -> Optional[str]:
    """The folder holding both ``fig5-{profile}.json`` and ``table2-{profile}.json`` (what
    ``sinklab experiment fig5|table2 --profile PROFILE`` writes): ``root`` itself or one of its
    immediate subfolders (sorted); None when there is none."""
    if not os.path.isdir(root):
        return None
    subs = sorted(os.path.join(root, d) for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    for folder in [root] + subs:
        if all(os.path.isfile(p) for p in _summary_paths(folder, profile)):
            return folder
    return None


def load_training_summaries(folder: str, profile: str) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """(fig5, table2) summaries of ``profile`` read from ``folder``.

    Raises:
        OSError: a file is missing. ValueError: a file is not such a summary (named)."""
    import json

    out = []
    for path, key in zip(_summary_paths(folder, profile), ("runs", "rows")):
        with open(path, encoding="utf-8") as f:
            try:
                s = json.load(f)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: not valid JSON ({e})") from None
        if not isinstance(s, dict) or not s.get(key) or s.get("profile", {}).get("name") != profile:
            raise ValueError(f"{path}: not a {profile}-profile summary of sinklab.train.experiments "
                             f"(no {key!r}, or another profile)")
        out.append(s)
    return out[0], out[1]


def run_training_profile(profile: str, root: str, out: str, progress: bool = True,
                         threads: Optional[int] = None) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """Runs (or resumes; finished runs are skipped) both experiments of ``profile`` with their runs
    under ``root`` and writes the summaries as ``sinklab experiment`` does (``out/fig5-P.json``,
    ``out/table2-P.json``, the figure ``out/fig5-P.png``; pyplot-free, so a notebook's backend is
    left alone). Table 2 runs first, so the causal run Fig. 5 shares with it is trained once.
    Returns (fig5, table2)."""
    from .train import experiments as X

    p = X.profile(profile)
    os.makedirs(out, exist_ok=True)
    t_cfgs = X.table2_configs(profile, root=root, threads=threads)
    table2 = X.table2_summary(t_cfgs, X.run_all(t_cfgs, progress=progress))
    table2["markdown"] = X.table2_markdown(table2)
    f_cfgs = X.fig5_configs(profile, root=root, threads=threads)
    fig5 = X.fig5_summary(f_cfgs, X.run_all(f_cfgs, progress=progress))
    prof = {"name": profile, **{k: (list(v) if isinstance(v, tuple) else v) for k, v in p.items()}}
    fig5["profile"] = table2["profile"] = prof
    png = os.path.join(out, f"fig5-{profile}.png")
    fig = fig5_miniature_figure(fig5)
    fig.savefig(png, dpi=120)
    fig5["figure"] = png
    f_path, t_path = _summary_paths(out, profile)
    save_json(f_path, fig5)
    save_json(t_path, table2)
    return fig5, table2


def training_results(choice: str, root: str = DEFAULT_TRAINING_ROOT, out: str = TRAINING_DIR,
                     progress: bool = True) -> Dict[str, Any]:
    """The two experiments' summaries for the report, by ``choice``:

    * ``"auto"``: the cpu profile's summaries under ``root`` when they exist, else the quick
      profile run into ``out/runs`` (and ``note`` says so);
    * ``"quick"``: the quick profile run (or resumed) into ``out/runs``;
    * ``"cpu"`` / ``"full"``: that profile run or resumed with its runs and summaries in ``root``
      (where ``sinklab experiment --profile P`` puts them).

    Returns ``{"profile", "source" ("ran" or "read"), "where", "note", "fig5", "table2", "seconds"}``."""
    if choice not in TRAINING_PROFILES[1:] + ("auto",):
        raise ValueError(f"training profile {choice!r}: choose from auto, {', '.join(TRAINING_PROFILES[1:])}")
    t0 = time.perf_counter()
    note = ""
    if choice == "auto":
        found = find_training_summaries(root, "cpu")
        if found is not None:
            fig5, table2 = load_training_summaries(found, "cpu")
            return {"profile": "cpu", "source": "read", "where": found, "fig5": fig5, "table2": table2,
                    "note": f"Read the cpu profile's summaries from `{found}` (written by `sinklab experiment "
                            f"fig5|table2 --profile cpu`); nothing was trained for this report.",
                    "seconds": time.perf_counter() - t0}
        note = (f"No cpu-profile summaries under `{root}` (`sinklab experiment fig5|table2 --profile cpu "
                f"--root {root}` writes them, in about an hour on 2 cores), so the quick profile was run instead. ")
        choice = "quick"
    if choice == "quick":
        where = os.path.join(out, "runs")
        fig5, table2 = run_training_profile("quick", where, out, progress)
    else:
        where = root
        fig5, table2 = run_training_profile(choice, root, root, progress)
    note += (f"Ran the {choice} profile: runs (checkpoints and log.jsonl, resumable) in `{where}`, "
             f"summaries `fig5-{choice}.json` and `table2-{choice}.json` in `{out if choice == 'quick' else root}`.")
    return {"profile": choice, "source": "ran", "where": where, "fig5": fig5, "table2": table2, "note": note,
            "seconds": time.perf_counter() - t0}


def _and(items: Sequence[str]) -> str:
    """"a, b and c"."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _signed(x: float, fmt: str = ".3f") -> str:
    """``x`` with its sign, rounding to zero without a minus sign ("+0.000", not "-0.000")."""
    text = format(x, "+" + fmt)
    return "+" + text[1:] if text.startswith("-") and float(text) == 0 else text


def _trend(values: Sequence[float], tol: float = 1e-12) -> str:
    """"rises", "falls" or "is not monotonic" over the sequence (ties allowed, ends must differ)."""
    d = np.diff(np.asarray(values, float))
    if len(d) and np.all(d >= -tol) and values[-1] > values[0] + tol:
        return "rises"
    if len(d) and np.all(d <= tol) and values[-1] < values[0] - tol:
        return "falls"
    return "is not monotonic"


def fig5_reading(fig5: Dict[str, Any], params: Dict[str, int]) -> Tuple[str, Dict[str, Any]]:
    """What the Fig. 5 numbers support against the paper's finding (sinks form, faster and
    stronger at longer contexts; comparable losses), and the numbers it rests on."""
    runs = sorted(fig5["runs"], key=lambda r: r["context"])
    Cs = [r["context"] for r in runs]
    tokens = runs[0]["tokens"][-1]
    last3 = [r["sink_0.3"][-1] for r in runs]
    peak = max(max(r["sink_0.3"]) for r in runs)
    n_ev = sum(len(r["sink_0.3"]) for r in runs)
    ctx = ", ".join(f"C = {C}" for C in Cs)
    if peak == 0:
        text = (f"No head crossed eps = 0.3 in any run at any of the {n_ev} evaluations ({ctx}): at {tokens:,} "
                f"tokens per run ({tokens / PAPER_FIG5_TOKENS:.1e} of the paper's 5B) and {params['params'] / 1e6:.1f}M "
                f"parameters (paper {PAPER_TRAIN_PARAMS}) no sinks formed, so Fig. 5's growth of sinks with the "
                f"training context is not reproduced here. ")
    else:
        tr = _trend(last3)
        text = (f"After {tokens:,} tokens per run the eps = 0.3 sink rate is "
                + ", ".join(f"{_pct(v)} at C = {C}" for v, C in zip(last3, Cs)) + f": it {tr} with the training "
                f"context" + (", the direction of Fig. 5. " if tr == "rises" else
                              ", not the steady rise of Fig. 5. "))
    imp = [r["importance"][-1] for r in runs]
    ratios = [None if v is None else v / uniform_first_importance(sink_T(C)) for v, C in zip(imp, Cs)]
    if all(v is not None for v in ratios):
        where = ("above" if min(ratios) > 1 else "below" if max(ratios) < 1 else "around")
        text += ("Mean first-token importance, which moves before any head crosses eps, ends at "
                 + ", ".join(f"{v:.2f}x" for v in ratios) + f" the value of uniform attention over the same "
                 f"tokens ({ctx}): {where} it" + ("; across contexts it " + _trend(ratios) if len(ratios) > 1 else "")
                 + ". ")
    loss = [r["val_loss"][-1] for r in runs]
    spread = max(loss) - min(loss)
    text += (f"Final validation losses are {min(loss):.3f}–{max(loss):.3f} nats"
             + (" (within 5% of each other, comparable as in the paper)." if spread < 0.05 * min(loss) else
                f" (a spread of {spread:.3f} nats: not as comparable as the paper's)."))
    nums = {"contexts": Cs, "tokens_per_run": tokens, "final_sink_0.3": last3, "peak_sink_0.3": peak,
            "final_importance_over_uniform": ratios, "final_val_loss": loss, "sinks_formed": bool(peak > 0)}
    return text, nums


def table2_reading(table2: Dict[str, Any]) -> Tuple[str, Dict[str, Any]]:
    """What the Table 2 numbers support against the paper's (a fixed ⟨bos⟩ in training makes the
    model rely on it: sinks vanish and the loss explodes without it; otherwise the sink forms on
    the first token, whatever it is), and the numbers it rests on."""
    rows = {(r["masking"], r["fixed_bos"], r["inference"]): r for r in table2["rows"]}
    parts, nums = [], {}
    base = None
    if ("causal", False, "bos") in rows and ("causal", False, "text") in rows:
        base = rows[("causal", False, "text")]["val_loss"] - rows[("causal", False, "bos")]["val_loss"]
        nums["delta_loss_causal_no_fixed_bos"] = base
    for m in ("causal", "intra_doc"):
        if (m, True, "bos") not in rows or (m, True, "text") not in rows:
            continue
        wb, wt = rows[(m, True, "bos")], rows[(m, True, "text")]
        d, dp = wt["val_loss"] - wb["val_loss"], wt["paper_loss"] - wb["paper_loss"]
        nums[f"delta_loss_{m}_fixed_bos"] = d
        verdict = ("collapses as in the paper" if d > 1.0 else
                   "rises, in the paper's direction but far less" if d > 0.05 else
                   "barely changes: no collapse at this scale" if d > -0.05 else "falls, against the paper")
        parts.append(f"{m.replace('_', '-')} with a fixed ⟨bos⟩: removing it at inference moves the loss "
                     f"{wb['val_loss']:.3f} → {wt['val_loss']:.3f} nats ({_signed(d)}; paper {wb['paper_loss']:.2f} → "
                     f"{wt['paper_loss']:.2f}, {dp:+.2f}): it {verdict}")
    text = "; ".join(parts) + "."
    text = text[:1].upper() + text[1:]
    if base is not None:
        text += (f" For the causal model trained without a fixed ⟨bos⟩ the same change is {_signed(base)} nats "
                 f"(paper +0.01).")
    peak = max(r["sink_0.3"] for r in table2["rows"])
    nums["peak_sink_0.3"] = peak
    if peak == 0:
        text += (f" No head crossed eps = 0.3 in any of the {len(rows)} rows (paper 0.00–90.84%), so the sink-rate "
                 f"columns are not reproduced at this scale")
        fb, ft = rows.get(("causal", True, "bos")), rows.get(("causal", True, "text"))
        if fb and ft and fb["importance"] is not None and ft["importance"] is not None:
            text += (f"; the mean first-token importance of the fixed-⟨bos⟩ causal model is {fb['importance']:.3f} "
                     f"with ⟨bos⟩ and {ft['importance']:.3f} text only (uniform attention over 64 tokens: "
                     f"{uniform_first_importance(64):.3f})")
        text += "."
    else:
        fb, ft = rows.get(("causal", True, "bos")), rows.get(("causal", True, "text"))
        if fb and ft:
            text += (f" The fixed-⟨bos⟩ causal model has {fb['sink_0.3']:.2f}% sink heads (eps = 0.3) with ⟨bos⟩ "
                     f"and {ft['sink_0.3']:.2f}% without (paper 90.84 → 0.05)"
                     + (", the paper's collapse of the sink." if ft["sink_0.3"] < 0.5 * fb["sink_0.3"] else
                        ", not the paper's collapse of the sink."))
        ci, cc = rows.get(("intra_doc", False, "text")), rows.get(("causal", False, "text"))
        if ci and cc:
            text += (f" Without a fixed ⟨bos⟩, intra-document masking gives {ci['sink_0.3']:.2f}% against causal "
                     f"{cc['sink_0.3']:.2f}% (paper 28.23 vs 65.15).")
    return text, nums


def section_training(c: Context) -> Section:
    title = "Pre-training in miniature (Fig. 5, Table 2)"
    paper = ("Fig. 5: LLaMA-2-style ~120M models pre-trained at contexts 128–2048 with the same tokens per step, "
             "5B tokens each: no sinks at first, then sinks forming faster and stronger at longer contexts (nearly "
             "none at 128), with comparable validation losses. Table 2 (~120M models, 30B tokens): causal vs "
             "intra-document masking, with or without a fixed ⟨bos⟩ in training, inference with ⟨bos⟩+text or text "
             "only: a model trained with a fixed ⟨bos⟩ relies on it (causal: sink rate 90.84% → 0.05%, loss 2.69 → "
             "7.56 when it is removed); one trained without forms the sink on whatever comes first (65.10% → 65.15%, "
             "2.69 → 2.70); intra-document masking without one has fewer sinks (28.23%).")
    if c.training_profile == "none":
        return Section(title, paper=paper,
                       here="Not run (`--training-profile none`): `sinklab experiment fig5|table2 --profile "
                            "quick|cpu|full` runs these experiments on their own.",
                       body="", reading="Skipped at the user's request: no models were trained for this report.")
    out = os.path.join(c.out, TRAINING_DIR)
    res = training_results(c.training_profile, root=c.training_root, out=out, progress=c.progress)
    fig5, table2, prof_name = res["fig5"], res["table2"], res["profile"]
    prof = fig5["profile"]
    size = training_model_size(prof)
    m = prof["model"]
    tokens = fig5["runs"][0]["tokens"][-1]
    t2_tokens = sorted(set(table2["tokens"].values()))
    here = (f"The {prof_name} profile: LLaMA-style models (RMSNorm, RoPE, SwiGLU) of {size['params']:,} parameters "
            f"({size['non_embedding']:,} without the embedding and LM head; d = {m['d_model']}, {m['n_layers']} "
            f"layers, {m['n_heads']} heads, vocabulary {size['vocab_size']}; paper {PAPER_TRAIN_PARAMS}) trained "
            f"from scratch by sinklab's C engine on the public-domain English corpus (Austen, the KJV and two Bible "
            f"commentaries, byte-level BPE), documents separated by ⟨eos⟩ and packed as in the paper. Fig. 5: "
            f"contexts {_and([str(r['context']) for r in fig5['runs']])}, each with {prof['tokens_per_step']:,} "
            f"tokens per step and {tokens:,} tokens in all ({tokens / PAPER_FIG5_TOKENS:.1e} of the paper's 5B). "
            f"Table 2: context {prof['table2_context']}, the four training conditions, "
            f"{' / '.join(f'{t:,}' for t in t2_tokens)} tokens each ({t2_tokens[0] / PAPER_TABLE2_TOKENS:.1e} of the "
            f"paper's 30B). Sink metric: a_0 on the first min(64, C) tokens of {prof['eval_docs']} held-out "
            f"documents, eps = 0.3 and 0.8; validation loss on the same targets with and without ⟨bos⟩, in nats "
            f"per token of a {size['vocab_size']}-token BPE, so only differences compare with the paper's "
            f"losses (LLaMA-2 tokenizer). " + res["note"])
    fig_rows = "".join(
        f"| {r['context']} | {r['tokens'][-1]:,} | {100 * r['sink_0.3'][-1]:.2f} ({100 * max(r['sink_0.3']):.2f}) | "
        f"{100 * r['sink_0.8'][-1]:.2f} | {_num(r['importance'][-1])} | "
        f"{uniform_first_importance(sink_T(r['context'])):.3f} | {r['val_loss'][-1]:.3f} |\n"
        for r in sorted(fig5["runs"], key=lambda r: r["context"]))
    body = (f"Table 2 in miniature (context {prof['table2_context']}, ours beside the paper's; mean a₀ = mean "
            f"first-token importance):\n\n{table2['markdown']}\n\nFig. 5 in miniature, at the end of training "
            f"(sink rate % at the last evaluation, the largest over all evaluations in brackets; uniform a₀ = "
            f"H_T / T, what a head attending uniformly would give):\n\n| training context C | tokens | sink % eps=0.3 "
            f"(max) | sink % eps=0.8 | mean a₀ | uniform a₀ | val loss (text only) |\n|---|---|---|---|---|---|---|\n"
            + fig_rows)
    os.makedirs(out, exist_ok=True)
    figs = [c.save(fig5_miniature_figure(fig5), f"{TRAINING_DIR}/fig5-{prof_name}.png"),
            c.save(table2_miniature_figure(table2), f"{TRAINING_DIR}/table2-{prof_name}.png")]
    r5, n5 = fig5_reading(fig5, size)
    r2, n2 = table2_reading(table2)
    reading = f"Fig. 5: {r5} Table 2: {r2}"
    if prof_name == "quick":
        reading += (" The quick profile is a smoke test of the whole pipeline, far too small to show the paper's "
                    "effects; `sinklab experiment fig5 --profile cpu` and `sinklab experiment table2 --profile cpu` "
                    "(about an hour on 2 cores; `--profile full` overnight) run the miniature this section is for, "
                    "and `sinklab reproduce` then reads their summaries.")
    return Section(
        title, paper=paper, here=here, body=body, reading=reading, figures=figs,
        numbers={"profile": prof, "source": res["source"], "where": res["where"], "model_size": size,
                 "fig5": {k: v for k, v in fig5.items() if k not in ("figure", "profile")},
                 "table2": {k: v for k, v in table2.items() if k not in ("markdown", "profile")},
                 "fig5_reading": n5, "table2_reading": n2,
                 "paper": {"params": PAPER_TRAIN_PARAMS, "fig5_tokens": PAPER_FIG5_TOKENS,
                           "table2_tokens": PAPER_TABLE2_TOKENS, "fig5_contexts": [128, 256, 512, 1024, 2048]}})


SECTIONS: List[Tuple[str, Callable[[Context], Section]]] = [
    ("sinks", section_sinks), ("long_context", section_long_context), ("interventions", section_interventions),
    ("noop", section_noop), ("perturbation", section_perturbation), ("collapse", section_collapse),
    ("oversquashing", section_oversquashing), ("quality", section_quality), ("training", section_training)]


# ---------------------------------------------------------------------- report
def _versions() -> Dict[str, str]:
    import matplotlib

    from . import __version__, _core

    return {"sinklab": __version__, "numpy": np.__version__, "matplotlib": matplotlib.__version__,
            "python": platform.python_version(), "platform": platform.platform(), "simd": _core.simd(),
            "threads": str(_core.get_num_threads())}


def reproduce(model_name: str = "smollm2-135m-instruct", out: str = "sinklab-report", quick: bool = False,
              progress: bool = True, eps: Sequence[float] = (0.3, 0.8), bos: bool = True,
              settings: Optional[Settings] = None, training_profile: Optional[str] = None,
              training_root: str = DEFAULT_TRAINING_ROOT) -> Dict[str, Any]:
    """Runs every section, writes ``out/report.md``, the figures and ``out/results.json``.

    Args:
        model_name: a registered name, a ``.gguf`` file or a Hugging Face folder.
        out: output folder (created).
        quick: the small preset (see the README for measured times).
        progress: progress bars, each naming what it runs.
        eps: sink thresholds in (0, 1); the first is the one the readings use.
        bos: compare with and without the model's BOS token (default); ``False`` runs every
            analysis without it and skips the comparisons (for models that have none).
        settings: explicit sizes, overriding ``quick``, ``eps`` and ``bos``.
        training_profile: the pre-training section (Fig. 5, Table 2 in miniature): ``"none"``
            skips it, ``"quick"`` runs the smoke-test profile into ``out/training/``, ``"cpu"`` or
            ``"full"`` run (or resume) that profile under ``training_root``. None: ``"quick"``
            when ``quick``, else the cpu profile's summaries under ``training_root`` when they
            exist and the quick profile otherwise (the section says which).
        training_root: the runs' folder of ``sinklab experiment`` (default sinklab-experiments).

    Returns:
        The JSON written to ``results.json``.
    """
    from . import load
    from .io.registry import sha256_path

    s = settings or Settings.for_run(quick, eps=eps, bos=bos)
    bos = s.bos
    if training_profile is not None and training_profile not in TRAINING_PROFILES:
        raise ValueError(f"training_profile {training_profile!r}: choose from {', '.join(TRAINING_PROFILES)}")
    training = training_profile or ("quick" if quick else "auto")
    os.makedirs(out, exist_ok=True)
    t_all = time.perf_counter()
    model = load(model_name, quiet=not progress)
    if bos and model.config.bos_token_id is None:
        raise ValueError(f"{model.name} has no BOS token; run with bos=False (--no-bos)")
    cfg = model.config
    bos_id = cfg.bos_token_id
    meta = {"model": model.name, "source": model.source, "sha256": sha256_path(model.source),
            "config": cfg.to_dict(), "bos_token_id": bos_id,
            "bos_token": model.detokenize([bos_id]) if (model.tokenizer is not None and bos_id is not None) else None,
            "tokenizer_adds_bos": getattr(model.tokenizer, "add_bos_default", None),
            "eps": list(s.eps), "bos": bos, "quick": quick, "settings": vars(s), "versions": _versions(),
            "training_profile": training,
            "started": time.strftime("%Y-%m-%d %H:%M:%S %z")}
    ctx = Context(model, s, out, progress, training_profile=training, training_root=training_root)
    for key, fn in SECTIONS:
        t0 = time.perf_counter()
        sec = fn(ctx)
        sec.seconds = time.perf_counter() - t0
        ctx.done[key] = sec
    meta["seconds_total"] = time.perf_counter() - t_all
    results = to_jsonable({"meta": meta, "paper_elements": _element_rows(ctx.done),
                           **{k: {"title": v.title, "paper": v.paper, "here": v.here, "reading": v.reading,
                                  "seconds": v.seconds, "figures": v.figures, "numbers": v.numbers}
                              for k, v in ctx.done.items()}})
    save_json(os.path.join(out, "results.json"), results)
    with open(os.path.join(out, "report.md"), "w", encoding="utf-8") as f:
        f.write(_markdown(meta, ctx.done))
    return results


def _element_rows(sections: Dict[str, Section]) -> List[Dict[str, str]]:
    return [{"element": e, "paper": p, "status": st, "section": sections[k].title if k in sections else ""}
            for e, p, st, k in PAPER_ELEMENTS]


def _anchor(title: str) -> str:
    keep = [ch for ch in title.lower() if ch.isalnum() or ch in " -"]
    return "#" + "".join(keep).strip().replace(" ", "-")


def _markdown(meta: Dict[str, Any], sections: Dict[str, Section]) -> str:
    c = meta["config"]
    rows = "".join(f"| {r['element']} | {r['paper']} | {r['status']} | "
                   + (f"[{r['section']}]({_anchor(r['section'])})" if r["section"] else "—") + " |\n"
                   for r in _element_rows(sections))
    lines = [f"# sinklab report: {meta['model']}", "",
             f"The analyses of Barbero et al., *Why do LLMs attend to the first token?* (COLM 2025, arXiv 2504.02732), "
             f"that run on one trained model, on `{os.path.basename(os.path.normpath(meta['source']))}` "
             f"(sha256 `{meta['sha256']}`): {c['n_layers']} layers × {c['n_heads']} heads ({c['n_kv_heads']} KV heads), "
             f"d = {c['d_model']}, context {c['context_length']}. The paper's models are Gemma 7B and LLaMA 3.1; "
             f"every section says what differs.",
             f"First token: id {meta['bos_token_id']} ({meta['bos_token']!r}); 'with ⟨bos⟩' means it was prepended, "
             f"'without' that the text starts at its first token. eps = {', '.join(map(str, meta['eps']))}. "
             f"{'Quick settings' if meta['quick'] else 'Full settings'}; total {meta['seconds_total']:.0f} s "
             f"({meta['versions']['threads']} threads, {meta['versions']['simd']} kernels). Every number is in "
             f"`results.json`.", "",
             "## The paper, element by element", "",
             "| paper element | the paper's numbers | status here | section |", "|---|---|---|---|", rows]
    for sec in sections.values():
        lines += [f"## {sec.title}", "", f"**Paper.** {sec.paper}", "", f"**Here.** {sec.here}", ""]
        if sec.body:
            lines += [sec.body, ""]
        lines += [f"![{name}]({name})" for name in sec.figures]
        lines += ["", f"**Reading.** {sec.reading}", "", f"_{sec.seconds:.1f} s_", ""]
    return "\n".join(lines)


# ====================================================================== across families
# `sinklab reproduce --families`: Table 1 across the registered models and the paper's
# "fixed ⟨bos⟩ removed at inference" on the one model here trained with a fixed ⟨bos⟩.
TABLE1_MODELS = ("smollm2-135m-instruct", "gemma-3-270m", "qwen2.5-coder-0.5b-instruct",
                 "qwen2.5-coder-1.5b-instruct")
ENCODER_MODELS = ("all-minilm-l6-v2",)
BOS_REMOVAL_MODELS = ("gemma-3-270m", "qwen2.5-coder-0.5b-instruct")
FAMILIES_FORMAT = "sinklab.FamiliesReport/1"
# The paper's Table 2 rows with a causal mask: (fixed ⟨bos⟩ in training, inference) -> (sink %, val loss).
TABLE2_CAUSAL = {("no", "⟨bos⟩+text"): (65.10, 2.69), ("no", "text only"): (65.15, 2.70),
                 ("yes", "⟨bos⟩+text"): (90.84, 2.69), ("yes", "text only"): (0.05, 7.56)}


@dataclass
class FamilySettings:
    """Sizes of the cross-family study; ``FamilySettings.for_run(quick)`` gives the two presets.

    sink_prompts shipped passages cut to T tokens (⟨bos⟩ among them) for Table 1 and the sink part
    of ⟨bos⟩ removal; perplexity over ppl_texts held-out passages (≤ ppl_max_tokens tokens);
    passkey_trials prompts at each of passkey_lengths (tokens)."""

    sink_prompts: int = 144
    T: int = 64
    eps: Tuple[float, ...] = (0.3, 0.8)
    ppl_texts: int = 36
    ppl_max_tokens: int = 1024
    passkey_lengths: Tuple[int, ...] = (256, 512, 1024, 2048)
    passkey_trials: int = 6

    @classmethod
    def for_run(cls, quick: bool) -> "FamilySettings":
        if quick:
            return cls(sink_prompts=16, ppl_texts=4, ppl_max_tokens=256, passkey_lengths=(256, 1024),
                       passkey_trials=2)
        return cls()


def _weight_types(model) -> Dict[str, int]:
    """{storage type: parameters} over the model's weight matrices and vectors (tied once)."""
    from .families.tensors import TYPE_NAMES

    out: Dict[str, int] = {}
    seen = set()
    for name, w in model.weights.items():
        if name == "rope_inv_freq" or id(w) in seen:
            continue
        seen.add(id(w))
        t = TYPE_NAMES[w.type] if hasattr(w, "type") and not isinstance(w, np.ndarray) else str(np.asarray(w).dtype)
        t = {"float32": "F32", "float16": "F16"}.get(t, t)
        out[t] = out.get(t, 0) + int(np.prod(w.shape))
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def _file_quant(source: str) -> str:
    """The quantization preset a GGUF file name states (Q4_K_M, Q4_1, …), or its format."""
    import re

    base = os.path.basename(os.path.normpath(source))
    m = re.search(r"(?i)(q\d_k_[sml]|q\d_k|q\d_\d|iq\d_\w+|bf16|f16|f32)(?=\.gguf$|[-.])", base)
    if m:
        return m.group(1).upper()
    return "safetensors" if os.path.isdir(source) else "unknown"


def model_facts(model) -> Dict[str, Any]:
    """What Table 1's caption must name: family, size, layers × heads, base/instruct, storage,
    whether the tokenizer prepends ⟨bos⟩ (trained with a fixed one), encoder or decoder."""
    c = model.config
    types = _weight_types(model)
    name = model.name.lower()
    kind = ("encoder" if c.bidirectional else "instruct" if ("instruct" in name or "-it" in name) else "base")
    return {"name": model.name, "family": c.family, "arch": c.arch, "n_layers": c.n_layers, "n_heads": c.n_heads,
            "n_kv_heads": c.n_kv_heads, "d_model": c.d_model, "params": int(sum(types.values())),
            "weight_types": types, "quant": _file_quant(model.source), "kind": kind,
            "bidirectional": bool(c.bidirectional), "bos_token_id": c.bos_token_id,
            "bos_token": None if c.bos_token_id is None else model.detokenize([c.bos_token_id]),
            "tokenizer_adds_bos": getattr(model.tokenizer, "add_bos_default", None)}


def table1_row(model, s: FamilySettings, progress: bool = False, study: Any = None) -> Dict[str, Any]:
    """One row of Table 1 here: the model's facts and its sink rates with ⟨bos⟩ (T = s.T tokens,
    ⟨bos⟩ among them), per eps, with per-layer rates and the mean a_0 per (layer, head).
    ``study``: the with-⟨bos⟩ :class:`SinkStudy` of the same settings, when already run."""
    t0 = time.perf_counter()
    st = study or sink_study(model, load_passages("sinks")[: s.sink_prompts], T=s.T, eps=s.eps, bos=True,
                             skip_short=True, progress=progress)
    return {**model_facts(model), "n_prompts": st.n_prompts, "n_skipped": st.n_skipped, "T": st.T,
            "sink_rate": {f"{e:g}": st.sink_rate(e) for e in s.eps},
            "layer_sink_rate": {f"{e:g}": st.layer_sink_rate(e) for e in s.eps},
            "mean_importance": st.mean, "seconds": time.perf_counter() - t0}


def bos_removal(model, s: FamilySettings, progress: bool = False) -> Dict[str, Any]:
    """The paper's "fixed ⟨bos⟩ removed at inference" on one model, with and without its ⟨bos⟩:
    sink rate, where each head's largest attention mass sits, held-out perplexity and passkey
    accuracy (quality.py), on the same texts and prompts in both conditions."""
    out: Dict[str, Any] = {"facts": model_facts(model), "seconds": {}}
    t0 = time.perf_counter()
    cmp = compare_bos(model, load_passages("sinks")[: s.sink_prompts], T=s.T, eps=s.eps, skip_short=True,
                      keep_keys=True, progress=progress)
    out["seconds"]["sinks"] = time.perf_counter() - t0
    out["sinks"] = {k: {"sink_rate": {f"{e:g}": st.sink_rate(e) for e in s.eps},
                        "layer_sink_rate": {f"{e:g}": st.layer_sink_rate(e) for e in s.eps},
                        "location": st.location(), "n_prompts": st.n_prompts}
                    for k, st in ((BOS, cmp.bos), (NOBOS, cmp.nobos))}
    texts = load_passages("heldout")[: s.ppl_texts]
    ppl = {}
    for k in (BOS, NOBOS):
        t0 = time.perf_counter()
        ppl[k] = perplexity(model, texts, bos=k == BOS, max_tokens=s.ppl_max_tokens, progress=progress)
        out["seconds"][f"perplexity_{k}"] = time.perf_counter() - t0
    lengths = tuple(n for n in s.passkey_lengths if n <= model.config.context_length)
    q = compare_bos_quality(model, texts=texts, max_tokens=s.ppl_max_tokens, lengths=lengths,
                            trials=s.passkey_trials, progress=progress, perplexities=ppl)
    out["seconds"].update({k: v for k, v in q.seconds.items() if k.startswith("passkey")})
    out["perplexity"] = {k: {"perplexity": v.perplexity, "mean_nll": v.mean_nll,
                             "n_predicted": int(v.n_predicted.sum()), "n_texts": len(v.nll)}
                         for k, v in q.perplexity.items()}
    out["passkey"] = {k: {"accuracy": {str(n): a for n, a in v.accuracy.items()},
                          "digit_accuracy": {str(n): a for n, a in v.digit_accuracy.items()},
                          "trials": s.passkey_trials} for k, v in q.passkey.items()}
    out["verdict"] = bos_removal_verdict(out, s.eps)
    out["_bos_study"] = cmp.bos       # reused for Table 1, not saved
    return out


def bos_removal_verdict(r: Dict[str, Any], eps: Sequence[float]) -> Dict[str, Any]:
    """Whether removing ⟨bos⟩ collapses the sinks (the eps = min(eps) rate on position 0 falls to
    less than half) and the quality (perplexity × 1.5 or more, or mean passkey accuracy down by
    more than a third of the trials) — the two halves of the paper's collapse."""
    e = f"{min(eps):g}"
    w, wo = r["sinks"][BOS]["sink_rate"][e], r["sinks"][NOBOS]["sink_rate"][e]
    ppl_ratio = r["perplexity"][NOBOS]["perplexity"] / r["perplexity"][BOS]["perplexity"]
    acc = {k: float(np.mean(list(r["passkey"][k]["accuracy"].values()))) for k in (BOS, NOBOS)}
    sinks_collapse = wo < 0.5 * w
    quality_collapse = ppl_ratio >= 1.5 or acc[NOBOS] < acc[BOS] - 0.34
    return {"eps": float(e), "sink_rate_bos": w, "sink_rate_nobos": wo, "ppl_ratio": ppl_ratio,
            "passkey_mean_bos": acc[BOS], "passkey_mean_nobos": acc[NOBOS],
            "sinks_collapse": bool(sinks_collapse), "quality_collapse": bool(quality_collapse),
            "matches_paper_collapse": bool(sinks_collapse and quality_collapse)}


def families_study(models: Optional[Sequence[str]] = None, encoders: Optional[Sequence[str]] = None,
                   bos_models: Optional[Sequence[str]] = None, settings: Optional[FamilySettings] = None,
                   quick: bool = False, progress: bool = True,
                   loader: Optional[Callable[[str], Any]] = None) -> Dict[str, Any]:
    """Table 1 across ``models`` (+ ``encoders`` as extra rows) and :func:`bos_removal` on
    ``bos_models``; each model is loaded once (``loader``, default :func:`sinklab.load`).
    Returns the JSON-able results (what ``families.json`` holds)."""
    from . import load

    s = settings or FamilySettings.for_run(quick)
    models = TABLE1_MODELS if models is None else tuple(models)
    encoders = ENCODER_MODELS if encoders is None else tuple(encoders)
    bos_models = BOS_REMOVAL_MODELS if bos_models is None else tuple(bos_models)
    loader = loader or (lambda n: load(n, quiet=not progress))
    t_all = time.perf_counter()
    res: Dict[str, Any] = {"table1": [], "encoders": [], "bos_removal": {}, "load_seconds": {}}
    for name in dict.fromkeys(models + encoders + bos_models):   # each once, in order
        t0 = time.perf_counter()
        model = loader(name)
        res["load_seconds"][name] = time.perf_counter() - t0
        study = None
        if name in bos_models:
            res["bos_removal"][name] = bos_removal(model, s, progress)
            study = res["bos_removal"][name].pop("_bos_study")
        if name in models:
            res["table1"].append(table1_row(model, s, progress, study))
        if name in encoders:
            res["encoders"].append(table1_row(model, s, progress, study))
        del model
    res["meta"] = {"settings": vars(s), "quick": quick,
                   "preset": "custom" if settings is not None else "quick" if quick else "full",
                   "versions": _versions(),
                   "seconds_total": time.perf_counter() - t_all, "format": FAMILIES_FORMAT,
                   "started": time.strftime("%Y-%m-%d %H:%M:%S %z")}
    return to_jsonable(res)


def _size(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"


def _storage(f: Dict[str, Any]) -> str:
    total = sum(f["weight_types"].values())
    mix = ", ".join(f"{t} {100 * n / total:.0f}%" for t, n in f["weight_types"].items() if n / total >= 0.01)
    return f"{f['quant']} ({mix})"


def table1_markdown(res: Dict[str, Any]) -> str:
    """Table 1 here beside the paper's rows, its caption, the encoder rows and a reading."""
    rows = res["table1"]
    eps = sorted({float(e) for r in rows + res["encoders"] for e in r["sink_rate"]})
    head = ("| model | layers × heads (KV) | parameters | kind | storage | first token | "
            + " | ".join(f"sink rate eps={e:g}" for e in eps) + " | without ⟨bos⟩ (eps " + " / ".join(f"{e:g}" for e in eps)
            + ") |\n|---|---|---|---|---|---|" + "---|" * (len(eps) + 1) + "\n")

    def nobos(r):  # measured in the ⟨bos⟩-removal study only
        b = res["bos_removal"].get(r["name"])
        return "—" if b is None else " / ".join(_pct(b["sinks"][NOBOS]["sink_rate"][f"{e:g}"]) for e in eps)

    line = lambda r: (f"| {r['name']} ({r['family']}) | {r['n_layers']} × {r['n_heads']} ({r['n_kv_heads']}) | "  # noqa: E731
                      f"{_size(r['params'])} | {r['kind']} | {_storage(r)} | {r['bos_token']!r} "
                      f"({'prepended by its tokenizer' if r['tokenizer_adds_bos'] else 'not prepended by its tokenizer'}) | "
                      + " | ".join(_pct(r["sink_rate"][f"{e:g}"]) for e in eps) + f" | {nobos(r)} |\n")
    paper = "".join(f"| {name} (the paper's Table 1) | {layout} | {name.split()[-1]} | base | bf16 | ⟨bos⟩ | "
                    + " | ".join("—" if e != 0.8 else f"{pct:.2f}%" for e in eps) + " | — |\n"
                    for name, (pct, layout) in TABLE1.items())
    body = head + "".join(line(r) for r in rows) + paper
    n_p = rows[0]["n_prompts"] if rows else 0
    fams = ", ".join(dict.fromkeys(f"{r['family']} ({r['name']})" for r in rows))
    kinds = ", ".join(f"{k}: {', '.join(r['name'] for r in rows if r['kind'] == k)}"
                      for k in dict.fromkeys(r["kind"] for r in rows))
    with_bos = [r["name"] for r in rows if r["tokenizer_adds_bos"]]
    quants = " / ".join(dict.fromkeys(r["quant"] for r in rows))
    sizes = f"{_size(min(r['params'] for r in rows))}–{_size(max(r['params'] for r in rows))}" if rows else "—"
    caption = (f"*Table 1 here.* Sink rate = the share of (prompt, layer, query head) triples whose first-token "
               f"importance a_0 (mean attention position 0 receives from the T = {rows[0]['T'] if rows else 64} "
               f"queries) exceeds eps, over {n_p} shipped passages cut to T tokens with the model's first token "
               f"prepended (counted among the T). The paper's rows are LLaMA 3.1 at eps = 0.8 (the paper's Table 1; "
               f"eps = 0.3 not given). **Confounds:** the rows here differ from each other and from the paper in "
               f"family ({fams} vs LLaMA 3.1), in training ({kinds}; "
               + (f"only {', '.join(with_bos)}'s tokenizer prepends ⟨bos⟩, so for the others the prepended token "
                  f"is one they were not trained to see first" if with_bos else
                  "no tokenizer here prepends ⟨bos⟩: the prepended token is one they were not trained to see first")
               + f"), in storage ({quants} here, computed on the quantized weights, "
               f"vs the paper's bf16) and in size ({sizes} here vs 8B–405B).")
    qw = [r for r in rows if r["family"] == "qwen2"]
    if len(qw) > 1:
        caption += f" Only {' → '.join(r['name'] for r in sorted(qw, key=lambda r: r['params']))} is a size step within one family."
    enc = ""
    if res["encoders"]:
        enc = ("\n\nAn encoder, as an extra row (not comparable with the decoders: for a bidirectional encoder "
               "every query sees position 0, so a_0 averages over all T queries, and [CLS] is what BERT was "
               "trained to see first):\n\n" + head + "".join(line(r) for r in res["encoders"]))
    return body + "\n" + caption + enc


def table1_reading(res: Dict[str, Any]) -> str:
    """A reading that follows from Table 1's numbers."""
    rows = sorted(res["table1"], key=lambda r: r["params"])
    if not rows:
        return ""
    r8 = [r["sink_rate"]["0.8"] for r in rows]
    listed = ", ".join(f"{r['name']} {_pct(x)}" for r, x in zip(rows, r8))
    mono = all(b >= a for a, b in zip(r8, r8[1:]))
    text = (f"By size, the eps = 0.8 sink rates here are {listed}: "
            + ("they rise with size, " if mono else "they do not rise monotonically with size, ")
            + "against 45.97 → 73.49 → 78.29% for LLaMA 3.1 8B → 70B → 405B. ")
    qw = {r["name"]: r for r in rows if r["family"] == "qwen2"}
    small, big = qw.get("qwen2.5-coder-0.5b-instruct"), qw.get("qwen2.5-coder-1.5b-instruct")
    if small and big:
        a, b = small["sink_rate"]["0.8"], big["sink_rate"]["0.8"]
        text += (f"Within one family, Qwen2.5-Coder 0.5B → 1.5B goes {_pct(a)} → {_pct(b)} "
                 + ("(up, the paper's direction). " if b > a + 0.005 else "(down, against the paper's direction). "
                    if b < a - 0.005 else "(flat). "))
    for r in rows:
        b = res["bos_removal"].get(r["name"])
        if b is not None and not r["tokenizer_adds_bos"] and b["sinks"][NOBOS]["sink_rate"]["0.3"] > 2 * r["sink_rate"]["0.3"]:
            text += (f"{r['name']}'s rate is low because of the prepended {r['bos_token']!r}, a token it was not "
                     f"trained to see first: without it, as its tokenizer feeds it, the rate is "
                     f"{_pct(b['sinks'][NOBOS]['sink_rate']['0.3'])} at eps = 0.3 and "
                     f"{_pct(b['sinks'][NOBOS]['sink_rate']['0.8'])} at eps = 0.8. ")
    top = max(rows, key=lambda r: r["sink_rate"]["0.8"])
    text += (f"The highest rate here is {top['name']}'s ({_pct(top['sink_rate']['0.8'])}); with family, training and "
             f"storage all varying, these are data points beside Table 1, not a test of its size trend.")
    return text


def bos_removal_markdown(res: Dict[str, Any]) -> str:
    """The ⟨bos⟩-removal table (one column pair per model), the paper's rows, and the verdicts."""
    bm = res["bos_removal"]
    if not bm:
        return ""
    names = list(bm)
    eps = sorted({float(e) for r in bm.values() for e in r["sinks"][BOS]["sink_rate"]})
    hdr = "| | " + " | ".join(f"{n}: with ⟨bos⟩ | {n}: without" for n in names) + " |\n|---" + "|---" * (2 * len(names)) + "|\n"

    def row(label, f):
        return f"| {label} | " + " | ".join(f(bm[n], k) for n in names for k in (BOS, NOBOS)) + " |\n"

    lines = [row(f"sink rate on position 0, eps={e:g}", lambda r, k, e=e: _pct(r["sinks"][k]["sink_rate"][f"{e:g}"]))
             for e in eps]
    lines += [row("heads whose largest-mass key is position 0", lambda r, k: _pct(r["sinks"][k]["location"]["at_0"])),
              row("… is position 1", lambda r, k: _pct(r["sinks"][k]["location"]["at_1"])),
              row("… is a later position", lambda r, k: _pct(r["sinks"][k]["location"]["elsewhere"])),
              row("mean of the largest key mass", lambda r, k: f"{r['sinks'][k]['location']['mean_max_mass']:.3f}")]
    lines += [row(f"a sink on any key (largest mass > {e:g})",
                  lambda r, k, e=e: _pct(r["sinks"][k]["location"]["sink_anywhere"][f"{e:g}"])) for e in eps]
    lines += [row("held-out perplexity", lambda r, k: f"{r['perplexity'][k]['perplexity']:.2f}"),
              row("mean NLL (nats/token)", lambda r, k: f"{r['perplexity'][k]['mean_nll']:.3f}")]
    lengths = sorted({int(n) for r in bm.values() for n in r["passkey"][BOS]["accuracy"]})
    for n in lengths:
        lines.append(row(f"passkey @ {n} tokens",
                         lambda r, k, n=n: (f"{100 * r['passkey'][k]['accuracy'][str(n)]:.0f}%"
                                            if str(n) in r["passkey"][k]["accuracy"] else "—")))
    first = bm[names[0]]
    note = (f"\n{first['sinks'][BOS]['n_prompts']} passages of T = {res['meta']['settings']['T']} tokens (⟨bos⟩ among "
            f"them; without it, position 0 is each passage's first text token); perplexity over "
            f"{first['perplexity'][BOS]['n_texts']} held-out passages on the same predicted tokens in both columns; "
            f"passkey: {first['passkey'][BOS]['trials']} trials per length, the same prompts in both columns, "
            f"scored by forced decoding (exactly the greedy-decoding verdict). The largest-mass key of a head is "
            f"argmax_k m_k, m_k = 1/T Σ_i A_ik (m_0 = a_0).\n")
    paper = ("\nThe paper's numbers: Table 2 (~120M LLaMA-style models, causal mask): trained *without* a fixed "
             "⟨bos⟩, sink rate 65.10% → 65.15% and validation loss 2.69 → 2.70 when ⟨bos⟩ is dropped at inference; "
             "trained *with* one, 90.84% → 0.05% and 2.69 → 7.56. Its rebuttal's Gemma 7B without ⟨bos⟩: ARC-e "
             "80.77 → 28.49, HellaSwag 80.61 → 27.35, RULER at 4096 tokens 82.57 → 0.00.\n")
    return hdr + "".join(lines) + note + paper


def bos_removal_lines(res: Dict[str, Any]) -> List[str]:
    """Paper-vs-here lines and a plain verdict per model."""
    out = []
    for name, r in res["bos_removal"].items():
        v = r["verdict"]
        f = r["facts"]
        trained = ("trained with a fixed ⟨bos⟩ (its tokenizer prepends it)" if f["tokenizer_adds_bos"] else
                   "trained without a fixed ⟨bos⟩ (its tokenizer prepends nothing)")
        paper_rows = TABLE2_CAUSAL[("yes" if f["tokenizer_adds_bos"] else "no", "⟨bos⟩+text")], \
            TABLE2_CAUSAL[("yes" if f["tokenizer_adds_bos"] else "no", "text only")]
        nll_w, nll_wo = r["perplexity"][BOS]["mean_nll"], r["perplexity"][NOBOS]["mean_nll"]
        loc = r["sinks"][NOBOS]["location"]
        where = (f"without ⟨bos⟩ {_pct(loc['at_0'])} of heads put their largest mass on position 0 (now the first "
                 f"text token), {_pct(loc['at_1'])} on position 1 and {_pct(loc['elsewhere'])} later "
                 f"(with ⟨bos⟩: {_pct(r['sinks'][BOS]['location']['at_0'])} on position 0)")
        line = (f"**{name}**, {trained}. Paper (Table 2, the matching rows): sink rate {paper_rows[0][0]:.2f}% → "
                f"{paper_rows[1][0]:.2f}%, loss {paper_rows[0][1]:.2f} → {paper_rows[1][1]:.2f} nats. Here: sink rate "
                f"(eps = {v['eps']:g}) {_pct(v['sink_rate_bos'])} → {_pct(v['sink_rate_nobos'])}, held-out NLL "
                f"{nll_w:.3f} → {nll_wo:.3f} nats (perplexity ×{v['ppl_ratio']:.2f}), mean passkey accuracy "
                f"{100 * v['passkey_mean_bos']:.0f}% → {100 * v['passkey_mean_nobos']:.0f}%; {where}. ")
        ppl_paper = math.exp(TABLE2_CAUSAL[("yes", "text only")][1] - TABLE2_CAUSAL[("yes", "⟨bos⟩+text")][1])
        pk_same = abs(v["passkey_mean_nobos"] - v["passkey_mean_bos"]) < 0.1
        pk = (f" Passkey retrieval, though, stays at {100 * v['passkey_mean_nobos']:.0f}% up to "
              f"{max(int(n) for n in r['passkey'][NOBOS]['accuracy'])} tokens, unlike RULER's 82.57 → 0.00 at 4096: "
              f"this local task does not separate the conditions." if pk_same else "")
        if v["matches_paper_collapse"]:
            anywhere = r["sinks"][NOBOS]["location"]["sink_anywhere"].get(f"{v['eps']:g}", 1.0)
            line += (f"**This matches the paper's collapse** in the sinks (on position 0 they vanish"
                     + (f", and no other key takes their place: {_pct(anywhere)} of heads have any key above eps = "
                        f"{v['eps']:g}" if anywhere < 0.5 * v["sink_rate_bos"] else "; other keys take their place")
                     + f") and in held-out perplexity (×{v['ppl_ratio']:.1f}; the "
                     f"paper's loss 2.69 → 7.56 is ×{ppl_paper:.0f}, on a model trained from scratch for it)." + pk
                     if f["tokenizer_adds_bos"] else
                     "**A collapse like the paper's fixed-⟨bos⟩ rows, on a model trained without a fixed ⟨bos⟩**: "
                     "not what Table 2 predicts." + pk)
        elif v["sinks_collapse"]:
            line += ("**Half of the paper's collapse**: the sinks on position 0 collapse, but quality degrades "
                     "far less than the paper's loss 2.69 → 7.56 or RULER 82.57 → 0.00.")
        elif v["quality_collapse"]:
            line += ("**Half of the paper's collapse**: quality falls, but the sinks do not vanish from position 0.")
        else:
            line += ("**No collapse**: " + ("this does not match the paper's collapse for a model trained with a "
                                            "fixed ⟨bos⟩." if f["tokenizer_adds_bos"] else
                                            "as Table 2 predicts for a model trained without a fixed ⟨bos⟩: the "
                                            "sink forms on whatever token comes first."))
        if not f["tokenizer_adds_bos"] and (v["sink_rate_nobos"] > 2 * v["sink_rate_bos"] or v["ppl_ratio"] < 1 / 1.2):
            line += (f" The reverse holds here: prepending {f['bos_token']!r}, a token this model was not trained to "
                     f"see first, is what disturbs it — with it only {_pct(v['sink_rate_bos'])} of heads sink on "
                     f"position 0 (against {_pct(v['sink_rate_nobos'])} without) and perplexity is "
                     f"×{1 / v['ppl_ratio']:.2f} higher.")
        out.append(line)
    return out


def _wrap(name: str, width: int = 13) -> str:
    """A model name broken at hyphens into lines of about ``width`` characters (tick labels)."""
    lines, cur = [], ""
    for part in name.split("-"):
        piece = part if not cur else "-" + part
        if cur and len(cur) + len(piece) > width:
            lines.append(cur + "-")
            cur = part
        else:
            cur += piece
    return "\n".join(lines + [cur])


def families_figures(res: Dict[str, Any]) -> Dict[str, Any]:
    """{file name: Figure}: Table 1 here as bars beside the paper's LLaMA 3.1 rows, and ⟨bos⟩
    removal (sink rate per layer, where the sink sits, passkey accuracy per length)."""
    from .viz.figure import subplots

    figs: Dict[str, Any] = {}
    rows = res["table1"] + res["encoders"]
    if rows:
        fig, ax = subplots(figsize=(8.5, 4.2))
        labels = [f"{_wrap(r['name'])}\n{r['n_layers']}×{r['n_heads']}" for r in rows] + \
                 [f"{n}\n{lay.replace(' ', '')}\n(paper)" for n, (_, lay) in TABLE1.items()]
        x = np.arange(len(labels))
        for j, e in enumerate(("0.3", "0.8")):
            vals = [100 * r["sink_rate"].get(e, np.nan) for r in rows] + \
                   [pct if e == "0.8" else np.nan for pct, _ in TABLE1.values()]
            ax.bar(x + (j - 0.5) * 0.38, vals, 0.38, label=f"eps = {e}")
        ax.set_xticks(x)
        ax.set_xticklabels(labels, fontsize=6.5)
        ax.set_ylabel("sink rate (%)")
        ax.set_ylim(0, 100)
        ax.set_title("Table 1 here (T = 64, first token prepended) beside the paper's LLaMA 3.1 (eps = 0.8)",
                     fontsize=9)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        figs["families_table1.png"] = fig
    bm = res["bos_removal"]
    if bm:
        fig, axes = subplots(1, 3, figsize=(13, 4.8))
        for name, r in bm.items():
            for k, style in ((BOS, "-"), (NOBOS, "--")):
                lr = np.asarray(r["sinks"][k]["layer_sink_rate"]["0.3"], float)
                axes[0].plot(np.arange(len(lr)), 100 * lr, style, label=f"{name}, {LABELS[k]}")
        axes[0].set_xlabel("layer")
        axes[0].set_ylabel("sink rate on position 0, eps = 0.3 (%)")
        axes[0].set_ylim(-3, 103)
        axes[0].legend(fontsize=6, loc="upper left", bbox_to_anchor=(0.0, -0.16), ncol=2)
        cats = ("at_0", "at_1", "elsewhere")
        names = [f"{_wrap(n)}\n{LABELS[k]}" for n in bm for k in (BOS, NOBOS)]
        bottom = np.zeros(len(names))
        for cat, lab in zip(cats, ("position 0", "position 1", "later")):
            vals = np.array([100 * bm[n]["sinks"][k]["location"][cat] for n in bm for k in (BOS, NOBOS)])
            axes[1].bar(np.arange(len(names)), vals, bottom=bottom, label=lab)
            bottom += vals
        axes[1].set_xticks(np.arange(len(names)))
        axes[1].set_xticklabels(names, fontsize=6)
        axes[1].set_ylabel("heads by largest-mass key (%)")
        axes[1].legend(fontsize=7)
        for name, r in bm.items():
            for k, style in ((BOS, "-o"), (NOBOS, "--s")):
                acc = r["passkey"][k]["accuracy"]
                xs = sorted(int(n) for n in acc)
                axes[2].plot(xs, [100 * acc[str(n)] for n in xs], style, label=f"{name}, {LABELS[k]}")
        axes[2].set_xscale("log", base=2)
        axes[2].set_xlabel("passkey sequence length (tokens)")
        axes[2].set_ylabel("passkey accuracy (%)")
        axes[2].set_ylim(-5, 105)
        axes[2].legend(fontsize=6, loc="upper left", bbox_to_anchor=(0.0, -0.16), ncol=2)
        for ax in axes:
            ax.grid(alpha=0.3)
        fig.suptitle("⟨bos⟩ removed at inference", fontsize=10)
        fig.tight_layout()
        figs["families_bos_removal.png"] = fig
    return figs


def _bos_models_here(res: Dict[str, Any]) -> str:
    parts = []
    for name, r in res["bos_removal"].items():
        f = r["facts"]
        parts.append(f"{name} ({f['kind']}, {f['family']}; its tokenizer "
                     + (f"prepends {f['bos_token']!r}, so it was trained with a fixed ⟨bos⟩)" if f["tokenizer_adds_bos"]
                        else f"prepends nothing, so it was trained without a fixed ⟨bos⟩; its '⟨bos⟩' here is "
                             f"{f['bos_token']!r})"))
    windows = ""
    if any(r["facts"]["family"] == "gemma" for r in res["bos_removal"].values()):
        windows = (" The passkey lengths go past Gemma 3's 512-token sliding window, so at the longer lengths its "
                   "local layers cannot see position 0.")
    return ("Models: " + "; ".join(parts) + ". Held-out perplexity and a locally generated passkey task stand in for "
            "the paper's benchmarks." + windows)


def families_markdown(res: Dict[str, Any], figures: Sequence[str] = ()) -> str:
    """The families report as Markdown."""
    m = res["meta"]
    secs = "; ".join(f"{k} {v:.0f} s" for k, v in res["load_seconds"].items())
    lines = ["# sinklab: attention sinks across model families", "",
             "Barbero et al., *Why do LLMs attend to the first token?* (COLM 2025, arXiv 2504.02732): Table 1 (sink "
             "rate against model size) and §5/Table 2 with the rebuttal's Gemma 7B numbers (a fixed ⟨bos⟩ removed at "
             "inference), measured here on the registered models.",
             f"{m.get('preset', 'full').capitalize()} settings; total {m['seconds_total']:.0f} s "
             f"({m['versions']['threads']} threads, {m['versions']['simd']} kernels); loading: {secs}. Every number "
             f"is in `families.json`.", ""]
    if res["table1"]:
        lines += ["## Table 1 here: sink rate across models", "", table1_markdown(res), "",
                  f"**Reading.** {table1_reading(res)}", ""]
        lines += [f"![{f}]({f})" for f in figures if "table1" in f] + [""]
    if res["bos_removal"]:
        lines += ["## A fixed ⟨bos⟩ removed at inference (§5, Table 2; the rebuttal's Gemma 7B)", "",
                  "**Paper.** A model trained with a fixed ⟨bos⟩ relies on it: without it at inference its sinks "
                  "vanish (Table 2: 90.84% → 0.05%) and its loss explodes (2.69 → 7.56); Gemma 7B loses most of its "
                  "benchmark accuracy (RULER at 4096 tokens 82.57 → 0.00). A model trained without one forms the "
                  "sink on whatever token comes first (65.10% → 65.15%).", "",
                  "**Here.** " + _bos_models_here(res), "",
                  bos_removal_markdown(res), ""]
        lines += [f"**Reading.** {line}" for line in bos_removal_lines(res)] + [""]
        lines += [f"![{f}]({f})" for f in figures if "bos" in f] + [""]
    return "\n".join(lines)


def reproduce_families(out: str = "sinklab-families", quick: bool = False, progress: bool = True,
                       settings: Optional[FamilySettings] = None, **kw: Any) -> Dict[str, Any]:
    """Runs :func:`families_study` and writes ``out/families.md``, its figures and
    ``out/families.json``. ``kw``: ``models``, ``encoders``, ``bos_models``, ``loader``."""
    os.makedirs(out, exist_ok=True)
    res = families_study(settings=settings, quick=quick, progress=progress, **kw)
    names = []
    for name, fig in families_figures(res).items():
        fig.savefig(os.path.join(out, name), dpi=120)
        names.append(name)
    save_json(os.path.join(out, "families.json"), res)
    with open(os.path.join(out, "families.md"), "w", encoding="utf-8") as f:
        f.write(families_markdown(res, names))
    return res


def load_families(path: Union[str, os.PathLike]) -> Dict[str, Any]:
    """The results :func:`reproduce_families` wrote to ``families.json``."""
    import json

    with open(path, encoding="utf-8") as f:
        res = json.load(f)
    if res.get("meta", {}).get("format") != FAMILIES_FORMAT:
        raise ValueError(f"{path}: not a families report (format {res.get('meta', {}).get('format')!r})")
    return res
