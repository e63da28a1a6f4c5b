"""``sinklab reproduce --beyond``: the analyses beyond the paper on several models side by side.

Writes ``beyond.md`` (Markdown with PNG figures) and ``beyond.json`` (every section's numbers
per model, the models' sha256, the settings and the library versions) to ``out``.

Each section is a module of this package named ``beyond_`` + the section's name (e.g.
:mod:`sinklab.report.beyond_massive`) with:

- ``TITLE``: the section's title;
- ``compute(model, quick, progress) -> dict``: the analysis on one model, JSON-able (numbers,
  intervals, the settings used);
- ``markdown(results) -> str``: the section's body for ``results`` keyed by model name: the
  question it answers, the literature it stands for and what differs, the models side by side
  with intervals, and a reading computed from the numbers and their intervals;
- ``figures(results) -> {file name: Figure}``;
- ``SUMMARY`` and ``summary(result) -> str``: the row label and one model's reading in one cell
  of the report's summary table (:func:`summary_table`).

Every (section, model) result is kept in ``out/cache/`` under a key of the section, the model's
sha256, the preset and the sinklab version: a rerun after an interruption computes only what is
missing (``resume=False`` recomputes everything).
"""
from __future__ import annotations

import gc
import hashlib
import importlib
import json
import os
import time
from types import ModuleType
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

import sinklab
from .. import __version__
from ..io.registry import sha256_path
from ..progress import progress_bar
from ..results import save_json, to_jsonable
from ..system import write_atomic
from .core import table
from .run import anchor, versions

BEYOND_SECTIONS = ("massive", "key_geometry", "secondary", "multidoc", "windowed", "ablation", "patching")
"""The sections, in report order (section ``x`` is the module ``beyond_x`` of this package)."""

BEYOND_MODELS = ("gemma-3-270m", "smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct")
"""The default models: trained with a fixed ⟨bos⟩ (Gemma 3) and without one (SmolLM2, Qwen2.5)."""

FORMAT = "sinklab.BeyondReport/1"


def section_module(name: str) -> ModuleType:
    """The module of section ``name``; ValueError for a name not in :data:`BEYOND_SECTIONS`."""
    if name not in BEYOND_SECTIONS:
        raise ValueError(f"unknown beyond section {name!r}; choose from {', '.join(BEYOND_SECTIONS)}")
    return importlib.import_module(f"{__package__}.beyond_{name}")


def _cache_key(section: str, sha256: str, quick: bool) -> str:
    text = json.dumps({"section": section, "sha256": sha256, "quick": bool(quick), "sinklab": __version__},
                      sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _cached(path: str, key: str) -> Optional[Dict[str, Any]]:
    """The result saved at ``path`` under ``key``, or None (absent, another key, unreadable)."""
    try:
        with open(path, encoding="utf-8") as f:
            saved = json.load(f)
    except (OSError, ValueError):
        return None
    return saved.get("result") if isinstance(saved, dict) and saved.get("key") == key else None


def reproduce_beyond(models: Union[str, Sequence[str]] = BEYOND_MODELS, out: str = "sinklab-beyond",
                     quick: bool = False, sections: Optional[Sequence[str]] = None, progress: bool = True,
                     resume: bool = True, loader: Optional[Callable[[str], Any]] = None) -> Dict[str, Any]:
    """Runs the beyond-the-paper sections on ``models``; writes ``out/beyond.md``, its figures and
    ``out/beyond.json``.

    Args:
        models: registered names, ``.gguf`` files or Hugging Face folders (one name or several).
        out: output folder (created).
        quick: the small preset of every section (about a minute per section and model on 2 cores).
        sections: the section names to run, of :data:`BEYOND_SECTIONS` (default all), in report order.
        progress: progress bars.
        resume: reuse the (section, model) results already in ``out/cache/`` for the same model file,
            preset and sinklab version.
        loader: how a name becomes a model (default :func:`sinklab.load`).

    Returns:
        The JSON written to ``beyond.json``.
    """
    names = list(dict.fromkeys((models,) if isinstance(models, str) else tuple(models)))
    if not names:
        raise ValueError("reproduce_beyond needs at least one model")
    keys = list(BEYOND_SECTIONS) if sections is None else list(dict.fromkeys(sections))
    if not keys:
        raise ValueError("reproduce_beyond needs at least one section")
    mods = {k: section_module(k) for k in keys}                  # unknown names fail before any work
    loader = loader or (lambda n: sinklab.load(n, quiet=not progress))
    cache = os.path.join(out, "cache")
    os.makedirs(cache, exist_ok=True)
    t_all = time.perf_counter()
    results: Dict[str, Dict[str, Any]] = {k: {} for k in keys}
    seconds: Dict[str, float] = {k: 0.0 for k in keys}
    meta_models: List[Dict[str, Any]] = []
    for name in progress_bar(names, progress and len(names) > 1, desc="beyond: models", unit="model"):
        model = loader(name)
        sha = sha256_path(model.source)
        meta_models.append({"name": model.name, "source": model.source, "sha256": sha,
                            "bos_token_id": model.config.bos_token_id,
                            "tokenizer_adds_bos": getattr(model.tokenizer, "add_bos_default", None)})
        for k in keys:
            path = os.path.join(cache, f"{k}--{sha[:16]}.json")
            ck = _cache_key(k, sha, quick)
            got = _cached(path, ck) if resume else None
            if got is None:
                t0 = time.perf_counter()
                got = to_jsonable(mods[k].compute(model, quick, progress))
                got["seconds"] = time.perf_counter() - t0
                save_json(path, {"key": ck, "section": k, "model": model.name, "result": got})
            results[k][model.name] = got
            seconds[k] += float(got.get("seconds", 0.0))
        del model
        gc.collect()                                   # one model's weights in memory at a time
    figures: Dict[str, List[str]] = {}
    for k in keys:
        figures[k] = []
        for fname, fig in mods[k].figures(results[k]).items():
            fig.savefig(os.path.join(out, fname), dpi=120)
            figures[k].append(fname)
    meta = {"format": FORMAT, "models": meta_models, "quick": bool(quick), "sections": keys,
            "versions": versions(), "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            "seconds_total": time.perf_counter() - t_all}
    res = to_jsonable({"meta": meta, **{k: {"title": mods[k].TITLE, "results": results[k], "figures": figures[k],
                                            "seconds": seconds[k]} for k in keys}})
    save_json(os.path.join(out, "beyond.json"), res)
    text = beyond_markdown(res, mods).encode("utf-8")
    write_atomic(os.path.join(out, "beyond.md"), lambda f: f.write(text))
    return res


def summary_table(res: Dict[str, Any], mods: Optional[Dict[str, ModuleType]] = None) -> str:
    """The readings at a glance: one row per section, one column per model, each cell computed
    from that section's numbers and intervals (``summary`` of the section's module)."""
    meta = res["meta"]
    mods = mods or {k: section_module(k) for k in meta["sections"]}
    names = [m["name"] for m in meta["models"]]
    rows = [[mods[k].SUMMARY] + [mods[k].summary(res[k]["results"][n]) for n in names] for k in meta["sections"]]
    return table(["section"] + names, rows)


def beyond_markdown(res: Dict[str, Any], mods: Optional[Dict[str, ModuleType]] = None) -> str:
    """``beyond.md`` from what :func:`reproduce_beyond` returned."""
    meta = res["meta"]
    mods = mods or {k: section_module(k) for k in meta["sections"]}
    v = meta["versions"]
    lines = ["# sinklab: beyond the paper", "",
             "Analyses that researchers run on attention sinks beyond Barbero et al. (2025), on the models side by "
             "side. Every interval is a 95 % percentile bootstrap over prompts; every reading is computed from the "
             "numbers and their intervals.", "",
             "| model | file sha256 | tokenizer adds ⟨bos⟩ |", "|---|---|---|"]
    lines += [f"| {m['name']} | `{m['sha256'][:16]}…` | {m['tokenizer_adds_bos']} |" for m in meta["models"]]
    lines += ["", f"Preset: {'quick' if meta['quick'] else 'full'}; sinklab {v['sinklab']}, NumPy {v['numpy']}, "
                  f"{v['simd']} kernels, {v['threads']} thread{'s' if v['threads'] != 1 else ''}; "
                  f"{sum(res[k]['seconds'] for k in meta['sections']):.0f} s of compute over the sections, this run "
                  f"{meta['seconds_total']:.0f} s (a resumed run reads the rest from its cache, computed at the "
                  f"thread counts of the runs that made it).", ""]
    lines += ["The readings at a glance (each cell computed from the section's intervals; the sections below give "
              "the numbers and what each word means):", "", summary_table(res, mods), ""]
    lines += [f"- [{res[k]['title']}]({anchor(res[k]['title'])})" for k in meta["sections"]]
    for k in meta["sections"]:
        sec = res[k]
        lines += ["", f"## {sec['title']}", "", mods[k].markdown(sec["results"]).strip(), ""]
        lines += [f"![{f}]({f})" for f in sec["figures"]]
        lines += ["", f"*{sec['seconds']:.0f} s of compute.*"]
    return "\n".join(lines) + "\n"

