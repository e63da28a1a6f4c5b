"""A sweep's grid: the spec (TOML, JSON or a dict), its axes, and the tasks they expand into.

A spec names values for any of the axes below; the Cartesian product of the ones an analysis
reads becomes one task each (an axis the spec leaves out takes its default):

=============  ==========================================  ===================================
axis           values                                      default
=============  ==========================================  ===================================
analysis       sink_study, perturbation, sensitivity,      sink_study
               quality, train, or a user function
               ``"package.module:function"``
               (:mod:`sinklab.sweeps.user`)
model          a registered name, a ``.gguf`` file or a    smollm2-135m-instruct
               Hugging Face folder
prompts        a shipped split (``sinks``, ``heldout``,    sinks
               ``all``) or a text file, one prompt a line
bos            true / false: a ⟨bos⟩ token in front        [true, false]
eps            sink threshold(s) in (0, 1)                 [0.3]
T              tokens per sequence                         [64]
intervention   ``none``, or ``KIND[@LAYERS]`` with KIND    none
               ``mask_first``, ``zero_first_value``,
               ``zero_first_value_all`` and LAYERS like
               ``0-2`` or ``0,3,5`` (all heads of those
               layers; every layer without ``@``)
train          training runs: tables of TrainConfig        one run of ``[settings.train]``
               fields (``context``, ``masking``, ...)
precision      the forward's weight products: ``fp32``     fp32
               (exact), ``bf16`` or ``int8``
=============  ==========================================  ===================================

An analysis reads only some axes (:data:`ANALYSIS_AXES`); the values of the others do not make
more tasks for it. ``eps`` and, for ``perturbation`` and ``train``, ``bos`` are *row* axes: one
task measures once and gives a row per value (a threshold or a setting read off the same
forward passes), so the table still has one row per grid point. Grid points an analysis cannot
take (an intervention for ``perturbation``) are listed by :meth:`Plan.not_applicable`, never
dropped silently. ``precision`` is read by the forward-only analyses (``sensitivity`` differentiates
and ``train`` trains in fp32); an fp32 task's key leaves it out, so a store written before the axis
existed still holds its fp32 results.

``[settings.ANALYSIS]`` tables fix keyword arguments of one analysis (``n_prompts`` for every
prompt-set analysis; :data:`SETTINGS_KEYS` lists the rest, and a user analysis takes any
JSON-able keys); they are part of every task key. A user analysis reads the axes of
``sink_study``; its task key also holds the sha256 of the function's source.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import os
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..interventions import Intervention
from ..io import registry
from ..prompts import SPLITS, load_passages
from . import user

ANALYSES = ("sink_study", "sink_location", "long_context", "perturbation", "sensitivity", "quality", "train")

# per analysis: (task axes, row axes). A task is one value of every task axis; its rows span
# the row axes.
ANALYSIS_AXES: Dict[str, Tuple[Tuple[str, ...], Tuple[str, ...]]] = {
    "sink_study": (("model", "prompts", "bos", "T", "intervention", "precision"), ("eps",)),
    "sink_location": (("model", "prompts", "bos", "T", "intervention", "precision"), ("eps",)),
    "long_context": (("model", "prompts", "bos", "T", "intervention", "precision"), ("eps",)),
    "perturbation": (("model", "prompts", "T", "precision"), ("bos",)),
    "sensitivity": (("model", "prompts", "bos", "T", "intervention"), ()),
    "quality": (("model", "prompts", "bos", "T", "intervention", "precision"), ()),
    "train": (("train",), ("bos", "eps")),
}

AXES = ("analysis", "model", "prompts", "bos", "eps", "T", "intervention", "train", "precision")
DEFAULTS: Dict[str, List[Any]] = {
    "analysis": ["sink_study"], "model": ["smollm2-135m-instruct"], "prompts": ["sinks"],
    "bos": [True, False], "eps": [0.3], "T": [64], "intervention": ["none"], "train": [{}], "precision": ["fp32"],
}
PRECISIONS = ("fp32", "bf16", "int8")

SETTINGS_KEYS: Dict[str, Tuple[str, ...]] = {
    "sink_study": ("n_prompts", "capture", "bos_in_T"),
    "sink_location": ("n_prompts", "mass", "min_queries"),
    "long_context": ("n_windows",),
    "perturbation": ("n_prompts", "swaps_per_passage", "seed", "min_after"),
    "sensitivity": ("n_prompts", "method", "n_probes", "seed", "target"),
    "quality": ("n_prompts",),
    "train": ("profile",) + ("corpus_root", "vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads",
                             "d_ff", "context", "masking", "fixed_bos", "tokens_per_step", "total_tokens",
                             "steps", "lr", "min_lr", "warmup_steps", "seed", "eval_every", "eval_docs",
                             "eval_windows", "grad_clip", "weight_decay", "init_std", "rope_theta",
                             "attention", "precision"),
}

INTERVENTION_KINDS = ("mask_first", "zero_first_value", "zero_first_value_all")
FORMAT = "sinklab.sweeps/1"


class SpecError(ValueError):
    """A sweep spec that names an unknown axis, analysis, setting or value."""


# ------------------------------------------------------------------ reading a spec
def read_spec(path: str) -> Dict[str, Any]:
    """The spec in a ``.toml`` or ``.json`` file, as a dict (see the module docstring)."""
    with open(path, "rb") as f:
        raw = f.read()
    if path.endswith(".json"):
        try:
            return json.loads(raw.decode("utf-8"))
        except ValueError as e:
            raise SpecError(f"{path}: not valid JSON ({e})") from None
    try:
        import tomllib
    except ImportError:                          # Python < 3.11
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"{path}: not valid TOML ({e})") from None


def _as_list(name: str, v: Any) -> List[Any]:
    vals = list(v) if isinstance(v, (list, tuple)) else [v]
    if not vals:
        raise SpecError(f"axis {name!r} has no values")
    return vals


def analysis_axes(analysis: str) -> Tuple[Tuple[str, ...], Tuple[str, ...]]:
    """(task axes, row axes) of a built-in or user analysis."""
    return user.USER_AXES if user.is_user_analysis(analysis) else ANALYSIS_AXES[analysis]


def _check_analysis(v: Any) -> None:
    if user.is_user_analysis(v):
        try:
            user.source_sha256(v)                 # importable, callable, with readable source
        except ValueError as e:
            raise SpecError(str(e)) from None
    elif v not in ANALYSES:
        raise SpecError(f"unknown analysis {v!r}; choose from {', '.join(ANALYSES)}, or name a function "
                        "'package.module:function'")


def _check_value(axis: str, v: Any) -> Any:
    if axis == "analysis":
        _check_analysis(v)
    elif axis == "bos":
        if not isinstance(v, bool):
            raise SpecError(f"bos values are true/false, got {v!r}")
    elif axis == "eps":
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < float(v) < 1:
            raise SpecError(f"eps values lie in (0, 1), got {v!r}")
        return float(v)
    elif axis == "T":
        if isinstance(v, bool) or not isinstance(v, int) or v < 2:
            raise SpecError(f"T values are integers >= 2, got {v!r}")
    elif axis == "intervention":
        intervention_layers(v, None)
    elif axis == "precision":
        if v not in PRECISIONS:
            raise SpecError(f"precision values are {', '.join(PRECISIONS)}, got {v!r}")
    elif axis in ("model", "prompts"):
        if not isinstance(v, str) or not v:
            raise SpecError(f"{axis} values are names or paths (strings), got {v!r}")
    elif axis == "train":
        if not isinstance(v, Mapping):
            raise SpecError(f"train values are tables of TrainConfig fields, got {v!r}")
        bad = sorted(set(v) - set(SETTINGS_KEYS["train"]))
        if bad:
            raise SpecError(f"train run sets {bad}; allowed: {', '.join(SETTINGS_KEYS['train'])}")
        return dict(v)
    return v


def intervention_layers(name: str, n_layers: Optional[int]) -> Tuple[str, Optional[List[int]]]:
    """``(kind, layers)`` of an intervention name (``"none"``: ``("none", None)``); ``layers``
    None means every layer. With ``n_layers`` the layers are checked against the model."""
    if not isinstance(name, str):
        raise SpecError(f"intervention names are strings, got {name!r}")
    if name == "none":
        return "none", None
    kind, _, layers = name.partition("@")
    if kind not in INTERVENTION_KINDS:
        raise SpecError(f"unknown intervention {kind!r} in {name!r}; choose from none, "
                        f"{', '.join(INTERVENTION_KINDS)} (optionally @LAYERS, e.g. mask_first@0-2)")
    if not layers:
        return kind, None
    out: List[int] = []
    try:
        for part in layers.split(","):
            lo, _, hi = part.partition("-")
            out.extend(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise SpecError(f"intervention {name!r}: layers are like 0-2 or 0,3,5") from None
    if not out or min(out) < 0 or (n_layers is not None and max(out) >= n_layers):
        raise SpecError(f"intervention {name!r}: layers outside 0..{'L-1' if n_layers is None else n_layers - 1}")
    return kind, sorted(set(out))


def make_intervention(name: str, n_layers: int, n_heads: int) -> Any:
    """The :class:`sinklab.Intervention` an intervention name stands for (None for ``"none"``)."""
    kind, layers = intervention_layers(name, n_layers)
    if kind == "none":
        return None
    heads = np.zeros((n_layers, n_heads), bool)
    heads[layers if layers is not None else slice(None)] = True
    if kind == "mask_first":
        return Intervention(mask_first=heads)
    return Intervention(zero_first_value=heads, zero_first_value_scope="all" if kind.endswith("_all") else "others")


# ------------------------------------------------------------------ the grid
@dataclass
class Grid:
    """The axes' values and each analysis's fixed settings, checked."""

    axes: Dict[str, List[Any]]
    settings: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    explicit: set = field(default_factory=set)       # the axes the spec named

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> "Grid":
        """Checks a spec dict (axes, ``settings``, and ``out`` / ``scheduler`` / ``workers``
        / ``threads``, which :func:`sinklab.sweeps.sweep` reads) and fills in defaults."""
        known = set(AXES) | {"settings", "out", "scheduler", "workers", "threads"}
        bad = sorted(set(spec) - known)
        if bad:
            raise SpecError(f"unknown key(s) {bad} in the sweep spec; axes are {', '.join(AXES)}; "
                            f"other keys: settings, out, scheduler, workers, threads")
        axes = {}
        for a in AXES:
            vals = [_check_value(a, v) for v in _as_list(a, spec.get(a, DEFAULTS[a]))]
            uniq: List[Any] = []
            for v in vals:
                if v not in uniq:
                    uniq.append(v)
            axes[a] = uniq
        settings = {k: dict(v) for k, v in (spec.get("settings") or {}).items()}
        for k, v in settings.items():
            if user.is_user_analysis(k):
                _check_analysis(k)
                continue
            if k not in ANALYSES:
                raise SpecError(f"settings for unknown analysis {k!r}; choose from {', '.join(ANALYSES)}")
            bad = sorted(set(v) - set(SETTINGS_KEYS[k]))
            if bad:
                raise SpecError(f"settings.{k} has unknown key(s) {bad}; allowed: {', '.join(SETTINGS_KEYS[k])}")
        return cls(axes, settings, {a for a in AXES if a in spec})

    def tasks(self) -> List["Task"]:
        """One :class:`Task` per analysis and combination of the axes it reads, in spec order."""
        out: List[Task] = []
        for analysis in self.axes["analysis"]:
            task_axes, row_axes = analysis_axes(analysis)
            for combo in itertools.product(*(self.axes[a] for a in task_axes)):
                point = dict(zip(task_axes, combo))
                if analysis == "perturbation":
                    point["intervention"] = "none"
                rows = [dict(zip(row_axes, r)) for r in itertools.product(*(self.axes[a] for a in row_axes))]
                out.append(Task(analysis, point, rows, dict(self.settings.get(analysis, {}))))
        return out

    def not_applicable(self) -> List[str]:
        """Axes the spec set that some analysis does not read (or cannot take), one line each."""
        notes = []
        for analysis in self.axes["analysis"]:
            task_axes, row_axes = analysis_axes(analysis)
            for a in sorted(self.explicit - set(task_axes) - set(row_axes) - {"analysis"}):
                if analysis == "perturbation" and a == "intervention":
                    notes.append("perturbation takes no intervention: it runs with intervention=none only")
                else:
                    notes.append(f"{analysis} does not read the axis {a!r}; its values do not change it")
        return notes


@dataclass
class Task:
    """One unit of work: an analysis at one value of each axis it reads.

    Attributes:
        analysis: the analysis name. point: {axis: value} of its task axes.
        rows: one {row axis: value} per row it reports (``[{}]`` when it has no row axes).
        settings: the analysis's fixed keyword settings.
        key: the content address, set by :meth:`address` (sha256 hex).
    """

    analysis: str
    point: Dict[str, Any]
    rows: List[Dict[str, Any]]
    settings: Dict[str, Any]
    key: str = ""
    identity: Dict[str, Any] = field(default_factory=dict)

    def address(self, model_sha256: Optional[str], prompts_sha256: Optional[str], version: str) -> "Task":
        """Sets ``key``: the sha256 of what determines the result (the analysis, its axes, rows
        and settings, the model's and prompt set's sha256, sinklab's version and the result
        format), so equal work has one name whatever the grid it came from."""
        point = {k: v for k, v in self.point.items() if not (k == "precision" and v == "fp32")}  # keys as before the axis
        self.identity = {"format": FORMAT, "analysis": self.analysis, "point": point, "rows": self.rows,
                         "settings": self.settings, "model_sha256": model_sha256,
                         "prompts_sha256": prompts_sha256, "sinklab": version}
        if user.is_user_analysis(self.analysis):     # editing the function gives new keys
            self.identity["user_source_sha256"] = user.source_sha256(self.analysis)
        text = json.dumps(self.identity, sort_keys=True, separators=(",", ":"), default=_json_default)
        self.key = hashlib.sha256(text.encode("utf-8")).hexdigest()
        return self

    @property
    def name(self) -> str:
        """The file stem of the task's result: ``ANALYSIS-<first 24 hex digits of key>`` (a user
        analysis's name with every character but letters, digits, ``_``, ``.`` and ``-`` as ``_``)."""
        stem = "".join(c if c.isalnum() or c in "_.-" else "_" for c in self.analysis)
        return f"{stem}-{self.key[:24]}"

    def label(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.point.items() if k != "train") + \
            (f", train={json.dumps(self.point['train'], sort_keys=True)}" if "train" in self.point else "")


def _json_default(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    raise TypeError(f"{type(o).__name__} is not JSON-serialisable")


# ------------------------------------------------------------------ identities of inputs
def prompts_digest(prompts: str) -> str:
    """sha256 of a prompt set's texts (a shipped split, or a file's bytes)."""
    if prompts in SPLITS:
        text = "\n".join(load_passages(prompts))
        return hashlib.sha256(text.encode("utf-8")).hexdigest()
    if not os.path.isfile(prompts):
        raise SpecError(f"prompts {prompts!r} is neither a shipped split ({', '.join(SPLITS)}) nor a file")
    return registry.sha256_file(prompts)


def read_prompts(prompts: str) -> List[str]:
    """The texts of a prompt set: a shipped split, or a UTF-8 file's non-empty lines."""
    if prompts in SPLITS:
        return load_passages(prompts)
    with open(prompts, encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip()]


_MODEL_DIGESTS: Dict[Tuple[str, int, float], str] = {}


def model_digest(model: str) -> str:
    """sha256 that names a model's weights: the pinned one of a registered name (no download
    needed), else the file's (a folder's manifest digest), cached per (path, size, mtime)."""
    if not os.path.exists(model):
        if registry.is_registered(model):
            return registry.resolve_name(model).sha256
        raise SpecError(f"model {model!r} is neither a file, a folder, nor a registered name "
                        f"({', '.join(sorted(registry.MODELS))})")
    st = os.stat(model)
    k = (os.path.abspath(model), st.st_size, st.st_mtime)
    if k not in _MODEL_DIGESTS:
        _MODEL_DIGESTS[k] = registry.sha256_manifest(model)[0]
    return _MODEL_DIGESTS[k]


def address_all(tasks: Iterable[Task], version: str) -> List[Task]:
    """Sets every task's key (model and prompt digests computed once each)."""
    out = []
    digests: Dict[Tuple[str, str], str] = {}

    def once(kind: str, v: str) -> str:
        if (kind, v) not in digests:
            digests[(kind, v)] = model_digest(v) if kind == "model" else prompts_digest(v)
        return digests[(kind, v)]

    for t in tasks:
        m = once("model", t.point["model"]) if "model" in t.point else None
        p = once("prompts", t.point["prompts"]) if "prompts" in t.point else None
        out.append(t.address(m, p, version))
    return out


EXAMPLE_SPEC = """\
# A sinklab sweep: the Cartesian product of the axes below, one Dask task per combination of
# the axes each analysis reads. Run: sinklab sweep this.toml   (resumable: finished tasks are kept)
out = "sweep-results"                    # results folder: table.parquet, figures/, tasks/
analysis = ["sink_study", "quality"]     # sink_study perturbation sensitivity quality train
model = ["smollm2-135m-instruct"]        # registered names, .gguf files, Hugging Face folders
prompts = ["sinks"]                      # shipped splits (sinks, heldout, all) or text files
bos = [true, false]                      # with and without the <bos> token
eps = [0.3, 0.8]                         # sink thresholds (one measurement, a row per eps)
T = [32, 64]                             # tokens per sequence
intervention = ["none", "mask_first@0-2"]  # none, mask_first, zero_first_value[_all], @LAYERS
# precision = ["fp32", "bf16"]          # the forward's weight products: fp32 (exact), bf16, int8
# scheduler = "tcp://login-node:8786"    # an existing Dask cluster (default: a LocalCluster)
# workers = 2                            # LocalCluster worker processes
# threads = 1                            # OpenMP threads per task

[settings.sink_study]
n_prompts = 32                           # the first 32 prompts of each set

[settings.quality]
n_prompts = 16
"""
