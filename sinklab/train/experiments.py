"""The paper's two pre-training experiments in miniature, each one command.

* **Fig. 5** (``fig5``): the same LLaMA-style model trained at several context lengths C with
  the same tokens per optimizer step and the same total tokens (causal masking, documents
  separated by ⟨eos⟩, no fixed ⟨bos⟩); the sink rate of the first position (ε 0.3 and 0.8) and
  the validation loss at every evaluation, and one figure of sink rate against tokens seen, one
  line per context. The paper: ~120M-parameter LLaMA-2-style models, contexts 128–2048, 5B tokens
  each; no sinks at first, sinks forming faster and stronger at longer contexts (nearly none at
  128), comparable validation losses.
* **Table 2** (``table2``): causal vs intra-document masking, each with and without a fixed ⟨bos⟩
  at position 0 of every window, at one context; each model evaluated with ⟨bos⟩+text and text
  only, in the paper's table layout beside its numbers (~120M models, 30B tokens).

Profiles size the runs: ``quick`` exercises the whole pipeline in a few minutes (CI and
``sinklab reproduce --quick``; too small to show anything), ``cpu`` is what this project ran on
its 2-core machine (under an hour), ``full`` a larger model and 5x the tokens (overnight on a
16-core node, or one run per node of a cluster). Every run is an ordinary :func:`.run.train`
run in its own folder named by its settings, so a killed experiment resumes where it stopped,
runs shared by both experiments (the causal, no-⟨bos⟩ model at Table 2's context) are trained
once, and the runs can be spread over machines that share the folder.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .run import TrainConfig, read_log, train

EPS = (0.3, 0.8)

# Model and schedule of each profile; the contexts of Fig. 5 and the context of Table 2.
PROFILES: Dict[str, Dict[str, Any]] = {
    "quick": {"model": {"d_model": 64, "n_layers": 2, "n_heads": 2, "d_ff": 192},
              "contexts": (32, 64, 128), "table2_context": 64, "tokens_per_step": 1024,
              "total_tokens": 1024 * 24, "lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 4, "eval_every": 8,
              "eval_docs": 8, "eval_windows": 2},
    "cpu": {"model": {"d_model": 128, "n_layers": 4, "n_heads": 4},
            "contexts": (64, 128, 256, 512, 1024), "table2_context": 256, "tokens_per_step": 4096,
            "total_tokens": 4096 * 1000, "lr": 5e-3, "min_lr": 5e-4, "warmup_steps": 50, "eval_every": 100,
            "eval_docs": 64, "eval_windows": 16},
    # the cpu profile trained twice as long (this project ran its two causal Table 2 conditions)
    "cpu2x": {"model": {"d_model": 128, "n_layers": 4, "n_heads": 4},
              "contexts": (64, 128, 256, 512, 1024), "table2_context": 256, "tokens_per_step": 4096,
              "total_tokens": 4096 * 2000, "lr": 5e-3, "min_lr": 5e-4, "warmup_steps": 50, "eval_every": 200,
              "eval_docs": 64, "eval_windows": 16},
    "full": {"model": {"d_model": 256, "n_layers": 4, "n_heads": 4},
             "contexts": (64, 128, 256, 512, 1024), "table2_context": 256, "tokens_per_step": 8192,
             "total_tokens": 8192 * 2500, "lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 100, "eval_every": 250,
             "eval_docs": 64, "eval_windows": 16},
}

# The paper's Table 2 (~120M LLaMA-2-style models, 30B tokens): (masking, fixed ⟨bos⟩ in training,
# inference) -> (sink rate %, validation loss). Its intra-document model without a fixed ⟨bos⟩
# has no ⟨bos⟩+text row (it never saw one).
PAPER_TABLE2: List[Tuple[str, bool, str, float, float]] = [
    ("causal", False, "bos", 65.10, 2.69), ("causal", False, "text", 65.15, 2.70),
    ("causal", True, "bos", 90.84, 2.69), ("causal", True, "text", 0.05, 7.56),
    ("intra_doc", False, "text", 28.23, 2.67),
    ("intra_doc", True, "bos", 90.56, 2.67), ("intra_doc", True, "text", 0.00, 7.78)]

TABLE2_RUNS = (("causal", False), ("causal", True), ("intra_doc", False), ("intra_doc", True))


def profile(name: str) -> Dict[str, Any]:
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r}; choose from {', '.join(PROFILES)}")
    return PROFILES[name]


def run_config(profile_name: str, context: int, masking: str = "causal", fixed_bos: bool = False,
               root: str = "sinklab-experiments", seed: int = 0, threads: Optional[int] = None) -> TrainConfig:
    """The :class:`TrainConfig` of one run of a profile; its folder under ``root`` is named by
    its settings (so equal runs of the two experiments share one folder)."""
    p = profile(profile_name)
    cfg = TrainConfig(**p["model"], context=context, masking=masking, fixed_bos=fixed_bos,
                      tokens_per_step=p["tokens_per_step"], total_tokens=p["total_tokens"], steps=None,
                      lr=p["lr"], min_lr=p["min_lr"], warmup_steps=p["warmup_steps"],
                      eval_every=p["eval_every"], eval_docs=p["eval_docs"], eval_windows=p["eval_windows"],
                      keep_last=1, seed=seed, threads=threads)
    key = {k: v for k, v in cfg.to_dict().items() if k not in ("out_dir", "threads", "keep_last", "keep_steps")}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:10]
    name = f"{profile_name}-C{context}-{masking}{'-bos' if fixed_bos else ''}-{digest}"
    return dataclasses.replace(cfg, out_dir=os.path.join(root, name))


def fig5_configs(profile_name: str, root: str = "sinklab-experiments", **kw: Any) -> List[TrainConfig]:
    """One causal, no-fixed-⟨bos⟩ run per context of the profile (equal tokens per step and in total)."""
    return [run_config(profile_name, C, root=root, **kw) for C in profile(profile_name)["contexts"]]


def table2_configs(profile_name: str, root: str = "sinklab-experiments", **kw: Any) -> List[TrainConfig]:
    """The four training conditions of Table 2 at the profile's context."""
    C = profile(profile_name)["table2_context"]
    return [run_config(profile_name, C, masking, bos, root=root, **kw) for masking, bos in TABLE2_RUNS]


def run_all(configs: Sequence[TrainConfig], progress: bool = True) -> List[Dict[str, Any]]:
    """Trains (or resumes, or skips when finished) every run; returns each run's log."""
    logs = []
    for cfg in configs:
        log = read_log(cfg.out_dir) if os.path.isfile(os.path.join(cfg.out_dir, "log.jsonl")) else []
        if not log or log[-1]["step"] < cfg.n_steps:
            log = train(cfg, progress=progress).log
        logs.append(log)
    return logs


def _evaluated(log: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    return [r for r in log if r.get("val_loss_text") is not None]


def fig5_summary(configs: Sequence[TrainConfig], logs: Sequence[List[Dict[str, Any]]]) -> Dict[str, Any]:
    """Per context: tokens seen, sink rates (text-only inference: these models never saw a
    ⟨bos⟩) and validation loss at every evaluation."""
    out: Dict[str, Any] = {"runs": []}
    for cfg, log in zip(configs, logs):
        ev = _evaluated(log)
        out["runs"].append({"context": cfg.context, "out_dir": cfg.out_dir, "tokens": [r["tokens"] for r in ev],
                            "sink_0.3": [r["sink_text_0.3"] for r in ev], "sink_0.8": [r["sink_text_0.8"] for r in ev],
                            "importance": [r.get("importance_text") for r in ev],
                            "val_loss": [r["val_loss_text"] for r in ev]})
    return out


def table2_summary(configs: Sequence[TrainConfig], logs: Sequence[List[Dict[str, Any]]]) -> Dict[str, Any]:
    """Rows in the paper's layout: (masking, fixed ⟨bos⟩, inference) with our sink rate (%) and
    validation loss (nats) at the end of training, the paper's beside them."""
    final = {(c.masking, c.fixed_bos): _evaluated(l)[-1] for c, l in zip(configs, logs)}
    rows = []
    for masking, bos, mode, p_sink, p_loss in PAPER_TABLE2:
        r = final.get((masking, bos))
        if r is None:
            continue
        rows.append({"masking": masking, "fixed_bos": bos, "inference": mode,
                     "sink_0.3": 100 * r[f"sink_{mode}_0.3"], "sink_0.8": 100 * r[f"sink_{mode}_0.8"],
                     "importance": r.get(f"importance_{mode}"), "val_loss": r[f"val_loss_{mode}"],
                     "val_loss_train": r["val_loss_train"], "paper_sink": p_sink, "paper_loss": p_loss})
    return {"rows": rows, "tokens": {f"{m}{'+bos' if b else ''}": final[(m, b)]["tokens"] for m, b in final}}


def table2_markdown(summary: Dict[str, Any]) -> str:
    """The table in the paper's layout, ours beside the paper's."""
    lines = ["| masking | fixed ⟨bos⟩ in training | inference | sink % (ε 0.3) | sink % (ε 0.8) | mean a₀ "
             "| val loss | paper sink % | paper val loss |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in summary["rows"]:
        imp = "–" if r["importance"] is None else f"{r['importance']:.3f}"
        lines.append(f"| {r['masking'].replace('_', '-')} | {'yes' if r['fixed_bos'] else 'no'} | "
                     f"{'⟨bos⟩+text' if r['inference'] == 'bos' else 'text only'} | {r['sink_0.3']:.2f} | "
                     f"{r['sink_0.8']:.2f} | {imp} | {r['val_loss']:.3f} | {r['paper_sink']:.2f} | "
                     f"{r['paper_loss']:.2f} |")
    return "\n".join(lines)


def fig5_figure(summary: Dict[str, Any], path: str) -> str:
    """Sink rates, mean first-token importance and validation loss against tokens seen, one
    line per context (:func:`sinklab.viz.figures_training.fig5_miniature_figure`), saved to ``path``."""
    from ..viz.figures_training import fig5_miniature_figure

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig5_miniature_figure(summary).savefig(path, dpi=120)
    return path


def run_experiment(name: str, profile_name: str = "cpu", root: str = "sinklab-experiments",
                   out: Optional[str] = None, progress: bool = True, threads: Optional[int] = None) -> Dict[str, Any]:
    """Runs (or resumes) experiment ``"fig5"`` or ``"table2"`` and writes its summary JSON (and
    the figure or the Markdown table) into ``out`` (default ``root``). Returns the summary."""
    if name not in ("fig5", "table2"):
        raise ValueError(f"unknown experiment {name!r}: fig5 or table2")
    make = fig5_configs if name == "fig5" else table2_configs
    configs = make(profile_name, root=root, threads=threads)
    logs = run_all(configs, progress=progress)
    out = out or root
    os.makedirs(out, exist_ok=True)
    summary = fig5_summary(configs, logs) if name == "fig5" else table2_summary(configs, logs)
    p = profile(profile_name)
    summary["profile"] = {"name": profile_name, **{k: (list(v) if isinstance(v, tuple) else v) for k, v in p.items()}}
    if name == "fig5":
        summary["figure"] = fig5_figure(summary, os.path.join(out, f"fig5-{profile_name}.png"))
    else:
        summary["markdown"] = table2_markdown(summary)
    path = os.path.join(out, f"{name}-{profile_name}.json")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(summary, f, indent=1)
    os.replace(tmp, path)
    return summary
