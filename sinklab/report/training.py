"""Section: pre-training in miniature (Fig. 5, Table 2), run by :mod:`sinklab.train.experiments`
and read here; the verdicts come from :mod:`sinklab.train.criteria`."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from typing import Any, Dict, Optional, Tuple

from ..io.registry import cache_home
from ..viz.figures_training import (depth_figure, fig5_miniature_figure, sink_T, table2_miniature_figure,
                                    uniform_first_importance, variants_seeds_figure)
from ..analysis import status as S
from ..train.criteria import fig5_reading, learned_nothing, seeds_phrase, table2_claims, table2_reading
from ..train import experiments as X
from ..train.engine import llama_config, param_layout
from ..train.run import TrainConfig
from .core import Context, Section, and_list, num
from .elements import MINIATURE

# ---------------------------------------------------------------------- pre-training in miniature
# The paper's pre-training experiments (Fig. 5, Table 2), run by sinklab.train.experiments and
# read here. Profiles: "quick" (a smoke test, seconds), "cpu" (about an hour on 2 cores),
# "miniature" (the miniature search's setting: hours), "full" (overnight); "none" skips the section.
TRAINING_PROFILES = ("none", "quick", "cpu", "miniature", "full")
AUTO_PROFILES = ("miniature", "cpu")        # "auto" reads the first of these whose summaries exist
TRAINING_DIR = "training"                   # the report's subfolder for the section's files
DEFAULT_TRAINING_ROOT = "sinklab-experiments"  # where `sinklab experiment` puts its runs
PAPER_FIG5_TOKENS = 5e9                     # training tokens per Fig. 5 run
PAPER_TABLE2_TOKENS = 30e9                  # training tokens per Table 2 run
PAPER_TRAIN_PARAMS = "~120M"                # the paper's LLaMA-2-style models
# experiments beyond the paper whose summaries the section shows when they sit beside Fig. 5's
BEYOND_TRAINING = {"depth": ("Depth at matched block parameters", depth_figure),
                   "variants": ("Attention variants at Table 2's fixed-⟨bos⟩ causal recipe", variants_seeds_figure)}


def training_model_size(profile: Dict[str, Any], vocab_size: Optional[int] = None) -> Dict[str, int]:
    """Parameters of a profile's model (``profile["model"]``: d_model, n_layers, n_heads, d_ff):
    ``{"params", "non_embedding", "vocab_size"}`` (counts; the embedding and LM head are untied)."""
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
    under ``root`` and writes their summaries and figures into ``out`` exactly as ``sinklab
    experiment table2|fig5`` does (:func:`sinklab.train.experiments.run_experiment`; pyplot-free,
    so a notebook's backend is left alone). Table 2 runs first, so the causal run Fig. 5 shares
    with it is trained once. Returns (fig5, table2)."""
    table2 = X.run_experiment("table2", profile, root=root, out=out, progress=progress, threads=threads)
    fig5 = X.run_experiment("fig5", profile, root=root, out=out, progress=progress, threads=threads)
    return fig5, table2


def beyond_training_summaries(folder: str, profile: str) -> Dict[str, Dict[str, Any]]:
    """The summaries of the experiments beyond the paper found beside Fig. 5's and Table 2's in
    ``folder``: ``{"depth": ..., "variants": ...}`` for those of ``profile`` that exist
    (``sinklab experiment depth|variants --profile PROFILE`` writes them; either may be partial).

    Raises:
        ValueError: a file is there but is not such a summary (named)."""
    found = {}
    for name, key in (("depth", "depths"), ("variants", "variants")):
        path = os.path.join(folder, f"{name}-{profile}.json")
        if not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8") as f:
            try:
                s = json.load(f)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: not valid JSON ({e})") from None
        if not isinstance(s, dict) or not s.get(key) or s.get("profile") != profile or "reading" not in s:
            raise ValueError(f"{path}: not a {profile}-profile {name} summary of sinklab.train.{name} "
                             f"(no {key!r} or reading, or another profile)")
        found[name] = s
    return found


def quick_runs_dir(out: str) -> str:
    """Where the quick profile's runs (checkpoints and logs, about 46 MB) go for a report written to
    ``out``: a scratch folder under the cache (``$SINKLAB_HOME/report-runs/``), one per report
    folder, so that a report interrupted while training resumes them; it is removed once the
    summaries are written, and the report folder keeps only those."""
    key = hashlib.sha256(os.path.abspath(out).encode()).hexdigest()[:16]
    return str(cache_home() / "report-runs" / f"quick-{key}")


def training_results(choice: str, root: str = DEFAULT_TRAINING_ROOT, out: str = TRAINING_DIR,
                     progress: bool = True) -> Dict[str, Any]:
    """The two experiments' summaries for the report, by ``choice``:

    * ``"auto"``: the miniature profile's summaries under ``root`` when they exist, else the cpu
      profile's, else the quick profile run into :func:`quick_runs_dir` (and ``note`` says so);
    * ``"quick"``: the quick profile run (or resumed) into :func:`quick_runs_dir` (the cache), its
      summaries into ``out``;
    * ``"cpu"`` / ``"miniature"`` / ``"full"``: that profile run or resumed with its runs and summaries in ``root``
      (where ``sinklab experiment --profile P`` puts them).

    Returns ``{"profile", "source" ("ran" or "read"), "where", "summaries" (the summaries' folder),
    "note", "fig5", "table2", "seconds"}``."""
    if choice not in TRAINING_PROFILES[1:] + ("auto",):
        raise ValueError(f"training profile {choice!r}: choose from auto, {', '.join(TRAINING_PROFILES[1:])}")
    t0 = time.perf_counter()
    note = ""
    if choice == "auto":
        for prof in AUTO_PROFILES:
            found = find_training_summaries(root, prof)
            if found is not None:
                fig5, table2 = load_training_summaries(found, prof)
                return {"profile": prof, "source": "read", "where": found, "summaries": found, "fig5": fig5,
                        "table2": table2,
                        "note": f"Read the {prof} profile's summaries from `{found}` (written by `sinklab experiment "
                                f"fig5|table2 --profile {prof}`); nothing was trained for this report.",
                        "seconds": time.perf_counter() - t0}
        note = (f"No cpu-profile summaries under `{root}` (`sinklab experiment fig5|table2 --profile cpu "
                f"--root {root}` writes them, in about an hour on 2 cores), so the quick profile was run instead. ")
        choice = "quick"
    if choice == "quick":
        where = quick_runs_dir(out)
        fig5, table2 = run_training_profile("quick", where, out, progress)
        if not os.path.islink(where):       # the curves are in the summaries; the checkpoints were scratch
            shutil.rmtree(where, ignore_errors=True)
        note += (f"Ran the quick profile in a scratch folder under the cache (`{where}`: checkpoints and logs, "
                 f"which an interrupted report resumes from, removed once the summaries were written); summaries "
                 f"`fig5-quick.json` and `table2-quick.json` in `{out}`.")
    else:
        where = root
        fig5, table2 = run_training_profile(choice, root, root, progress)
        note += (f"Ran the {choice} profile: runs (checkpoints and log.jsonl, resumable) in `{where}`, "
                 f"summaries `fig5-{choice}.json` and `table2-{choice}.json` in `{root}`.")
    return {"profile": choice, "source": "ran", "where": where, "summaries": out if choice == "quick" else root,
            "fig5": fig5, "table2": table2, "note": note, "seconds": time.perf_counter() - t0}



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
            f"contexts {and_list([str(r['context']) for r in fig5['runs']])}, each with {prof['tokens_per_step']:,} "
            f"tokens per step and {tokens:,} tokens in all ({tokens / PAPER_FIG5_TOKENS:.1e} of the paper's 5B). "
            f"Table 2: context {prof['table2_context']}, the four training conditions, "
            f"{' / '.join(f'{t:,}' for t in t2_tokens)} tokens each ({t2_tokens[0] / PAPER_TABLE2_TOKENS:.1e} of the "
            f"paper's 30B). Sink metric: a_0 on the first min(64, C) tokens of {prof['eval_docs']} held-out "
            f"documents, eps = 0.3 and 0.8; validation loss on the same targets with and without ⟨bos⟩, in nats "
            f"per token of a {size['vocab_size']}-token BPE, so only differences compare with the paper's "
            f"losses (LLaMA-2 tokenizer). " + res["note"])
    fig_rows = "".join(
        f"| {r['context']} | {r['tokens'][-1]:,} | {100 * r['sink_0.3'][-1]:.2f} ({100 * max(r['sink_0.3']):.2f}) | "
        f"{100 * r['sink_0.8'][-1]:.2f} | {num(r['importance'][-1])} | "
        f"{uniform_first_importance(sink_T(r['context'])):.3f} | {r['val_loss'][-1]:.3f} |\n"
        for r in sorted(fig5["runs"], key=lambda r: r["context"]))
    fig5_seeds = seeds_phrase([(f"C = {r['context']}", len(r.get("seeds", [0]))) for r in fig5["runs"]])
    body = (f"Table 2 in miniature (context {prof['table2_context']}, ours beside the paper's; mean a₀ = mean "
            f"first-token importance; mean ± sd over seeds):\n\n{table2['markdown']}\n\n"
            + table2.get("differences_markdown", "") + f"\n\nFig. 5 in miniature, at the end of training, means over "
            f"{fig5_seeds} (sink rate % at the last evaluation, the largest over all evaluations in brackets; uniform a₀ = "
            f"H_T / T, what a head attending uniformly would give):\n\n| training context C | tokens | sink % eps=0.3 "
            f"(max) | sink % eps=0.8 | mean a₀ | uniform a₀ | val loss (text only) |\n|---|---|---|---|---|---|---|\n"
            + fig_rows)
    os.makedirs(out, exist_ok=True)
    figs = [c.save(fig5_miniature_figure(fig5), f"{TRAINING_DIR}/fig5-{prof_name}.png"),
            c.save(table2_miniature_figure(table2), f"{TRAINING_DIR}/table2-{prof_name}.png")]
    r5, n5, v5 = fig5_reading(fig5, size)
    r2, n2, _ = table2_reading(table2)
    claims = table2_claims(table2)
    verdicts = {"fig5": {MINIATURE: v5},
                "table2_fixed": {MINIATURE: S.combine(*(v for k, v in claims.items() if not k.startswith("no_fixed")),
                                                      what="fixed ⟨bos⟩")},
                "table2_free": {MINIATURE: S.combine(*(v for k, v in claims.items() if k.startswith("no_fixed")),
                                                     what="no fixed ⟨bos⟩")}}
    for summary, keys in ((fig5, ("fig5",)), (table2, ("table2_fixed", "table2_free"))):
        why = learned_nothing(summary, size["vocab_size"])
        if why is not None:
            for k in keys:
                verdicts[k] = {MINIATURE: S.not_testable(why, numbers={"criterion_gave": verdicts[k][MINIATURE].status})}
    reading = f"Fig. 5: {r5} Table 2: {r2}"
    beyond = beyond_training_summaries(res["summaries"], prof_name)
    for name, (what, draw) in BEYOND_TRAINING.items():
        if name in beyond:
            b = beyond[name]
            body += (f"\n\n{what} (beyond the paper; `sinklab experiment {name} --profile {prof_name}`, "
                     f"mean ± sd over seeds):\n\n{b['markdown']}\n")
            reading += f" {what}: {b['reading']}"
            figs.append(c.save(draw(b), f"{TRAINING_DIR}/{name}-{prof_name}.png"))
    if prof_name == "quick":
        reading += (" The quick profile is a smoke test of the whole pipeline, far too small to show the paper's "
                    "effects; `sinklab experiment fig5 --profile cpu` and `sinklab experiment table2 --profile cpu` "
                    "(about an hour on 2 cores; `--profile full` overnight) run the miniature this section is for, "
                    "and `sinklab reproduce` then reads their summaries.")
    return Section(
        title, paper=paper, here=here, body=body, reading=reading, figures=figs, verdicts=verdicts,
        numbers={"profile": prof, "source": res["source"], "where": res["where"], "model_size": size,
                 "fig5": {k: v for k, v in fig5.items() if k not in ("figure", "profile")},
                 "table2": {k: v for k, v in table2.items() if k not in ("markdown", "profile")},
                 "fig5_reading": n5, "table2_reading": n2,
                 "beyond": {k: {"verdict": b.get("verdict", b.get("verdicts")), "complete": b.get("complete"),
                                "missing_runs": b.get("missing_runs")} for k, b in beyond.items()}, "table2_claims": {k: v.to_dict() for k, v in claims.items()},
                 "paper": {"params": PAPER_TRAIN_PARAMS, "fig5_tokens": PAPER_FIG5_TOKENS,
                           "table2_tokens": PAPER_TABLE2_TOKENS, "fig5_contexts": [128, 256, 512, 1024, 2048]}})

