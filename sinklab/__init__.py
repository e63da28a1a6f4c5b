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

import os
import warnings

# How long an OpenMP thread spins before it sleeps while waiting for work. Spinning long takes a
# shared core from other processes, and a team whose thread shares a core with another process
# then stalls at every join; not spinning at all leaves the worker asleep when the next product
# starts, and waking a virtual CPU can take longer than a whole small product. Measured with one
# of two cores busy (benchmarks/RESULTS.md, "Under contention"), 2 threads over 1 thread at
# T = 512: libgomp's default 300000 spins 1.41x, 30000 1.53x, 3000 1.04x, 0 (passive) 0.97x but
# then often no 2-thread speed-up even on an idle machine (1.18 s against 1.25 s on one thread).
# libgomp reads this when it is loaded, i.e. at the import of _core below; a choice the user made
# (GOMP_SPINCOUNT or OMP_WAIT_POLICY) is kept.
if "GOMP_SPINCOUNT" not in os.environ and "OMP_WAIT_POLICY" not in os.environ:
    os.environ["GOMP_SPINCOUNT"] = "3000"

from . import _core  # noqa: E402
from .families import UnsupportedArchitecture
from .families.config import ModelConfig
from .families.tensors import QuantizedTensor
from .interventions import Intervention
from .model import Model, load
from .analysis.sinks import first_token_importance, key_importance, sink_rate
from .trace import AttentionStats, Trace
from .analysis.collapse import Prop31, collapse_vs_length, prop31_check, rank_collapse, representational_collapse
from .analysis.noop import find_conditional_heads, head_output_norms, noop_analysis, value_norms
from .analysis.perturbation import PerturbationStudy, perturb, perturbation_study, text_key_entropy
from .prompts import load_passages
from .analysis.quality import compare_bos_quality, passkey, perplexity
from .analysis.sinkset import compare_bos, sink_study
from .analysis.sensitivity import Sensitivity, sensitivity
from .analysis.oversquashing import OversquashingBound, oversquashing_bound
from .analysis.squashing_study import SquashingStudy, squashing_study
from .sweeps.runner import SweepResult, sweep

__version__ = "0.1.0"
__all__ = ["load", "Model", "ModelConfig", "QuantizedTensor", "UnsupportedArchitecture", "Trace", "AttentionStats",
           "Intervention", "sink_rate", "key_importance",
           "first_token_importance", "set_num_threads", "get_num_threads", "simd",
           "sink_study", "compare_bos", "perturb", "perturbation_study", "PerturbationStudy", "text_key_entropy",
           "rank_collapse", "prop31_check", "Prop31", "representational_collapse",
           "collapse_vs_length", "noop_analysis", "value_norms", "head_output_norms",
           "find_conditional_heads", "perplexity", "passkey", "compare_bos_quality", "load_passages",
           "sensitivity", "Sensitivity", "oversquashing_bound", "OversquashingBound", "squashing_study",
           "SquashingStudy", "sweep", "SweepResult"]


def set_num_threads(n: int) -> None:
    """Sets the number of OpenMP threads (``n >= 1``) every later C-core call uses.

    The setting is process-wide: it applies to calls from every Python thread, not only the
    one that set it (each call reads it once, when it starts). It is not a per-thread option,
    so two Python threads cannot run with different counts at the same time. Results are
    bitwise identical for any ``n``. The environment variable ``SINKLAB_NUM_THREADS`` sets it
    at import; without it the default is OpenMP's (``OMP_NUM_THREADS`` or the core count).
    """
    _core.set_num_threads(int(n))


def get_num_threads() -> int:
    """The process-wide thread count set by :func:`set_num_threads` (the same in every thread)."""
    return _core.get_num_threads()


def simd() -> str:
    """The kernel family in use: ``"avx512"``, ``"avx2"`` or ``"generic"`` (portable C).

    Chosen at run time, the best the CPU has (AVX-512 F/BW/VL/DQ, then AVX2+FMA); the
    environment variable ``SINKLAB_SIMD=generic|avx2|avx512`` read at import forces a lower
    level (a level the CPU lacks falls back to the best it has).
    """
    return _core.simd()


if not _core.has_openmp:
    warnings.warn("sinklab was built without OpenMP (the compiler has none): kernels run on one thread")
if os.environ.get("SINKLAB_SIMD", "auto") not in ("auto", "generic", "avx2", "avx512"):
    warnings.warn(f"SINKLAB_SIMD={os.environ['SINKLAB_SIMD']!r} is not one of auto, generic, avx2, avx512: "
                  f"using {_core.simd()}")
if os.environ.get("SINKLAB_NUM_THREADS"):
    set_num_threads(int(os.environ["SINKLAB_NUM_THREADS"]))
