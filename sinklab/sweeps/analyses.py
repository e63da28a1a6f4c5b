"""What one sweep task computes: each analysis at one grid point, as table rows and arrays.

Every function here takes a :class:`~sinklab.sweeps.grid.Task` (and the worker's model) and
returns ``(rows, arrays)``: one dict of scalars per row of the task (its row axes' values are
added by the caller), and the per-prompt arrays behind them, saved beside the rows. They call
the package's own analyses with the task's settings; nothing is re-implemented here.

Models are loaded once per worker process (:func:`worker_model`) and kept, the last
:data:`MODELS_KEPT` of them; a GGUF file's weights stay in its read-only memory map, so the
workers of one node share those pages through the page cache.
"""
from __future__ import annotations

import collections
import os
from typing import Any, Callable, Dict, List, Tuple

import numpy as np

from ..analysis.controls import sink_location as run_sink_location
from ..analysis.long_context import long_context_stats, long_texts
from ..analysis.perturbation import perturbation_study
from ..analysis.quality import perplexity
from ..analysis.sensitivity import sensitivity as run_sensitivity
from ..analysis.sinkset import sink_study as run_sink_study
from ..inputs import prepare, text_budget, text_ids
from ..model import load
from ..runtime import get_num_threads
from ..train.evaluate import EPS
from ..train.experiments import profile as profile_of
from ..train.run import TrainConfig
from ..train.run import train as run_training
from . import user
from .grid import SpecError, Task, make_intervention, read_prompts

Rows = List[Dict[str, Any]]
Arrays = Dict[str, np.ndarray]

MODELS_KEPT = int(os.environ.get("SINKLAB_SWEEP_MODELS", "2"))
"""Models a worker keeps loaded (least recently used dropped first); env SINKLAB_SWEEP_MODELS."""

_MODELS: "collections.OrderedDict[str, Any]" = collections.OrderedDict()  # by name and precision


def worker_model(name: str, precision: str = "fp32") -> Any:
    """The model ``name`` (registered name or path) at ``precision`` (the default of its forward),
    loaded once per (name, precision) in this process."""
    key = f"{name}\0{precision}"
    if key in _MODELS:
        _MODELS.move_to_end(key)
        return _MODELS[key]
    model = load(name, quiet=True, precision=precision)
    _MODELS[key] = model
    while len(_MODELS) > max(1, MODELS_KEPT):
        _MODELS.popitem(last=False)
    return model


def _prompts(task: Task, default_n: int) -> List[str]:
    texts = read_prompts(task.point["prompts"])
    n = int(task.settings.get("n_prompts", default_n) or len(texts))
    if n < 1:
        raise SpecError(f"n_prompts must be >= 1, got {n}")
    return texts[:n]


def _intervention(task: Task, model: Any) -> Any:
    c = model.config
    return make_intervention(task.point.get("intervention", "none"), c.n_layers, c.n_heads)


# ------------------------------------------------------------------ analyses
def sink_study(task: Task, model: Any) -> Tuple[Rows, Arrays]:
    """Sink rate (a_0 > eps, fraction of (prompt, layer, head)) and mean a_0 (paper §3, Fig. 5's
    metric), one row per eps; arrays: ``importance`` (P, L, H) float64."""
    s = task.settings
    st = run_sink_study(model, _prompts(task, 0), T=task.point["T"], eps=tuple(r["eps"] for r in task.rows),
             bos=task.point["bos"], skip_short=True, bos_in_T=bool(s.get("bos_in_T", True)),
             capture=s.get("capture", "stats"), progress=False, intervene=_intervention(task, model))
    rows = [{"sink_rate": st.sink_rate(r["eps"]), "mean_importance": float(st.importance.mean()),
             "n_prompts": st.n_prompts, "n_skipped": st.n_skipped} for r in task.rows]
    return rows, {"importance": st.importance}


def sink_location(task: Task, model: Any) -> Tuple[Rows, Arrays]:
    """Where the sink sits (:func:`sinklab.analysis.controls.sink_location`): per eps the share of
    heads whose top key is position 0 or the first text token, the sink rate at position 0 and the
    mean top mass, each the mean over prompts; arrays: the top mass (P,) per prompt and eps."""
    s, T, bos = task.settings, task.point["T"], task.point["bos"]
    seqs = [prepare(model, ids, bos, T) for ids in (text_ids(model, t) for t in _prompts(task, 0))
            if len(ids) >= text_budget(T, bos)]
    if not seqs:
        raise SpecError(f"sink_location: no prompt has {T} tokens")
    rows, arrays = [], {}
    for r in task.rows:
        loc = run_sink_location(model, np.stack(seqs), text_pos=1 if bos else 0, bos_pos=0 if bos else None, eps=r["eps"],
                  mass=s.get("mass", "seen"), min_queries=int(s.get("min_queries", 8)),
                  intervene=_intervention(task, model))
        rows.append({"share_top_pos0": float(loc.share["pos0"].mean()),
                     "share_top_first_text": float(loc.share["text"].mean()),
                     "sink_rate_pos0": float(loc.sink0.mean()), "top_mass": float(loc.top_mass.mean()),
                     "n_prompts": loc.n_prompts})
        arrays[f"top_mass_eps{r['eps']:g}"] = loc.top_mass
    return rows, arrays


def long_context(task: Task, model: Any) -> Tuple[Rows, Arrays]:
    """Attention statistics at a long context (:func:`sinklab.analysis.long_context.long_context_stats`,
    streamed in C without a T×T buffer) over ``n_windows`` stretches of the prompts joined: per
    eps the mean sink rate, attention to position 0 (queries >= 1) and row entropy; arrays: the
    per-window values."""
    T = int(task.point["T"])
    texts = long_texts(model, T, int(task.settings.get("n_windows", 3)))
    key = "bos" if task.point["bos"] else "nobos"
    rows, arrays = [], {}
    for r in task.rows:
        st = long_context_stats(model, texts, r["eps"])[key]
        rows.append({"sink_rate": float(st["sink_rate"].mean()), "to_first": float(st["to_first"].mean()),
                     "entropy": float(st["entropy"].mean()), "n_windows": len(texts)})
        arrays[f"sink_rate_eps{r['eps']:g}"] = st["sink_rate"]
    return rows, arrays


def perturbation(task: Task, model: Any) -> Tuple[Rows, Arrays]:
    """One-token swaps with and without ⟨bos⟩ (paper §4.1, Fig. 3): per setting the mean
    relative change of the later positions' residual stream (layers >= 1) and the mean
    attention entropy; the pooled no-⟨bos⟩/⟨bos⟩ spread ratio (geometric mean) on both rows."""
    s = task.settings
    texts = read_prompts(task.point["prompts"])       # passages without a valid swap are skipped
    st = perturbation_study(model, texts, n_passages=int(s.get("n_prompts", 10)), swaps_per_passage=int(s.get("swaps_per_passage", 3)),
                            T=task.point["T"], seed=int(s.get("seed", 0)), min_after=int(s.get("min_after", 16)),
                            progress=False)
    pooled = st.pooled_ratio_stats(True)
    ent = st.mean_entropies()
    rows = []
    for r in task.rows:
        setting = "bos" if r["bos"] else "nobos"
        rows.append({"mean_rel_change": float(np.nanmean(st.mean_changes(setting, True)[:, 1:])),
                     "mean_entropy": float(ent["bos_all_keys" if r["bos"] else "nobos"].mean()),
                     "spread_ratio_geomean": float(pooled["geomean"]), "n_swaps": st.n_swaps})
    return rows, {"mean_changes_bos": st.mean_changes("bos", True),
                  "mean_changes_nobos": st.mean_changes("nobos", True)}


def sensitivity(task: Task, model: Any) -> Tuple[Rows, Arrays]:
    """Over-squashing map of the last token (paper §3.2, Fig. 4): Frobenius norm of
    d resid[L][last] / d resid[0][j] at the first position and the mean over the others,
    averaged over the prompts (default 1); arrays: ``fro`` (P, L+1, T)."""
    s = task.settings
    T, bos = task.point["T"], task.point["bos"]
    iv = _intervention(task, model)
    fros = []
    for text in _prompts(task, 1):
        ids = prepare(model, text_ids(model, text), bos, T)
        res = run_sensitivity(model, ids, target=int(s.get("target", -1)), method=s.get("method", "estimate"),
                  n_probes=int(s.get("n_probes", 16)), seed=int(s.get("seed", 0)), intervene=iv,
                  spectral=False, progress=False)
        fros.append(res.fro)
    fro = np.stack(fros)
    first, others = fro[:, 0, 0], fro[:, 0, 1:-1].mean(axis=1)
    return ([{"first": float(first.mean()), "others_mean": float(others.mean()),
              "first_over_others": float((first / others).mean()), "n_prompts": len(fros)}],
            {"fro": fro})


def quality(task: Task, model: Any) -> Tuple[Rows, Arrays]:
    """Held-out perplexity with or without ⟨bos⟩ (paper §3.3's cost of removing the sink): the
    token-weighted mean NLL (nats) over the prompts, each cut to T tokens."""
    r = perplexity(model, _prompts(task, 0), bos=task.point["bos"], max_tokens=task.point["T"],
                   intervene=_intervention(task, model), progress=False)
    return ([{"mean_nll": r.mean_nll, "perplexity": r.perplexity, "n_predicted": int(r.n_predicted.sum()),
              "n_prompts": len(r.nll)}], {"nll": r.nll})


def train(task: Task, out_dir: str) -> Tuple[Rows, Arrays]:
    """One training run (paper §5; :func:`sinklab.train.run.train`) in ``out_dir`` (resumed
    from its latest checkpoint when a retried task finds one), then its final evaluation: per
    (⟨bos⟩ or text-only inference, eps) the validation loss and sink rate."""
    fields = {k: v for k, v in task.settings.items() if k != "profile"}
    if "profile" in task.settings:
        p = profile_of(task.settings["profile"])
        fields = {**p["model"], "tokens_per_step": p["tokens_per_step"], "total_tokens": p["total_tokens"],
                  "lr": p["lr"], "min_lr": p["min_lr"], "warmup_steps": p["warmup_steps"],
                  "eval_every": p["eval_every"], "eval_docs": p["eval_docs"], "eval_windows": p["eval_windows"],
                  "context": p["table2_context"], **fields}
    fields.update(task.point["train"])
    if "steps" in fields and "total_tokens" in fields:
        fields.pop("total_tokens")
    elif "total_tokens" in fields:        # the run's length in tokens: not TrainConfig's default steps
        fields["steps"] = None
    for r in task.rows:
        if r["eps"] not in EPS:
            raise SpecError(f"train runs log sink rates at eps {EPS}; got eps={r['eps']}")
    fields.setdefault("threads", get_num_threads())   # recorded in the run's config: its cost is wall x threads
    cfg = TrainConfig(**fields, out_dir=out_dir, keep_last=1)
    log = run_training(cfg, progress=False).log
    last = [line for line in log if line.get("val_loss_bos") is not None][-1]
    rows = []
    for r in task.rows:
        mode = "bos" if r["bos"] else "text"
        rows.append({"val_loss": last[f"val_loss_{mode}"], "sink_rate": last[f"sink_{mode}_{r['eps']:g}"],
                     "mean_importance": last[f"importance_{mode}"], "steps": last["step"],
                     "train_loss": last["train_loss"], "tokens": last["tokens"], "wall_s": log[-1]["wall_s"],
                     "threads": cfg.threads})
    curve = np.array([[x["step"], x["train_loss"]] for x in log], np.float64)
    return rows, {"train_loss_curve": curve}


MODEL_ANALYSES: Dict[str, Callable[[Task, Any], Tuple[Rows, Arrays]]] = {
    "sink_study": sink_study, "sink_location": sink_location, "long_context": long_context,
    "perturbation": perturbation, "sensitivity": sensitivity, "quality": quality,
}


def model_analysis(task: Task) -> Callable[[Task, Any], Tuple[Rows, Arrays]]:
    """The function that computes ``task``: a built-in of :data:`MODEL_ANALYSES`, or the user
    function it names, checked to be the source the sweep was planned with."""
    if user.is_user_analysis(task.analysis):
        return user.checked(task.analysis, task.identity["user_source_sha256"])
    return MODEL_ANALYSES[task.analysis]
