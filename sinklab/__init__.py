"""sinklab: attention sinks in transformer language models.

A C core (OpenMP, AVX-512 or AVX2 chosen at run time, with a portable fallback) runs LLaMA-family models from GGUF files or
Hugging Face folders and captures every attention probability and residual stream; the Python
package computes the metrics and analyses of "Why do LLMs attend to the first token?" (Barbero
et al., COLM 2025) that run on a trained model.

    import sinklab as sl
    model = sl.load("smollm2-135m-instruct")
    tr = model.run(model.tokenize("The cat sat on the mat.", bos=True))
    sl.sink_rate(tr.attn, eps=0.3)
"""
from __future__ import annotations

import importlib
from typing import Any, Dict, List

# First, before any other sinklab module: runtime sets libgomp's spin count before it loads the
# C core (see sinklab/runtime.py), and applies SINKLAB_NUM_THREADS.
from .runtime import __version__, build_info, get_num_threads, set_num_threads, simd, threads

# Everything else loads when first used (PEP 562), so ``import sinklab`` costs the C core and
# NumPy only: name -> the module that defines it.
_LAZY: Dict[str, str] = {
    "UnsupportedArchitecture": "families",
    "ModelConfig": "families.config",
    "QuantizedTensor": "families.tensors",
    "Intervention": "interventions",
    "Model": "model", "load": "model",
    "AttentionStats": "trace", "Trace": "trace",
    "first_token_importance": "analysis.sinks", "key_importance": "analysis.sinks", "sink_rate": "analysis.sinks",
    "Prop31": "analysis.collapse", "collapse_vs_length": "analysis.collapse", "prop31_check": "analysis.collapse",
    "rank_collapse": "analysis.collapse", "representational_collapse": "analysis.collapse",
    "CollapseTrend": "analysis.collapse", "collapse_trend": "analysis.collapse",
    "find_conditional_heads": "analysis.noop", "head_output_norms": "analysis.noop",
    "noop_analysis": "analysis.noop", "value_norms": "analysis.noop",
    "PerturbationStudy": "analysis.perturbation", "perturb": "analysis.perturbation",
    "perturbation_study": "analysis.perturbation", "text_key_entropy": "analysis.perturbation",
    "load_passages": "prompts",
    "compare_bos_quality": "analysis.quality", "passkey": "analysis.quality", "perplexity": "analysis.quality",
    "compare_bos": "analysis.sinkset", "sink_study": "analysis.sinkset",
    "BosControls": "analysis.controls", "bos_controls": "analysis.controls", "sink_location": "analysis.controls",
    "MixingResult": "analysis.mixing", "mixing_measure": "analysis.mixing",
    "Thm32Bounds": "analysis.oversquashing", "thm32_bounds": "analysis.oversquashing",
    "OversquashingBound": "analysis.oversquashing", "oversquashing_bound": "analysis.oversquashing",
    "ClozeResult": "analysis.tasks", "RetrievalResult": "analysis.tasks", "cloze": "analysis.tasks",
    "multikey_retrieval": "analysis.tasks",
    "Sensitivity": "analysis.sensitivity", "sensitivity": "analysis.sensitivity",
    "SquashingStudy": "analysis.squashing_study", "squashing_study": "analysis.squashing_study",
    "MassiveActivations": "analysis.massive", "massive_activations": "analysis.massive",
    "KeyGeometry": "analysis.key_geometry", "key_geometry": "analysis.key_geometry",
    "WindowedPerplexity": "analysis.windowed", "windowed_perplexity": "analysis.windowed",
    "HeadAblation": "analysis.head_ablation", "head_ablation": "analysis.head_ablation",
    "Patch": "patching",
    "PatchingResult": "analysis.patching_experiment", "patching_experiment": "analysis.patching_experiment",
    "name_swap_pairs": "analysis.patching_experiment",
    "SweepResult": "sweeps.runner", "sweep": "sweeps.runner",
}

__all__ = ["load", "Model", "ModelConfig", "QuantizedTensor", "UnsupportedArchitecture", "Trace", "AttentionStats",
           "Intervention", "sink_rate", "key_importance",
           "first_token_importance", "set_num_threads", "get_num_threads", "threads", "simd", "build_info",
           "sink_study", "compare_bos", "perturb", "perturbation_study", "PerturbationStudy", "text_key_entropy",
           "rank_collapse", "prop31_check", "Prop31", "representational_collapse",
           "collapse_vs_length", "noop_analysis", "value_norms", "head_output_norms",
           "find_conditional_heads", "perplexity", "passkey", "compare_bos_quality", "load_passages",
           "sensitivity", "Sensitivity", "oversquashing_bound", "OversquashingBound", "squashing_study",
           "SquashingStudy", "sweep", "SweepResult", "bos_controls", "BosControls", "sink_location",
           "mixing_measure", "MixingResult", "collapse_trend", "CollapseTrend", "thm32_bounds", "Thm32Bounds",
           "multikey_retrieval", "RetrievalResult", "cloze", "ClozeResult",
           "massive_activations", "MassiveActivations", "key_geometry", "KeyGeometry",
           "windowed_perplexity", "WindowedPerplexity", "head_ablation", "HeadAblation",
           "Patch", "patching_experiment", "PatchingResult", "name_swap_pairs"]


def __getattr__(name: str) -> Any:
    """A lazy export (``sl.load``, ``sl.sweep``, ...) or a subpackage (``sl.io``, ``sl.inputs``),
    imported on first use and then kept in this module's namespace."""
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    elif not name.startswith("_"):  # a public subpackage or module (sl.io, sl.inputs)
        try:
            value = importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise  # the module exists but one of its own imports is missing
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(_LAZY))
