"""``sinklab reproduce``: every section on the study model and its contrast, ``report.md`` and
``results.json`` (every number, every verdict with its criterion)."""
from __future__ import annotations

import contextlib
import os
import platform
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

import sinklab
from .. import __version__, get_num_threads, simd
from ..io.registry import sha256_path
from ..model import check_precision
from ..results import save_json, to_jsonable
from .collapse import section_collapse
from .controls import section_controls
from .core import DEFAULT_MODELS, Context, ModelRole, Section, Settings, table, trained_with_bos
from .elements import ELEMENTS, element_rows
from .long_context import section_long_context
from .noop import section_noop
from .oversquashing import section_oversquashing
from .perturbation import section_perturbation
from .quality import section_quality
from .sinks import section_sinks
from .training import TRAINING_PROFILES, section_training


# sections that differentiate the model: derivatives exist in fp32 only, so these run in fp32
# whatever precision the report's forward passes use
FP32_SECTIONS = frozenset({"oversquashing"})


def _sections() -> List[Tuple[str, Callable[[Context], Section]]]:
    return [("sinks", section_sinks), ("quality", section_quality), ("controls", section_controls),
            ("perturbation", section_perturbation), ("noop", section_noop), ("collapse", section_collapse),
            ("oversquashing", section_oversquashing), ("long_context", section_long_context),
            ("training", section_training)]


def versions() -> Dict[str, str]:
    """The versions a result records: sinklab, NumPy, matplotlib, Python, the platform, the SIMD
    kernel in use and the thread count, as strings."""
    import matplotlib

    return {"sinklab": __version__, "numpy": np.__version__, "matplotlib": matplotlib.__version__,
            "python": platform.python_version(), "platform": platform.platform(), "simd": simd(),
            "threads": str(get_num_threads())}


def _model_meta(m: ModelRole) -> Dict[str, Any]:
    model, cfg = m.model, m.model.config
    bid = cfg.bos_token_id
    return {"name": m.name, "source": model.source, "sha256": sha256_path(model.source), "config": cfg.to_dict(),
            "bos_token_id": bid, "bos_token": None if bid is None or model.tokenizer is None else model.detokenize([bid]),
            "tokenizer_adds_bos": m.trained_with_bos, "role": m.role}


def reproduce(models: Union[str, Sequence[str]] = DEFAULT_MODELS, out: str = "sinklab-report", quick: bool = False,
              progress: bool = True, eps: Sequence[float] = (0.3, 0.8), settings: Optional[Settings] = None,
              training_profile: Optional[str] = None, training_root: str = "sinklab-experiments",
              sections: Optional[Sequence[str]] = None, loader: Optional[Callable[[str], Any]] = None,
              precision: str = "fp32") -> Dict[str, Any]:
    """Runs every section on ``models``, writes ``out/report.md``, the figures and ``out/results.json``.

    Args:
        models: registered names, ``.gguf`` files or Hugging Face folders (one name or several).
            The first whose tokenizer prepends ⟨bos⟩ (trained with a fixed ⟨bos⟩, like Gemma) is the
            *study* model, on which the paper's ⟨bos⟩ claims are tested; the others are the
            contrast (the paper predicts no ⟨bos⟩ effect on them). Default: Gemma-3-270M and
            SmolLM2-135M-Instruct.
        out: output folder (created).
        quick: the small preset (docs/index.md, the documentation's home page, gives measured times).
        progress: progress bars, each naming what it runs.
        eps: sink thresholds in (0, 1); the smallest is the one the criteria use.
        settings: explicit sizes, overriding ``quick`` and ``eps``.
        training_profile: the pre-training section: ``"none"`` skips it, ``"quick"`` runs the smoke
            profile into ``out/training/``, ``"cpu"``/``"full"`` run or resume that profile under
            ``training_root``; None: ``"quick"`` when ``quick``, else the cpu profile's summaries
            when they exist and the quick profile otherwise (the section says which).
        training_root: the runs' folder of ``sinklab experiment``.
        sections: run only these section keys (default all; the element table marks the others).
        loader: how a name becomes a model (default :func:`sinklab.load`).
        precision: the forward passes' weight products (:data:`sinklab.model.PRECISIONS`): ``"fp32"``
            (exact, the default), ``"bf16"`` or ``"int8"`` (faster; docs/guides/precision.md
            gives what each costs). The sections in :data:`FP32_SECTIONS` (derivatives) run in fp32
            whatever it is; ``results.json``'s meta and the report's header say which ran how.

    Returns:
        The JSON written to ``results.json``.
    """
    names = (models,) if isinstance(models, str) else tuple(models)
    precision = check_precision(precision)
    if not names:
        raise ValueError("reproduce needs at least one model")
    s = settings or Settings.for_run(quick, eps=eps)
    if training_profile is not None and training_profile not in TRAINING_PROFILES:
        raise ValueError(f"training_profile {training_profile!r}: choose from {', '.join(TRAINING_PROFILES)}")
    all_sections = _sections()
    keys = [k for k, _ in all_sections]
    if sections is not None:
        bad = sorted(set(sections) - set(keys))
        if bad:
            raise ValueError(f"unknown section(s) {bad}; choose from {keys}")
    os.makedirs(out, exist_ok=True)
    t_all = time.perf_counter()
    loader = loader or (lambda n: sinklab.load(n, quiet=not progress))  # looked up at call time: a replaced one (tests) is used
    roles = []
    for n in dict.fromkeys(names):
        model = loader(n)
        if model.config.bos_token_id is None:
            raise ValueError(f"{model.name} has no BOS token: the report compares with and without it")
        roles.append(ModelRole(model.name, model, trained_with_bos(model)))
    ctx = Context(roles, s, out, progress, training_profile=training_profile or ("quick" if quick else "auto"),
                  training_root=training_root)
    for key, fn in all_sections:
        if sections is not None and key not in sections:
            continue
        t0 = time.perf_counter()
        with contextlib.ExitStack() as scope:            # the models' own precision comes back after
            for r in roles:
                scope.enter_context(r.model.using_precision("fp32" if key in FP32_SECTIONS else precision))
            sec = fn(ctx)
        sec.seconds = time.perf_counter() - t0
        ctx.done[key] = sec
    study = ctx.study
    contrasts = [m.name for m in roles if m is not study]
    rows = element_rows(ctx.done, study.name if study else None, contrasts)
    meta = {"models": [_model_meta(m) for m in roles], "study_model": study.name if study else None,
            "contrast_models": contrasts, "eps": list(s.eps), "quick": quick, "settings": vars(s),
            "precision": precision, "fp32_sections": sorted(FP32_SECTIONS) if precision != "fp32" else [],
            "versions": versions(), "training_profile": ctx.training_profile,
            "started": time.strftime("%Y-%m-%d %H:%M:%S %z"), "seconds_total": time.perf_counter() - t_all}
    results = to_jsonable({
        "meta": meta, "paper_elements": rows,
        **{k: {"title": v.title, "paper": v.paper, "here": v.here, "reading": v.reading, "seconds": v.seconds,
               "figures": v.figures, "numbers": v.numbers,
               "verdicts": {e: {n: d.to_dict() for n, d in per.items()} for e, per in v.verdicts.items()}}
           for k, v in ctx.done.items()}})
    save_json(os.path.join(out, "results.json"), results)
    with open(os.path.join(out, "report.md"), "w", encoding="utf-8") as f:
        f.write(markdown(meta, ctx.done, rows))
    return results


def anchor(title: str) -> str:
    keep = [ch for ch in title.lower() if ch.isalnum() or ch in " -"]
    return "#" + "".join(keep).strip().replace(" ", "-")


def element_table(rows: List[Dict[str, Any]], study: Optional[str], contrasts: List[str]) -> str:
    """The first table: element, the paper's numbers, status and its reason, the contrasts' statuses."""
    head = ["paper element", "the paper's numbers", f"status ({study or 'no fixed-⟨bos⟩ model'})", "why"]
    head += [f"{n} (contrast)" for n in contrasts] + ["section"]
    out = []
    for r in rows:
        sec = f"[{r['section']}]({anchor(r['section'])})" if r["section"] else "—"
        out.append([r["element"], r["paper"], f"**{r['status']}**", r["reason"]]
                   + [r["contrast"].get(n, "—") for n in contrasts] + [sec])
    return table(head, out)


def _precision_line(meta: Dict[str, Any]) -> str:
    p = meta.get("precision", "fp32")
    if p == "fp32":
        return "Forward passes in fp32 (exact). "
    return (f"Forward passes with {p} weight products (sinklab's docs/guides/precision.md gives what that costs in "
            f"fidelity); {', '.join(meta['fp32_sections'])} in fp32 (derivatives). ")


def markdown(meta: Dict[str, Any], sections: Dict[str, Section], rows: List[Dict[str, Any]]) -> str:
    ms = meta["models"]
    desc = "; ".join(f"`{os.path.basename(os.path.normpath(m['source']))}` ({m['role']}: {m['config']['n_layers']} "
                     f"layers × {m['config']['n_heads']} heads, d = {m['config']['d_model']}, first token id "
                     f"{m['bos_token_id']} {m['bos_token']!r}, sha256 `{m['sha256'][:16]}…`)" for m in ms)
    counts = {st: sum(r["status"] == st for r in rows) for st in dict.fromkeys(r["status"] for r in rows)}
    lines = [f"# sinklab report: {', '.join(m['name'] for m in ms)}", "",
             "The analyses of Barbero et al., *Why do LLMs attend to the first token?* (COLM 2025, arXiv 2504.02732) on "
             f"trained models: {desc}. The paper's ⟨bos⟩ claims are tested on the model trained with a fixed ⟨bos⟩ "
             f"(the study model, {meta['study_model'] or 'none here'}); models trained without one are the contrast, "
             f"where the paper predicts no ⟨bos⟩ effect.",
             f"ε = {', '.join(map(str, meta['eps']))}. {'Quick settings' if meta['quick'] else 'Full settings'}; total "
             f"{meta['seconds_total']:.0f} s ({meta['versions']['threads']} thread{'s' if meta['versions']['threads'] != 1 else ''}, {meta['versions']['simd']} "
             f"kernels). {_precision_line(meta)}Every number and every verdict's criterion is in `results.json`.", "",
             "## The paper, element by element", "",
             "Each status comes from a criterion in code applied to a measured effect and its 95% interval: "
             "*reproduced* (the interval lies on the paper's side), *contradicted* (on the other side), *inconclusive* "
             "(it includes the null, or the measure cannot separate the hypotheses), *not testable here*, or "
             "*consistency check* (a mathematical fact checked on the numbers). Counts: "
             + ", ".join(f"{n} {st}" for st, n in counts.items()) + ".", "",
             element_table(rows, meta["study_model"], meta["contrast_models"]), ""]
    for sec in sections.values():
        lines += [f"## {sec.title}", "", f"**Paper.** {sec.paper}", "", f"**Here.** {sec.here}", ""]
        if sec.body:
            lines += [sec.body, ""]
        lines += [f"![{name}]({name})" for name in sec.figures]
        lines += ["", f"**Reading.** {sec.reading}", "", f"_{sec.seconds:.1f} s_", ""]
    return "\n".join(lines)


__all__ = ["reproduce", "markdown", "element_table", "ELEMENTS"]
