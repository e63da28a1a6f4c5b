"""Every pre-training experiment of a profile as one queue of runs (``sinklab experiment all``).

Table 2, Fig. 5, the depth sweep and the attention variants share runs (the fixed-⟨bos⟩ causal
run at Table 2's context is Table 2's row, the depth sweep's reference depth and the variants'
softmax; Fig. 5's run at that context is Table 2's causal run without one). Trained one experiment
after another, each experiment's last runs leave cores idle and a session ends between
experiments; as one queue, each distinct run is trained once, in priority order (Table 2 first:
its targets are the issue's), ``jobs`` at a time, and every finished run is recorded, so that a
session of any length advances the whole campaign and the next session resumes it. Afterwards each
experiment's summary (complete or partial) is written from the finished runs, as
``sinklab experiment NAME --no-train`` writes it."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from . import depth as D
from . import experiments as X
from . import variants as V
from .run import TrainConfig

EXPERIMENTS = ("table2", "fig5", "depth", "variants")   # the queue's priority order


def campaign_configs(profile_name: str, root: str = "sinklab-experiments",
                     seeds: Union[None, int, Sequence[int]] = None, threads: Optional[int] = None
                     ) -> Tuple[List[TrainConfig], Dict[str, List[TrainConfig]]]:
    """(the queue: every distinct run, in priority order, {experiment: its runs}). The depth sweep
    is left out of profiles that have none."""
    per: Dict[str, List[TrainConfig]] = {
        "table2": X.table2_configs(profile_name, root=root, seeds=seeds, threads=threads),
        "fig5": X.fig5_configs(profile_name, root=root, seeds=seeds, threads=threads)}
    if "depths" in X.profile(profile_name):
        per["depth"] = D.depth_configs(profile_name, root=root, seeds=seeds, threads=threads)
    per["variants"] = V.variant_configs(profile_name, root=root, seeds=seeds, threads=threads)
    queue = list({c.out_dir: c for name in EXPERIMENTS for c in per.get(name, [])}.values())
    return queue, per


def run_campaign(profile_name: str = "miniature", root: str = "sinklab-experiments", out: Optional[str] = None,
                 progress: bool = True, threads: Optional[int] = None, seeds: Union[None, int, Sequence[int]] = None,
                 adopt: Sequence[str] = (), records_dir: Optional[str] = None, jobs: int = 1,
                 train_missing: bool = True) -> Dict[str, Any]:
    """Trains (or resumes, or adopts from ``adopt`` and ``records_dir``) every run of the queue
    (:func:`campaign_configs`), ``jobs`` at a time, recording each finished run in
    ``records_dir``; then writes each experiment's summary into ``out`` (default ``root``) from
    the finished runs. ``train_missing=False`` trains nothing. Returns ``{"runs", "finished",
    "summaries": {experiment: summary}}``; an experiment none of whose runs has finished has no
    summary (it is named in ``"not_started"``)."""
    queue, per = campaign_configs(profile_name, root=root, seeds=seeds, threads=threads)
    try:
        done, _ = X.run_with_records(queue, root, adopt, records_dir, X.common_tokens(profile_name), progress, jobs,
                                     train_missing)
    except ValueError:                      # nothing finished yet, and nothing to train
        if train_missing:                   # any other ValueError is the caller's to see
            raise
        done = []
    kw: Dict[str, Any] = dict(root=root, out=out, progress=progress, threads=threads, seeds=seeds, train_missing=False)
    summaries: Dict[str, Any] = {}
    finished = {c.out_dir for c in done}
    for name in per:
        if not any(c.out_dir in finished for c in per[name]):
            continue
        if name == "depth":
            summaries[name] = D.run_depth(profile_name, **kw)
        elif name == "variants":
            summaries[name] = V.run_variants(profile_name, **kw)
        else:
            summaries[name] = X.run_experiment(name, profile_name, **kw)
    return {"runs": len(queue), "finished": len(done), "summaries": summaries,
            "not_started": [n for n in per if n not in summaries]}
