"""Depth at matched parameters: do deeper models form stronger sinks? (issue 26 item 4)

Thm. 3.2 bounds how much a token's representation can change with an input perturbation by a
product over layers: the deeper the model, the more mixing it must damp to keep representations
apart, and the paper reads sinks as that damping (§3-4; Table 1: the larger LLaMA 3.1 models, 32 to
126 layers, have more sinks). Here models of 2, 4, 8 and 12 layers are trained with the recipe
of a profile (causal packing, a fixed ⟨bos⟩ at position 0 of every window, equal tokens) at
matched *block* parameters (:func:`matched_shape`): the width of each depth is the multiple of
the head dimension whose L·d² is closest to the profile's (the head dimension is kept, so deeper
models have fewer, not narrower, heads), and the MLP width then brings the block parameters to
within a few % of the profile's. The embedding and LM head (2·V·d) shrink with d; both counts are
reported.

Measured at the end of training, over seeds: the sink rate with ⟨bos⟩ (ε 0.3 and 0.8), mean
first-token importance a₀ over uniform attention's, the validation loss with ⟨bos⟩ and what
removing it costs (text-only minus ⟨bos⟩+text loss, the same model and targets). The criterion
(:func:`criterion_depth`): the deepest minus the shallowest model's ε 0.3 sink rate, seed with
seed, t interval over seeds: reproduced above 0, contradicted below, else inconclusive; a setting
where no head became a sink at any depth tests nothing and is inconclusive.

Every run is an ordinary :func:`.run.train` run in its own folder named by its settings
(:func:`.experiments.run_config`), so the sweep resumes, skips finished runs and can adopt runs
trained elsewhere (:func:`.experiments.adopt_runs`).
"""
from __future__ import annotations

import math
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from ..analysis import status as S
from ..analysis.stats import describe_difference
from ..viz.reference import sink_T, uniform_first_importance
from .criteria import mean_pm_sd, seed_interval, seed_stats, seeds_phrase
from .experiments import (PROFILES, clean, common_tokens, finish_summary, profile, run_config,
                          run_with_records, save_figure, seed_list, seed_summary)
from .run import TrainConfig

EPS = 0.3  # the sink rate the criterion reads (the paper's Table 2 threshold)
DEPTH_FIELDS = (("sink_0.3", "sink_bos_0.3"), ("sink_0.8", "sink_bos_0.8"), ("importance", "importance_bos"),
                ("val_loss", "val_loss_bos"), ("val_loss_text", "val_loss_text"), ("sink_text_0.3", "sink_text_0.3"))
DEPTH_RULE = ("reproduced if the 95% t interval over seeds of the deepest minus the shallowest model's final "
              "ε 0.3 sink rate with ⟨bos⟩ (seed with seed) lies above 0, contradicted if below 0, else inconclusive; "
              "inconclusive too when no head became a sink at any depth (a null there tests nothing)")


def d_ff_of(d_model: int, d_ff: Optional[int] = None) -> int:
    """The MLP width of a run: ``d_ff``, or the engine's default for a width d (LLaMA's 8/3·d
    rounded up to a multiple of 64)."""
    return int(d_ff) if d_ff is not None else 64 * math.ceil(8 * d_model / 3 / 64)


def block_params(d_model: int, n_layers: int, d_ff: Optional[int] = None) -> int:
    """Parameters of the transformer blocks (attention q, k, v, o; gated MLP; two RMSNorms each)."""
    return n_layers * (4 * d_model * d_model + 3 * d_model * d_ff_of(d_model, d_ff) + 2 * d_model)


def model_params(d_model: int, n_layers: int, vocab_size: int, d_ff: Optional[int] = None) -> int:
    """All parameters: blocks, the token embedding and the (untied) LM head, the final norm."""
    return block_params(d_model, n_layers, d_ff) + 2 * vocab_size * d_model + d_model


FF_STEP = 32  # the MLP width of a matched depth is a multiple of this


def matched_shape(n_layers: int, d0: int, layers0: int, head_dim: int, d_ff0: Optional[int] = None) -> Dict[str, Any]:
    """The shape of ``n_layers`` layers with the block parameters of ``layers0`` layers of width
    ``d0`` (and MLP width ``d_ff0``, None: the engine's default): the width is the multiple of ``head_dim`` whose L·d² is closest to layers0·d0² (the
    smaller on a tie; the head dimension is kept), then the MLP width the multiple of
    :data:`FF_STEP` whose block parameters come closest (``d_ff0`` at the reference itself)."""
    if n_layers == layers0:
        return {"n_layers": layers0, "d_model": d0, "n_heads": d0 // head_dim, "d_ff": d_ff0}
    target_sq = layers0 * d0 * d0
    k = max(1, round(d0 * math.sqrt(layers0 / n_layers) / head_dim))
    d = head_dim * min((c for c in (k - 1, k, k + 1) if c >= 1),
                       key=lambda c: (abs(n_layers * (c * head_dim) ** 2 - target_sq), c))
    target = block_params(d0, layers0, d_ff0)
    f0 = max(1, round((target / n_layers - 4 * d * d - 2 * d) / (3 * d) / FF_STEP))
    d_ff = FF_STEP * min((f for f in (f0 - 1, f0, f0 + 1) if f >= 1),
                         key=lambda f: (abs(block_params(d, n_layers, FF_STEP * f) - target), f))
    return {"n_layers": n_layers, "d_model": d, "n_heads": d // head_dim, "d_ff": d_ff}


def depth_models(profile_name: str) -> List[Dict[str, Any]]:
    """``{"n_layers", "d_model", "n_heads", "d_ff"}`` of each depth of a profile's ``depths``."""
    p = profile(profile_name)
    if "depths" not in p:
        raise ValueError(f"profile {profile_name!r} has no depth sweep; profiles with one: "
                         + ", ".join(n for n in _profiles_with_depths()))
    m = p["model"]
    hd = m["d_model"] // m["n_heads"]
    return [matched_shape(int(L), m["d_model"], m["n_layers"], hd, m.get("d_ff")) for L in p["depths"]]


def _profiles_with_depths() -> List[str]:
    return [n for n, p in PROFILES.items() if "depths" in p]


def depth_configs(profile_name: str, root: str = "sinklab-experiments", seeds: Union[None, int, Sequence[int]] = None,
                  threads: Optional[int] = None) -> List[TrainConfig]:
    """One causal, fixed-⟨bos⟩ run per depth and seed at the profile's Table 2 context, depth-major."""
    C = profile(profile_name)["table2_context"]
    return [run_config(profile_name, C, "causal", True, root=root, seed=s, threads=threads, model=m)
            for m in depth_models(profile_name) for s in seed_list(profile_name, seeds)]


def _final(log: List[Dict[str, Any]]) -> Dict[str, Any]:
    evs = [r for r in log if r.get("val_loss_text") is not None]
    if not evs:
        raise ValueError("a run has no evaluation")
    return evs[-1]


def depth_summary(configs: Sequence[TrainConfig], logs: Sequence[List[Dict[str, Any]]]) -> Dict[str, Any]:
    """Per depth (ascending), over its seeds: the final value of each of :data:`DEPTH_FIELDS`,
    ``importance_over_uniform`` and ``bos_gap`` (text-only minus ⟨bos⟩+text loss, nats) per seed
    and as mean ± sd with the t interval (``final``); the parameter counts; the largest ε 0.3 sink
    rate at any evaluation (``peak_sink_0.3``). ``differences["deepest_minus_shallowest"]``:
    per seed present at both ends, deepest minus shallowest, over seeds."""
    by: Dict[int, List[Tuple[TrainConfig, List[Dict[str, Any]]]]] = {}
    for cfg, log in zip(configs, logs):
        by.setdefault(cfg.n_layers, []).append((cfg, log))
    rows = []
    for L in sorted(by):
        g = sorted(by[L], key=lambda cl: cl[0].seed)
        cfg0 = g[0][0]
        u = uniform_first_importance(sink_T(cfg0.context))
        finals = [_final(log) for _, log in g]
        vals: Dict[str, List[Optional[float]]] = {k: [f.get(field) for f in finals] for k, field in DEPTH_FIELDS}
        vals["importance_over_uniform"] = [None if v is None else v / u for v in vals["importance"]]
        vals["bos_gap"] = [None if a is None or b is None else a - b for a, b in zip(vals["val_loss_text"], vals["val_loss"])]
        peak = [float(r["sink_bos_0.3"]) for _, log in g for r in log if r.get("sink_bos_0.3") is not None]
        rows.append({"n_layers": L, "d_model": cfg0.d_model, "n_heads": cfg0.n_heads,
                     "d_ff": d_ff_of(cfg0.d_model, cfg0.d_ff),
                     "block_params": block_params(cfg0.d_model, L, cfg0.d_ff),
                     "params": model_params(cfg0.d_model, L, cfg0.vocab_size, cfg0.d_ff),
                     "seeds": [c.seed for c, _ in g], "out_dirs": [c.out_dir for c, _ in g],
                     "tokens": finals[0]["tokens"], "final_per_seed": vals,
                     "final": {k: seed_summary(v) for k, v in vals.items()},
                     "peak_sink_0.3": max(peak) if peak else None})
    out: Dict[str, Any] = {"depths": rows, "seeds": sorted({s for r in rows for s in r["seeds"]}), "differences": {}}
    if len(rows) >= 2:
        lo, hi = rows[0], rows[-1]
        paired = [s for s in lo["seeds"] if s in hi["seeds"]]
        d: Dict[str, Any] = {"depths": [lo["n_layers"], hi["n_layers"]], "seeds": paired}
        for k in lo["final_per_seed"]:
            a, b = dict(zip(lo["seeds"], lo["final_per_seed"][k])), dict(zip(hi["seeds"], hi["final_per_seed"][k]))
            per = [None if a[s] is None or b[s] is None else b[s] - a[s] for s in paired]
            d[f"{k}_per_seed"], d[k] = per, seed_summary(per)
        out["differences"]["deepest_minus_shallowest"] = d
    return clean(out)


def criterion_depth(summary: Dict[str, Any]) -> S.Verdict:
    """"Deeper models form stronger sinks" at matched parameters, by :data:`DEPTH_RULE`."""
    rows = summary["depths"]
    if len(rows) < 2:
        return S.not_testable("the depth comparison needs at least two depths", DEPTH_RULE)
    d = summary["differences"]["deepest_minus_shallowest"]
    iv = seed_interval(d["sink_0.3_per_seed"], 100.0)
    lo, hi = rows[0]["n_layers"], rows[-1]["n_layers"]
    what = f"sink rate at {hi} layers minus at {lo} (percentage points, ε = {EPS:g}, with ⟨bos⟩)"
    nums = {"effect": iv, "depths": [r["n_layers"] for r in rows], "n_seeds": len(d["seeds"])}
    if not any((r["peak_sink_0.3"] or 0) > 0 for r in rows):
        return S.Verdict(S.INCONCLUSIVE, f"no head crossed ε = {EPS:g} at any depth: no sinks formed at this scale, "
                         "so a null here tests nothing", DEPTH_RULE, nums)
    return S.directional(iv, +1, what, spec=".2f", criterion=DEPTH_RULE)


def _pm(per_seed: Sequence[Optional[float]], scale: float = 1.0, spec: str = ".3f", unit: str = "") -> str:
    return mean_pm_sd(seed_stats(per_seed, scale), spec, unit)


def depth_markdown(summary: Dict[str, Any]) -> str:
    """The depth table: one row per depth, mean ± sd over seeds."""
    lines = ["| layers | d × heads | block / all params | seeds | sink % ε 0.3 (⟨bos⟩) | sink % ε 0.8 | a₀ / uniform "
             "| val loss ⟨bos⟩ | removing ⟨bos⟩ (nats) | sink % ε 0.3 text only |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in summary["depths"]:
        v = r["final_per_seed"]
        lines.append(f"| {r['n_layers']} | {r['d_model']} × {r['n_heads']} | {r['block_params'] / 1e6:.2f}M / "
                     f"{r['params'] / 1e6:.2f}M | {len(r['seeds'])} | {_pm(v['sink_0.3'], 100, '.1f')} | "
                     f"{_pm(v['sink_0.8'], 100, '.1f')} | {_pm(v['importance_over_uniform'], 1, '.2f')} | "
                     f"{_pm(v['val_loss'])} | {_pm(v['bos_gap'], 1, '+.3f')} | {_pm(v['sink_text_0.3'], 100, '.1f')} |")
    return "\n".join(lines)


def depth_reading(summary: Dict[str, Any]) -> Tuple[str, S.Verdict]:
    """Sentences on the numbers (the differences named only where their interval excludes 0) and
    :func:`criterion_depth`'s verdict."""
    verdict = criterion_depth(summary)
    rows = summary["depths"]
    seeds = seeds_phrase([(f"{r['n_layers']} layers", len(r["seeds"])) for r in rows])
    parts = [f"Final ε 0.3 sink rate with ⟨bos⟩ over {seeds} (mean ± sd): "
             + ", ".join(f"{_pm(r['final_per_seed']['sink_0.3'], 100, '.1f', '%')} at {r['n_layers']} layers"
                         for r in rows) + "."]
    if len(rows) >= 2:
        d = summary["differences"]["deepest_minus_shallowest"]
        lo, hi = rows[0]["n_layers"], rows[-1]["n_layers"]
        parts.append(f"{hi} minus {lo} layers, seed with seed: sink rate "
                     + describe_difference(seed_interval(d["sink_0.3_per_seed"], 100.0), "difference", ".2f", " pp")
                     + "; cost of removing ⟨bos⟩ " + describe_difference(seed_interval(d["bos_gap_per_seed"]), "difference",
                                                                         ".3f", " nats")
                     + "; validation loss " + describe_difference(seed_interval(d["val_loss_per_seed"]), "difference",
                                                                  ".3f", " nats") + ".")
    parts.append(f"Verdict on \"deeper models form stronger sinks\": {verdict.status} ({verdict.reason}).")
    return " ".join(parts), verdict


def depth_figure(summary: Dict[str, Any], path: str) -> str:
    """Final sink rate (ε 0.3, with ⟨bos⟩) and the cost of removing ⟨bos⟩ against depth, each
    seed a dot and the mean a line (:func:`sinklab.viz.figures_training.depth_figure`), saved to
    ``path``."""
    from ..viz.figures_training import depth_figure as draw  # matplotlib, only to draw

    return save_figure(draw(summary), path)


def run_depth(profile_name: str = "miniature", root: str = "sinklab-experiments", out: Optional[str] = None,
              progress: bool = True, threads: Optional[int] = None, seeds: Union[None, int, Sequence[int]] = None,
              adopt: Sequence[str] = (), records_dir: Optional[str] = None, jobs: int = 1,
              train_missing: bool = True) -> Dict[str, Any]:
    """Trains (or resumes, or skips when finished) every depth and seed of a profile and writes
    ``depth-{profile}.json`` (summary, table, reading, verdict) and ``depth-{profile}.png`` into
    ``out`` (default ``root``). ``adopt``, ``records_dir``, ``jobs``, ``train_missing``: as for
    :func:`.experiments.run_experiment`. Returns the summary."""
    wanted = depth_configs(profile_name, root=root, seeds=seeds, threads=threads)
    configs, logs = run_with_records(wanted, root, adopt, records_dir, common_tokens(profile_name), progress, jobs,
                                     train_missing)
    summary = depth_summary(configs, logs)
    out = out or root
    os.makedirs(out, exist_ok=True)
    summary["profile"] = profile_name
    summary["markdown"] = depth_markdown(summary)
    summary["figure"] = depth_figure(summary, os.path.join(out, f"depth-{profile_name}.png"))
    text, verdict = depth_reading(summary)
    summary["verdict"] = clean(verdict.to_dict())
    return finish_summary(summary, wanted, configs, text, os.path.join(out, f"depth-{profile_name}.json"))
