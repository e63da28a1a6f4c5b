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

Seeds: every condition is trained with ``seeds`` training seeds (default 3 in every profile;
the seed sets the initial weights and the data order), each an ordinary run in its own folder.
Seed 0's folder keeps the name it had before seeds were added (``{profile}-C{C}-{masking}[-bos]-
{digest}``), so runs trained then are reused; seed s > 0 is ``...-s{s}-{digest}``. Summaries keep
the per-condition fields they always had (now the mean over seeds) and add, for every reported
number, the per-seed values and mean ± sd with the t interval of the mean
(:func:`sinklab.analysis.stats.over_seeds`), and the paired per-seed differences the criteria
of :mod:`.criteria` judge: Table 2's change when ⟨bos⟩ is removed at inference (text only minus
⟨bos⟩+text, the same model) and Fig. 5's longest minus shortest context (seed s with seed s).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import shutil
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from ..analysis.stats import over_seeds
from ..progress import progress_bar
from ..runtime import get_num_threads, sigterm_as_interrupt
from ..viz.reference import sink_T, uniform_first_importance
from . import criteria, records
from .corpus import CORPUS_NAME, corpus_for, corpus_key
from .criteria import PAPER_TABLE2
from .run import TrainConfig, read_log, train

EPS = (0.3, 0.8)
DEFAULT_SEEDS = 3     # training seeds per condition in every profile (seeds 0, 1, 2)

# Model and schedule of each profile; the contexts of Fig. 5 and the context of Table 2.
PROFILES: Dict[str, Dict[str, Any]] = {
    "quick": {"model": {"d_model": 64, "n_layers": 2, "n_heads": 2, "d_ff": 192},
              "contexts": (32, 64, 128), "table2_context": 64, "tokens_per_step": 1024,
              "total_tokens": 1024 * 24, "lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 4, "eval_every": 8,
              "eval_docs": 8, "eval_windows": 2, "seeds": DEFAULT_SEEDS, "depths": (1, 2, 4)},
    "cpu": {"model": {"d_model": 128, "n_layers": 4, "n_heads": 4},
            "contexts": (64, 128, 256, 512, 1024), "table2_context": 256, "tokens_per_step": 4096,
            "total_tokens": 4096 * 1000, "lr": 5e-3, "min_lr": 5e-4, "warmup_steps": 50, "eval_every": 100,
            "eval_docs": 64, "eval_windows": 16, "seeds": DEFAULT_SEEDS},
    # the cpu profile trained twice as long (this project ran its two causal Table 2 conditions)
    "cpu2x": {"model": {"d_model": 128, "n_layers": 4, "n_heads": 4},
              "contexts": (64, 128, 256, 512, 1024), "table2_context": 256, "tokens_per_step": 4096,
              "total_tokens": 4096 * 2000, "lr": 5e-3, "min_lr": 5e-4, "warmup_steps": 50, "eval_every": 200,
              "eval_docs": 64, "eval_windows": 16, "seeds": DEFAULT_SEEDS},
    # the setting of the miniature search (sinklab.train.miniature, round 3) where a fixed <bos> came to
    # matter most: 8 heads of dim 16, weight decay 2.0, 14.3M tokens (2.3 epochs); ~35 min a run at 1 thread
    "miniature": {"model": {"d_model": 128, "n_layers": 4, "n_heads": 8},
                  "contexts": (128, 256, 512, 1024, 2048), "table2_context": 256, "tokens_per_step": 8192,
                  "total_tokens": 8192 * 1750, "lr": 5e-3, "min_lr": 5e-4, "warmup_steps": 50, "eval_every": 250,
                  "eval_docs": 64, "eval_windows": 16, "weight_decay": 2.0, "seeds": DEFAULT_SEEDS,
                  "depths": (2, 4, 8, 12)},
    # the miniature recipe on the extended corpus (sinklab.train.corpus "pd-english-xl", 18.7M training
    # tokens): 0.77 epochs instead of 2.3, so whether repeating the data matters can be read off; its
    # validation losses are on another BPE and held-out set, so only within-model differences compare
    "miniature-xl": {"model": {"d_model": 128, "n_layers": 4, "n_heads": 8},
                     "contexts": (128, 256, 512, 1024, 2048), "table2_context": 256, "tokens_per_step": 8192,
                     "total_tokens": 8192 * 1750, "lr": 5e-3, "min_lr": 5e-4, "warmup_steps": 50, "eval_every": 250,
                     "eval_docs": 64, "eval_windows": 16, "weight_decay": 2.0, "seeds": DEFAULT_SEEDS,
                     "depths": (2, 4, 8, 12), "corpus": "pd-english-xl"},
    "full": {"model": {"d_model": 256, "n_layers": 4, "n_heads": 4},
             "contexts": (64, 128, 256, 512, 1024), "table2_context": 256, "tokens_per_step": 8192,
             "total_tokens": 8192 * 2500, "lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 100, "eval_every": 250,
             "eval_docs": 64, "eval_windows": 16, "seeds": DEFAULT_SEEDS},
}

TABLE2_RUNS = (("causal", False), ("causal", True), ("intra_doc", False), ("intra_doc", True))


def profile(name: str) -> Dict[str, Any]:
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r}; choose from {', '.join(PROFILES)}")
    return PROFILES[name]


def seed_list(profile_name: str, seeds: Union[None, int, Sequence[int]] = None) -> List[int]:
    """The training seeds of a profile's conditions: ``None`` the profile's ``seeds`` (3), an int
    n the seeds 0..n-1, or an explicit list (distinct, non-negative)."""
    if seeds is None:
        seeds = int(profile(profile_name).get("seeds", DEFAULT_SEEDS))
    if isinstance(seeds, bool) or not isinstance(seeds, (int, list, tuple, range)):
        raise ValueError(f"seeds must be a number of seeds or a list of seeds, got {seeds!r}")
    out = list(range(seeds)) if isinstance(seeds, int) else [int(x) for x in seeds]
    if not out or len(set(out)) != len(out) or min(out) < 0:
        raise ValueError(f"seeds must be at least one distinct non-negative seed, got {seeds!r}")
    return out


def run_config(profile_name: str, context: int, masking: str = "causal", fixed_bos: bool = False,
               root: str = "sinklab-experiments", seed: int = 0, threads: Optional[int] = None,
               attention: str = "softmax", model: Optional[Dict[str, Any]] = None) -> TrainConfig:
    """The :class:`TrainConfig` of one run of a profile; its folder under ``root`` is named by
    its settings (so equal runs of the two experiments share one folder). The digest covers every
    setting, the seed included; seed 0's name is the one runs had before seeds were added, seed
    s > 0 adds ``-s{s}``; ``attention`` other than ``"softmax"`` (a variant that needs no ⟨bos⟩
    sink, :class:`TrainConfig`) adds ``-{attention}`` and enters the digest, softmax runs keep
    their names. ``model``: width, depth or heads other than the profile's (the depth sweep,
    :mod:`.depth`); a run with them adds ``-L{layers}-d{width}`` to its name."""
    p = profile(profile_name)
    shape = {**p["model"], **{k: v for k, v in (model or {}).items() if v is not None or k in p["model"]}}
    if int(seed) < 0:
        raise ValueError(f"seed must be non-negative, got {seed}")
    cfg = TrainConfig(**shape, context=context, masking=masking, fixed_bos=fixed_bos,
                      tokens_per_step=p["tokens_per_step"], total_tokens=p["total_tokens"], steps=None,
                      lr=p["lr"], min_lr=p["min_lr"], warmup_steps=p["warmup_steps"],
                      eval_every=p["eval_every"], eval_docs=p["eval_docs"], eval_windows=p["eval_windows"],
                      keep_last=1, seed=int(seed), threads=threads, attention=attention,
                      corpus=p.get("corpus", CORPUS_NAME),
                      **({"weight_decay": p["weight_decay"]} if "weight_decay" in p else {})).validate()
    key = {k: v for k, v in cfg.to_dict().items() if k not in ("out_dir", "threads", "keep_last", "keep_steps")}
    if key.get("precision") == "fp32":  # fp32 runs keep the names they had before the field existed
        del key["precision"]
    if key.get("attention") == "softmax":  # so do softmax runs, from before the attention variants
        del key["attention"]
    if key.get("corpus") == CORPUS_NAME:  # and runs on the default corpus, from before the extended one
        del key["corpus"]
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:10]
    variant = f"-{attention}" if attention != "softmax" else ""
    if shape != p["model"]:
        variant += f"-L{cfg.n_layers}-d{cfg.d_model}"
    name = (f"{profile_name}-C{context}-{masking}{'-bos' if fixed_bos else ''}{variant}{f'-s{seed}' if seed else ''}"
            f"-{digest}")
    return dataclasses.replace(cfg, out_dir=os.path.join(root, name))


def _seeds_kw(profile_name: str, seeds: Any, kw: Dict[str, Any]) -> List[int]:
    if "seed" in kw:                       # the one-seed call of before: seed=s
        s = kw.pop("seed")
        if seeds is None:
            seeds = [s]
    return seed_list(profile_name, seeds)


def fig5_configs(profile_name: str, root: str = "sinklab-experiments", seeds: Union[None, int, Sequence[int]] = None,
                 **kw: Any) -> List[TrainConfig]:
    """One causal, no-fixed-⟨bos⟩ run per context and seed of the profile (equal tokens per step
    and in total), context-major: C₁ seed 0, C₁ seed 1, ..., C₂ seed 0, ..."""
    ss = _seeds_kw(profile_name, seeds, kw)
    return [run_config(profile_name, C, root=root, seed=s, **kw) for C in profile(profile_name)["contexts"] for s in ss]


def table2_configs(profile_name: str, root: str = "sinklab-experiments", seeds: Union[None, int, Sequence[int]] = None,
                   **kw: Any) -> List[TrainConfig]:
    """The four training conditions of Table 2 at the profile's context, each with every seed,
    condition-major."""
    ss = _seeds_kw(profile_name, seeds, kw)
    C = profile(profile_name)["table2_context"]
    return [run_config(profile_name, C, masking, bos, root=root, seed=s, **kw) for masking, bos in TABLE2_RUNS
            for s in ss]


_RUN_ONLY = ("out_dir", "threads", "keep_last", "keep_steps")  # settings that change no number of a run


def _settings(run_config: Dict[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in run_config.items() if k not in _RUN_ONLY}


def _finished_settings(folder: str) -> Optional[Tuple[Dict[str, Any], bool]]:
    """(the settings that change a number, whether it is a record) of the finished run or the
    record in ``folder``, else None."""
    cfg = records.finished_config(folder)
    if cfg is not None:
        return _settings(cfg.to_dict()), False
    rec = records.read_record(folder)
    return (_settings(rec["config"].to_dict()), True) if rec is not None else None


def adopt_runs(configs: Sequence[TrainConfig], sources: Sequence[str]) -> List[str]:
    """Fills the folders of ``configs`` that have no run yet from finished runs trained elsewhere
    (a sweep's ``runs/train-*`` folders, another root: copied whole) or from their records
    (:mod:`.records`: the log and the record, no checkpoint), when every setting that changes a
    number (all but the folder, threads and checkpoint retention) is equal: a miniature-search run
    is then seed 0 of an experiment's condition, and a run finished in another session is not
    trained again. ``sources`` are run or record folders or folders of them (searched two levels
    deep); a full run is preferred to a record. Returns the folders filled."""
    found: List[Tuple[Dict[str, Any], bool, str]] = []
    for src in sources:
        if not os.path.isdir(src):
            raise FileNotFoundError(f"no folder {src!r} to adopt runs from")
        cands = [src] + [os.path.join(src, a) for a in sorted(os.listdir(src))]
        cands += [os.path.join(c, b) for c in cands[1:] if os.path.isdir(c) for b in sorted(os.listdir(c))]
        for c in cands:
            got = _finished_settings(c) if os.path.isdir(c) else None
            if got is not None:
                found.append((got[0], got[1], c))
    found.sort(key=lambda f: f[1])  # full runs first
    filled = []
    for cfg in configs:
        if os.path.exists(cfg.out_dir):
            continue
        want = _settings(cfg.to_dict())
        match = next(((is_rec, d) for rc, is_rec, d in found if rc == want), None)
        if match is None:
            continue
        tmp = f"{cfg.out_dir}.adopt-{os.getpid()}"
        if match[0]:
            os.makedirs(tmp)
            for name in (records.LOG_FILE, records.RECORD_FILE):
                shutil.copyfile(os.path.join(match[1], name), os.path.join(tmp, name))
        else:
            shutil.copytree(match[1], tmp, symlinks=True)
        os.replace(tmp, cfg.out_dir)
        filled.append(cfg.out_dir)
    return filled


def common_tokens(profile_name: str) -> Tuple[int, ...]:
    """The n of Fig. 5's common targets in a profile (its shortest context - 1), which every run
    record keeps a loss for (a Table 2 run is also one of Fig. 5's)."""
    return (min(profile(profile_name)["contexts"]) - 1,)


def run_with_records(configs: Sequence[TrainConfig], root: str, adopt: Sequence[str] = (),
                     records_dir: Optional[str] = None, common: Sequence[int] = (),
                     progress: bool = True, jobs: int = 1,
                     train_missing: bool = True) -> Tuple[List[TrainConfig], List[List[Dict[str, Any]]]]:
    """:func:`run_all` (``jobs`` runs at a time) after adopting finished runs from ``adopt`` and
    ``records_dir``, writing a record of each run into ``records_dir`` (with its loss on the
    first n tokens for each n of ``common``) as it finishes, and of every finished run at the end,
    also when a run fails or is interrupted part-way (Ctrl-C, or SIGTERM under the CLI: the
    KeyboardInterrupt then says how many runs finished). Returns (configs, logs) of the finished
    runs: all of them, or with ``train_missing=False`` (nothing trained or resumed) only those
    already finished, in order. Raises ValueError when that leaves none."""
    sources = list(adopt) + ([records_dir] if records_dir and os.path.isdir(records_dir) else [])
    if sources:
        os.makedirs(root, exist_ok=True)
        adopt_runs(configs, sources)

    def record(cfg: TrainConfig) -> None:
        if records_dir:
            records.write_records([cfg], records_dir, common)

    try:
        if train_missing:
            return list(configs), run_all(configs, progress=progress, jobs=jobs, on_finished=record)
        done = [c for c in configs if not _needs_training(c)]
        if not done:
            raise ValueError(f"none of the {len(configs)} runs has finished (under {root!r}"
                             f"{f' or recorded in {records_dir!r}' if records_dir else ''})")
        return done, [read_log(c.out_dir) for c in done]
    except KeyboardInterrupt as e:
        said = f"{e.args[0]}; " if e.args and e.args[0] else ""
        n_done = sum(not _needs_training(c) for c in configs)
        e.args = (f"{said}{n_done} of {len(configs)} runs finished"
                  + (f" and recorded in {records_dir}" if records_dir else "")
                  + "; run the same command again to resume the others from their checkpoints",)
        raise
    finally:
        if records_dir:
            records.write_records(configs, records_dir, common)


def partial_note(summary: Dict[str, Any], n_wanted: int) -> str:
    """The sentence a partial experiment's reading starts with ("" when complete)."""
    miss = summary.get("missing_runs") or []
    if not miss:
        return ""
    return (f"Partial: {n_wanted - len(miss)} of {n_wanted} runs have finished; not yet trained: "
            f"{', '.join(miss)}. ")


def save_figure(fig: Any, path: str) -> str:
    """Saves a drawn matplotlib figure to ``path`` (its folder made), at 120 dpi. Returns ``path``."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)
    return path


def finish_summary(summary: Dict[str, Any], wanted: Sequence[TrainConfig], done: Sequence[TrainConfig],
                   reading: str, path: str) -> Dict[str, Any]:
    """Marks ``summary`` complete or partial (``complete``, ``missing_runs``; the reading then
    starts by naming what is missing), sets its ``reading`` and writes it to ``path`` as JSON,
    atomically (a crash leaves the previous summary). Returns ``summary``."""
    summary["complete"], summary["missing_runs"] = len(done) == len(wanted), missing_runs(wanted, done)
    summary["reading"] = partial_note(summary, len(wanted)) + reading
    with open(path + ".tmp", "w") as f:
        json.dump(summary, f, indent=1)
    os.replace(path + ".tmp", path)
    return summary


def missing_runs(configs: Sequence[TrainConfig], done: Sequence[TrainConfig]) -> List[str]:
    """The folder names of ``configs`` not among ``done`` (a partial experiment's summary lists them)."""
    have = {c.out_dir for c in done}
    return [os.path.basename(c.out_dir) for c in configs if c.out_dir not in have]


def _needs_training(cfg: TrainConfig) -> bool:
    log = read_log(cfg.out_dir) if os.path.isfile(os.path.join(cfg.out_dir, "log.jsonl")) else []
    return not log or log[-1]["step"] < cfg.n_steps


def _train_in_worker(cfg: TrainConfig) -> str:
    with sigterm_as_interrupt():  # stopped by the campaign (or kill): the run leaves no half-written file
        train(cfg, progress=False)
    return cfg.out_dir


WORKER_GRACE_S = 30.0  # a stopped worker's time to leave its checkpoint folder whole, then SIGKILL


def _stop_workers(ex: Any) -> None:
    """After Ctrl-C or SIGTERM of the campaign: SIGTERM to every worker still training (a Ctrl-C
    at a terminal reached them already; a ``kill`` of this process did not), each given
    :data:`WORKER_GRACE_S` to stop at a step boundary, so that none goes on training unwatched."""
    import multiprocessing

    ex.shutdown(wait=False, cancel_futures=True)
    workers = multiprocessing.active_children()
    for p in workers:
        p.join(timeout=2.0)        # those that had the Ctrl-C are stopping on their own
        if p.is_alive():
            p.terminate()
    for p in workers:
        p.join(timeout=WORKER_GRACE_S)
        if p.is_alive():
            p.kill()


def _train_in_processes(todo: Sequence[TrainConfig], jobs: int, progress: bool,
                        on_finished: Optional[Callable[[TrainConfig], None]] = None) -> None:
    """Trains ``todo`` in ``jobs`` spawned processes, each with its share of the threads (a run's
    numbers do not depend on its thread count), one progress bar over the runs; ``on_finished``
    is called (here, in this process) with each run's config as it finishes."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    for c in {corpus_key(c): c for c in todo}.values():  # each corpus prepared once, here, not raced by the workers
        corpus_for(c, quiet=not progress)
    # a run's threads (or the default) are the budget of all: each worker gets its share
    todo = [dataclasses.replace(c, threads=max(1, (c.threads or get_num_threads()) // jobs)) for c in todo]
    ex = ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"))
    try:
        futures = {ex.submit(_train_in_worker, c): c for c in todo}
        with progress_bar(total=len(futures), progress=progress, desc=f"training runs ({jobs} at a time)",
                          unit="run") as bar:
            for f in as_completed(futures):
                bar.set_postfix_str(os.path.basename(f.result()))  # a worker's error is raised here
                if on_finished is not None:
                    on_finished(futures[f])
                bar.update()
    except KeyboardInterrupt:
        _stop_workers(ex)
        raise
    finally:  # after a worker's error, as without one, the runs under way finish first
        ex.shutdown(wait=True)


def run_all(configs: Sequence[TrainConfig], progress: bool = True, jobs: int = 1,
            on_finished: Optional[Callable[[TrainConfig], None]] = None) -> List[List[Dict[str, Any]]]:
    """Trains (or resumes, or skips when finished) every run; returns each run's log. ``jobs`` > 1
    trains that many runs at a time in separate processes, each run's threads (or the default)
    shared among them (on 2 cores two 1-thread runs give 1.6x the runs per hour of one 2-thread
    run); the logs are the same whatever ``jobs``, timing fields aside. ``on_finished(config)``
    is called as each run this call trains finishes (a campaign records it then, so that a
    campaign killed later loses none of it)."""
    if int(jobs) < 1:
        raise ValueError(f"jobs must be at least 1, got {jobs}")
    todo = [c for c in configs if _needs_training(c)]
    if int(jobs) > 1 and len(todo) > 1:
        _train_in_processes(todo, int(jobs), progress, on_finished)
    logs = []
    for cfg in configs:
        if _needs_training(cfg):
            logs.append(train(cfg, progress=progress).log)
            if on_finished is not None:
                on_finished(cfg)
        else:
            logs.append(read_log(cfg.out_dir))
    return logs


def _evaluated(log: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    return [r for r in log if r.get("val_loss_text") is not None]


def clean(x: Any) -> Any:
    """``x`` with every NaN/inf float replaced by None (JSON-safe, and equal to itself after a
    round trip through JSON), tuples as lists."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean(v) for v in x]
    return x


def seed_summary(values: Sequence[Optional[float]]) -> Optional[Dict[str, Any]]:
    """:func:`over_seeds` of one number per seed as a JSON-able dict (``mean``, ``sd``, ``n``,
    ``values``, ``interval``); None when a seed lacks the number."""
    present = [float(v) for v in values if v is not None]
    if not present or len(present) != len(values):
        return None
    return clean(over_seeds(present).to_dict())


def _mean_sd(series: Sequence[Sequence[Optional[float]]]) -> Tuple[List[Optional[float]], List[Optional[float]]]:
    """Per evaluation: mean and sample sd over seeds of lists of equal length (the same
    evaluation schedule); None where a seed lacks the number or (sd) with one seed."""
    n = min(len(s) for s in series)
    mean: List[Optional[float]] = []
    sd: List[Optional[float]] = []
    for i in range(n):
        col = [float(v) for v in (s[i] for s in series) if v is not None]
        if len(col) != len(series):
            mean.append(None)
            sd.append(None)
            continue
        ss = over_seeds(col)
        mean.append(ss.mean)
        sd.append(ss.sd if ss.n > 1 else None)
    return mean, sd


def _uniform(context: int) -> Tuple[int, float]:
    T = sink_T(context)
    return T, uniform_first_importance(T)


def _ratio(v: Optional[float], u: float) -> Optional[float]:
    return None if v is None else v / u


Log = List[Dict[str, Any]]


def _groups(configs: Sequence[TrainConfig], logs: Sequence[Log], key: Any) -> Dict[Any, List[Tuple[TrainConfig, Log]]]:
    """The (config, log) pairs of each condition ``key(config)``, by seed."""
    groups: Dict[Any, List[Tuple[TrainConfig, Log]]] = {}
    for cfg, log in zip(configs, logs):
        groups.setdefault(key(cfg), []).append((cfg, log))
    for k, g in groups.items():
        g.sort(key=lambda cl: cl[0].seed)
        seeds = [c.seed for c, _ in g]
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"condition {k}: seed given twice ({seeds})")
    return groups


FIG5_SERIES = (("sink_0.3", "sink_text_0.3"), ("sink_0.8", "sink_text_0.8"), ("importance", "importance_text"),
               ("val_loss", "val_loss_text"))
FIG5_DIFFERENCES = ("sink_0.3", "sink_0.8", "importance", "importance_over_uniform", "val_loss")


def common_target_losses(configs: Sequence[TrainConfig], n_tokens: int, progress: bool = False) -> Dict[str, float]:
    """Each finished run's validation loss (text only, nats) on the SAME targets whatever its
    context: the first ``n_tokens`` tokens of each of its ``eval_docs`` held-out documents
    (:func:`.records.common_loss`: from its last checkpoint, or from its record). A run's logged
    ``val_loss_text`` is scored on its own first C - 1 tokens, so logged losses of different
    contexts are not on the same targets. Keyed by ``out_dir``."""
    return {cfg.out_dir: records.common_loss(cfg, n_tokens, progress) for cfg in configs}


def fig5_summary(configs: Sequence[TrainConfig], logs: Sequence[List[Dict[str, Any]]],
                 common: Optional[Dict[str, float]] = None) -> Dict[str, Any]:
    """Per context, over its seeds: tokens seen and, at every evaluation, the mean (the fields
    ``sink_0.3``, ``sink_0.8`` (fractions), ``importance`` (mean a₀), ``val_loss`` (nats)), ``sd``
    and ``per_seed`` lists of each (text-only inference: these models never saw a ⟨bos⟩);
    ``final``: mean ± sd and t interval over seeds of each at the end of training, and of a₀ over
    the uniform-attention value (``importance_over_uniform``); ``peak_sink_0.3``/``0.8``: the
    largest sink rate at any evaluation of any seed. ``common`` (:func:`common_target_losses`,
    by ``out_dir``): adds ``val_loss_common``, the final loss on the targets every context shares.
    ``differences["longest_minus_shortest"]``: per seed s, the final value at the longest context
    minus at the shortest (seed s with seed s), over seeds."""
    out: Dict[str, Any] = {"runs": []}
    groups = _groups(configs, logs, lambda c: c.context)
    all_seeds: List[int] = []
    for C in sorted(groups):
        g = groups[C]
        evs = [_evaluated(log) for _, log in g]
        n = min(len(e) for e in evs)
        if n == 0:
            raise ValueError(f"context {C}: a run has no evaluation")
        evs = [e[:n] for e in evs]
        tokens = [r["tokens"] for r in evs[0]]
        T, u = _uniform(C)
        run: Dict[str, Any] = {"context": C, "out_dir": g[0][0].out_dir, "out_dirs": [c.out_dir for c, _ in g],
                               "seeds": [c.seed for c, _ in g], "tokens": tokens, "sink_tokens": T,
                               "uniform_importance": u}
        per_seed: Dict[str, List[List[Optional[float]]]] = {}
        sd: Dict[str, List[Optional[float]]] = {}
        for name, field in FIG5_SERIES:
            per_seed[name] = [[r.get(field) for r in e] for e in evs]
            run[name], sd[name] = _mean_sd(per_seed[name])
        run["sd"], run["per_seed"] = sd, per_seed
        final_vals = {name: [s[-1] for s in per_seed[name]] for name, _ in FIG5_SERIES}
        final_vals["importance_over_uniform"] = [_ratio(v, u) for v in final_vals["importance"]]
        if common is not None:
            final_vals["val_loss_common"] = [common.get(c.out_dir) for c, _ in g]
        run["final_per_seed"] = final_vals
        run["final"] = {k: seed_summary(v) for k, v in final_vals.items()}
        for e in EPS:
            vals = [v for s in per_seed[f"sink_{e:g}"] for v in s if v is not None]
            run[f"peak_sink_{e:g}"] = max(vals) if vals else None
        out["runs"].append(run)
        all_seeds += [s for s in run["seeds"] if s not in all_seeds]
    out["seeds"] = sorted(all_seeds)
    out["differences"] = {}
    if len(out["runs"]) >= 2:
        lo, hi = out["runs"][0], out["runs"][-1]
        paired = [s for s in lo["seeds"] if s in hi["seeds"]]
        d: Dict[str, Any] = {"contexts": [lo["context"], hi["context"]], "seeds": paired}
        for k in FIG5_DIFFERENCES + (("val_loss_common",) if common is not None else ()):
            a = {s: v for s, v in zip(lo["seeds"], lo["final_per_seed"][k])}
            b = {s: v for s, v in zip(hi["seeds"], hi["final_per_seed"][k])}
            diffs = [None if a[s] is None or b[s] is None else b[s] - a[s] for s in paired]
            d[f"{k}_per_seed"] = diffs
            d[k] = seed_summary(diffs)
        out["differences"]["longest_minus_shortest"] = d
    return clean(out)


TABLE2_FIELDS = ("sink_0.3", "sink_0.8", "importance", "val_loss")


def table2_summary(configs: Sequence[TrainConfig], logs: Sequence[List[Dict[str, Any]]]) -> Dict[str, Any]:
    """Rows in the paper's layout: (masking, fixed ⟨bos⟩, inference) with our sink rate (%),
    mean a₀ and validation loss (nats) at the end of training, the mean over seeds, the paper's
    beside them; per row ``per_seed`` lists, ``sd`` and ``summary`` (mean ± sd and t interval of
    each, and of a₀ over the uniform-attention value). ``models``: per training condition, the
    paired per-seed change when ⟨bos⟩ is removed at inference (text only minus ⟨bos⟩+text, the
    same model and seed) of the loss, the sink rates (percentage points) and a₀, and
    ``peak_sink_0.3``/``0.8``: the largest final sink rate of any seed in either mode (%)."""
    groups = _groups(configs, logs, lambda c: (c.masking, c.fixed_bos))
    final = {k: [(c, _evaluated(l)[-1]) for c, l in g] for k, g in groups.items()}
    rows = []
    for masking, bos, mode, p_sink, p_loss in PAPER_TABLE2:
        g = final.get((masking, bos))
        if g is None:
            continue
        T, u = _uniform(g[0][0].context)
        per = {"sink_0.3": [100 * r[f"sink_{mode}_0.3"] for _, r in g],
               "sink_0.8": [100 * r[f"sink_{mode}_0.8"] for _, r in g],
               "importance": [r.get(f"importance_{mode}") for _, r in g],
               "val_loss": [r[f"val_loss_{mode}"] for _, r in g],
               "val_loss_train": [r["val_loss_train"] for _, r in g]}
        per["importance_over_uniform"] = [_ratio(v, u) for v in per["importance"]]
        summ = {k: seed_summary(v) for k, v in per.items()}
        row = {"masking": masking, "fixed_bos": bos, "inference": mode}
        for k in ("sink_0.3", "sink_0.8", "importance", "val_loss", "val_loss_train"):
            sk = summ[k]
            row[k] = None if sk is None else sk["mean"]
        row.update({"paper_sink": p_sink, "paper_loss": p_loss, "seeds": [c.seed for c, _ in g],
                    "out_dirs": [c.out_dir for c, _ in g], "sink_tokens": T, "uniform_importance": u,
                    "per_seed": per, "sd": {k: (None if v is None else v["sd"]) for k, v in summ.items()},
                    "summary": summ})
        rows.append(row)
    models = []
    for masking, bos in TABLE2_RUNS:
        g = final.get((masking, bos))
        if g is None:
            continue
        rem: Dict[str, Any] = {}
        for k, f, scale in (("val_loss", "val_loss", 1.0), ("sink_0.3", "sink", 100.0), ("sink_0.8", "sink", 100.0),
                            ("importance", "importance", 1.0)):
            if f == "sink":
                e = k.split("_")[1]
                vals = [scale * (r[f"sink_text_{e}"] - r[f"sink_bos_{e}"]) for _, r in g]
            else:
                vals = [None if r.get(f"{f}_text") is None or r.get(f"{f}_bos") is None
                        else r[f"{f}_text"] - r[f"{f}_bos"] for _, r in g]
            rem[f"{k}_per_seed"] = vals
            rem[k] = seed_summary(vals)
        m: Dict[str, Any] = {"masking": masking, "fixed_bos": bos, "seeds": [c.seed for c, _ in g],
                             "out_dirs": [c.out_dir for c, _ in g],
                             "in_paper_both_ways": any(t[:2] == (masking, bos) and t[2] == "bos"
                                                       for t in PAPER_TABLE2),
                             "bos_removed": rem}
        for eps in EPS:
            m[f"peak_sink_{eps:g}"] = max(100 * max(r[f"sink_bos_{eps:g}"], r[f"sink_text_{eps:g}"]) for _, r in g)
        models.append(m)
    seeds = sorted({c.seed for g in final.values() for c, _ in g})
    return clean({"rows": rows, "models": models, "seeds": seeds,
                  "tokens": {f"{m}{'+bos' if b else ''}": g[0][1]["tokens"] for (m, b), g in final.items()}})


def _pm(summ: Optional[Dict[str, Any]], spec: str) -> str:
    if summ is None:
        return "–"
    if summ.get("n", 1) > 1 and summ.get("sd") is not None:
        return f"{format(summ['mean'], spec)} ± {format(summ['sd'], spec)}"
    return format(summ["mean"], spec)


def table2_markdown(summary: Dict[str, Any]) -> str:
    """The table in the paper's layout, ours (mean ± sd over seeds) beside the paper's."""
    lines = ["| masking | fixed ⟨bos⟩ in training | inference | sink % (ε 0.3) | sink % (ε 0.8) | mean a₀ "
             "| val loss | paper sink % | paper val loss |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in summary["rows"]:
        s = r.get("summary")
        if s is None:      # a summary written before seeds were added
            s = {k: (None if r.get(k) is None else {"mean": r[k], "n": 1}) for k in TABLE2_FIELDS}
        lines.append(f"| {r['masking'].replace('_', '-')} | {'yes' if r['fixed_bos'] else 'no'} | "
                     f"{'⟨bos⟩+text' if r['inference'] == 'bos' else 'text only'} | {_pm(s['sink_0.3'], '.2f')} | "
                     f"{_pm(s['sink_0.8'], '.2f')} | {_pm(s['importance'], '.3f')} | {_pm(s['val_loss'], '.3f')} | "
                     f"{r['paper_sink']:.2f} | {r['paper_loss']:.2f} |")
    return "\n".join(lines)


def table2_differences_markdown(summary: Dict[str, Any]) -> str:
    """Per training condition: the paired change when ⟨bos⟩ is removed at inference (text only
    minus ⟨bos⟩+text, per seed on the same model), mean ± sd and the t interval over seeds."""
    def cell(s: Optional[Dict[str, Any]], spec: str) -> str:
        if s is None:
            return "–"
        iv = s.get("interval") or {}
        ci = (f" [{format(iv['lo'], '+' + spec)}, {format(iv['hi'], '+' + spec)}]"
              if iv.get("lo") is not None and iv.get("hi") is not None else "")
        sd = f" ± {format(s['sd'], spec)}" if s.get("sd") is not None else ""
        return f"{format(s['mean'], '+' + spec)}{sd}{ci}"

    lines = ["| masking | fixed ⟨bos⟩ in training | seeds | Δ val loss (nats) | Δ sink % (ε 0.3) | Δ sink % (ε 0.8) "
             "| Δ mean a₀ |", "|---|---|---|---|---|---|---|"]
    for m in summary.get("models", []):
        r = m["bos_removed"]
        lines.append(f"| {m['masking'].replace('_', '-')} | {'yes' if m['fixed_bos'] else 'no'} | {len(m['seeds'])} | "
                     f"{cell(r['val_loss'], '.3f')} | {cell(r['sink_0.3'], '.2f')} | {cell(r['sink_0.8'], '.2f')} | "
                     f"{cell(r['importance'], '.4f')} |")
    return "\n".join(lines)


def fig5_figure(summary: Dict[str, Any], path: str) -> str:
    """Sink rates, mean first-token importance and validation loss against tokens seen, one
    line per context, mean ± sd over seeds (:func:`sinklab.viz.figures_training.fig5_miniature_figure`),
    saved to ``path``."""
    from ..viz.figures_training import fig5_miniature_figure  # matplotlib, only to draw

    return save_figure(fig5_miniature_figure(summary), path)


def table2_figure(summary: Dict[str, Any], path: str) -> str:
    """Table 2 in miniature beside the paper's, mean ± sd over seeds
    (:func:`sinklab.viz.figures_training.table2_miniature_figure`), saved to ``path``."""
    from ..viz.figures_training import table2_miniature_figure  # matplotlib, only to draw

    return save_figure(table2_miniature_figure(summary), path)


def run_experiment(name: str, profile_name: str = "cpu", root: str = "sinklab-experiments",
                   out: Optional[str] = None, progress: bool = True, threads: Optional[int] = None,
                   seeds: Union[None, int, Sequence[int]] = None, adopt: Sequence[str] = (),
                   records_dir: Optional[str] = None, jobs: int = 1, train_missing: bool = True) -> Dict[str, Any]:
    """Runs (or resumes) experiment ``"fig5"`` or ``"table2"`` with every seed (``seeds``: None
    for the profile's 3, a number, or a list) and writes its summary JSON (and the figure, and
    for Table 2 the Markdown table) into ``out`` (default ``root``), with the criterion's
    verdict (``verdict``) and the reading (``reading``) of :mod:`.criteria`. ``adopt``: folders
    of finished runs with the same settings (:func:`adopt_runs`) copied in before training.
    ``records_dir``: a folder of run records (:mod:`.records`; commit it to keep finished runs
    across machines): adopted from before training, and every finished run's record written into
    it afterwards, with its loss on the targets Fig. 5's contexts share. ``jobs``: runs trained at a
    time, in separate processes (:func:`run_all`). ``train_missing=False``: train nothing and
    summarize the runs already finished (a partial experiment: ``complete`` is False,
    ``missing_runs`` names the others and the reading starts by saying so). Returns the summary."""
    if name not in ("fig5", "table2"):
        raise ValueError(f"unknown experiment {name!r}: fig5 or table2")
    make = fig5_configs if name == "fig5" else table2_configs
    configs = make(profile_name, root=root, threads=threads, seeds=seeds)
    wanted = configs
    configs, logs = run_with_records(configs, root, adopt, records_dir, common_tokens(profile_name), progress, jobs,
                                     train_missing)
    out = out or root
    os.makedirs(out, exist_ok=True)
    if name == "fig5":  # losses compared on the targets every context shares: the shortest's
        n_common = min(c.context for c in wanted) - 1   # the whole experiment's, also when partial
        summary = fig5_summary(configs, logs, common=common_target_losses(configs, n_common))
        summary["common_target_tokens"] = n_common
    else:
        summary = table2_summary(configs, logs)
    p = profile(profile_name)
    summary["profile"] = {"name": profile_name, **{k: (list(v) if isinstance(v, tuple) else v) for k, v in p.items()}}
    summary["profile"]["seeds"] = len(summary["seeds"])
    if name == "fig5":
        summary["figure"] = fig5_figure(summary, os.path.join(out, f"fig5-{profile_name}.png"))
        text, _, verdict = criteria.fig5_reading(summary)
    else:
        summary["markdown"] = table2_markdown(summary)
        summary["differences_markdown"] = table2_differences_markdown(summary)
        summary["figure"] = table2_figure(summary, os.path.join(out, f"table2-{profile_name}.png"))
        text, _, verdict = criteria.table2_reading(summary)
    summary["verdict"] = clean(verdict.to_dict())
    return finish_summary(summary, wanted, configs, text, os.path.join(out, f"{name}-{profile_name}.json"))
