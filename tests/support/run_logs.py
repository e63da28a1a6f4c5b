"""Independent readers for the training experiments' tests: a run's log.jsonl parsed here (not
with sinklab.train.run.read_log) and the 95 % t interval over seeds computed with scipy (not with
sinklab.train.criteria)."""

import json
import math
from pathlib import Path

import numpy as np


def read_log(folder):
    """The records of ``folder/log.jsonl``, one dict per line."""
    with open(Path(folder) / "log.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def t_interval(v):
    """Mean and 95 % t interval (low, high) of per-seed values."""
    from scipy import stats

    v = np.asarray(v, float)
    h = stats.t.ppf(0.975, v.size - 1) * v.std(ddof=1) / math.sqrt(v.size)
    return v.mean(), v.mean() - h, v.mean() + h
