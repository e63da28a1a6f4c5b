"""Run records: what a finished training run leaves for the experiments' summaries, small enough
to commit (a few kB instead of a checkpoint's megabytes).

A miniature experiment is tens of runs of half an hour each: more than one working session or one
machine, and the machines it runs on may not keep their disks. A *record* keeps what the summaries
of :mod:`.experiments` and :mod:`.depth` read from a finished run, so that finished runs survive
and are never trained twice:

* ``log.jsonl``: the run's log, verbatim (every evaluation: sink rates, a₀, validation losses
  with and without ⟨bos⟩; :data:`.run.LOG_FIELDS`);
* ``record.json``: the run's settings (its ``run_config``), the step and tokens it ended at, its
  wall time, the machine it ran on (CPU model, threads), the sha256 of its final weights (so a
  record names the checkpoint it came from), and ``common_losses``: the text-only validation
  loss (nats) on the first n tokens of each held-out document for each n asked for (Fig. 5
  compares contexts on the targets they share, :func:`.experiments.common_target_losses`; those
  need the weights, which a record does not keep).

An experiment run with ``records=DIR`` (``sinklab experiment ... --records DIR``) first fills
each run folder that has no run from a record in DIR with the same settings (the folder then
holds the log and the record, no checkpoint, and counts as finished), trains the rest, and
writes a record of every finished run into DIR.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
from typing import Any, Dict, List, Optional, Sequence

from ..analysis.quality import perplexity
from ..runtime import cpu_name
from . import checkpoint
from .corpus import corpus_for, corpus_key
from .evaluate import eval_documents
from .run import LOG_FILE, TrainConfig, read_log

RECORD_FILE = "record.json"
RECORD_FORMAT = "sinklab-run-record"
RECORD_VERSION = 1


def finished_config(run_dir: str) -> Optional[TrainConfig]:
    """The config of the finished training run in ``run_dir`` (its last checkpoint at the last
    step, and its log), else None."""
    try:
        folder = checkpoint.latest_checkpoint(run_dir)
        if folder is None or not os.path.isfile(os.path.join(run_dir, LOG_FILE)):
            return None
        st = checkpoint.read_state(folder)
        cfg = TrainConfig.from_dict(st["run_config"])
    except (checkpoint.CheckpointError, KeyError, ValueError):  # not a run, or not one of this version
        return None
    return cfg if int(st.get("step", -1)) == cfg.n_steps else None


def read_record(folder: str) -> Optional[Dict[str, Any]]:
    """The record in ``folder`` (its ``record.json``, with ``config``: the :class:`TrainConfig`),
    when it is a complete record of this version whose log reaches its last step; else None."""
    path = os.path.join(folder, RECORD_FILE)
    if not os.path.isfile(path) or not os.path.isfile(os.path.join(folder, LOG_FILE)):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            rec = json.load(f)
        if not isinstance(rec, dict) or rec.get("format") != RECORD_FORMAT or rec.get("version") != RECORD_VERSION:
            return None
        cfg = TrainConfig.from_dict(rec["run_config"])
        log = read_log(folder)
    except (ValueError, KeyError, TypeError, RecursionError):
        return None
    if not log or int(log[-1].get("step", -1)) != cfg.n_steps:
        return None
    return {**rec, "config": cfg}


_CORPORA: Dict[Any, Any] = {}  # prepared corpora by (root, vocab size), loaded once per process


def checkpoint_common_loss(cfg: TrainConfig, n_tokens: int, progress: bool = False) -> float:
    """Text-only validation loss (nats) of the finished run of ``cfg`` (its last checkpoint in
    ``cfg.out_dir``) on the first ``n_tokens`` tokens of each of its ``eval_docs`` held-out
    documents: the targets x[1:n_tokens], as :mod:`.evaluate` scores a model of context
    n_tokens + 1."""
    folder = checkpoint.latest_checkpoint(cfg.out_dir)
    if folder is None:
        raise ValueError(f"{cfg.out_dir} has no checkpoint to evaluate")
    key = corpus_key(cfg)
    if key not in _CORPORA:
        _CORPORA[key] = corpus_for(cfg, quiet=not progress)
    model = checkpoint.trainer_from_checkpoint(checkpoint.load_checkpoint(folder)).model
    docs = eval_documents(_CORPORA[key].heldout_documents(), cfg.eval_docs)
    return float(perplexity(model, list(docs), bos=False, max_tokens=int(n_tokens), progress=False).mean_nll)


def common_loss(cfg: TrainConfig, n_tokens: int, progress: bool = False) -> float:
    """:func:`checkpoint_common_loss` from the run's record when it holds that n (a folder filled
    from a record has no checkpoint), else from its checkpoint. Raises ValueError when neither
    can give it."""
    rec = read_record(cfg.out_dir)
    got = (rec or {}).get("common_losses", {}).get(str(int(n_tokens)))
    if got is not None:
        return float(got)
    if checkpoint.latest_checkpoint(cfg.out_dir) is None and rec is not None:
        raise ValueError(f"{cfg.out_dir}: filled from a record without the loss on the first {n_tokens} "
                         "tokens, and no checkpoint to compute it from")
    return checkpoint_common_loss(cfg, n_tokens, progress)


def write_record(run_dir: str, dest_root: str, common_tokens: Sequence[int] = ()) -> str:
    """Writes the record of the finished run in ``run_dir`` to ``dest_root/<its folder name>``
    (replacing an older record of the same run, and keeping the ``common_losses`` it had), with
    the losses on the first n tokens for each n of ``common_tokens``. Returns the record's folder.
    Raises ValueError when ``run_dir`` holds no finished run (nor a record of one)."""
    cfg = finished_config(run_dir)
    old = read_record(run_dir)
    if cfg is None and old is None:
        raise ValueError(f"{run_dir} holds no finished training run")
    dest = os.path.join(dest_root, os.path.basename(os.path.normpath(run_dir)))
    prev = read_record(dest) if os.path.isdir(dest) else None
    keep = {**((prev or {}).get("common_losses") or {}), **((old or {}).get("common_losses") or {})}
    losses = dict(keep)
    for n in common_tokens:
        if str(int(n)) not in losses:
            if cfg is None:
                raise ValueError(f"{run_dir}: no checkpoint, and its record has no loss on the first {n} tokens")
            losses[str(int(n))] = checkpoint_common_loss(dataclasses.replace(cfg, out_dir=run_dir), int(n))
    if cfg is not None:
        folder = checkpoint.latest_checkpoint(run_dir)
        assert folder is not None  # finished_config found it
        st = checkpoint.read_state(folder)
        weights = {k: v["sha256"] for k, v in st["files"].items() if k.endswith(".safetensors")}
        if prev is not None and prev.get("weights_sha256") == weights:  # the same run: keep where it ran
            rec: Dict[str, Any] = {k: v for k, v in prev.items() if k != "config"}
        else:
            rec = {"format": RECORD_FORMAT, "version": RECORD_VERSION,
                   "run_config": {**cfg.to_dict(), "out_dir": os.path.basename(dest)},
                   "step": int(st["step"]), "tokens": int(read_log(run_dir)[-1]["tokens"]),
                   "wall_s": float(st.get("wall_s") or 0.0), "cpu": cpu_name(),
                   "threads": cfg.threads, "weights_sha256": weights}
    else:
        rec = {k: v for k, v in old.items() if k != "config"}  # type: ignore[union-attr]
    rec["common_losses"] = losses
    tmp = f"{dest}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    shutil.copyfile(os.path.join(run_dir, LOG_FILE), os.path.join(tmp, LOG_FILE))
    with open(os.path.join(tmp, RECORD_FILE), "w", encoding="utf-8") as f:
        json.dump(rec, f, indent=1, sort_keys=True)
    if os.path.isdir(dest):
        shutil.rmtree(dest)
    os.replace(tmp, dest)
    return dest


def write_records(configs: Sequence[TrainConfig], dest_root: str, common_tokens: Sequence[int] = ()) -> List[str]:
    """:func:`write_record` for every config whose run has finished; returns the folders written."""
    os.makedirs(dest_root, exist_ok=True)
    return [write_record(c.out_dir, dest_root, common_tokens) for c in configs
            if finished_config(c.out_dir) is not None or read_record(c.out_dir) is not None]
