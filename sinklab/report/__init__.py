"""``sinklab reproduce``: the paper's analyses on trained models, in one report.

Writes ``report.md`` (Markdown with PNG figures) and ``results.json`` (every number, every
verdict with its criterion, the models' sha256, settings and library versions) to ``out``.

The report opens with a table of every element of Barbero et al. (2025) — its definitions,
Prop. 3.1, Thm. 3.2, Fig. 2, 3 and 5, Tables 1 and 2, the ⟨bos⟩-removal benchmarks — and the
status a criterion in code computed for it from a measured effect and its interval (see
:mod:`sinklab.analysis.status`). The paper's ⟨bos⟩ claims are tested on the *study* model, the
one trained with a fixed ⟨bos⟩ (Gemma-3-270M by default); models trained without one
(SmolLM2-135M by default) are the contrast, where the paper predicts no ⟨bos⟩ effect.

One module per section (``sinks``, ``quality``, ``controls``, ``perturbation``, ``noop``,
``collapse``, ``oversquashing``, ``long_context``, ``training``), each formatting what
:mod:`sinklab.analysis` computed; ``families`` is the cross-family study
(``sinklab reproduce --families``); ``beyond`` the analyses beyond the paper on several models
side by side (``sinklab reproduce --beyond``), one module per section
(e.g. :mod:`sinklab.report.beyond_massive`).
"""
from .core import DEFAULT_MODELS, Context, ModelRole, Section, Settings, trained_with_bos
from .elements import ELEMENTS, element_rows
from .families import (BOS_REMOVAL_MODELS, ENCODER_MODELS, FAMILIES_FORMAT, TABLE1_MODELS, FamilySettings,
                       bos_removal, bos_removal_lines, bos_removal_markdown, families_figures, families_markdown,
                       families_study, load_families, reproduce_families, size_trend, table1_markdown, table1_reading,
                       table1_row)
from .run import markdown, reproduce
from .beyond import BEYOND_MODELS, BEYOND_SECTIONS, reproduce_beyond
from ..train.criteria import fig5_reading, table2_reading
from ..viz.figures_training import fig5_miniature_figure, table2_miniature_figure
from .training import (DEFAULT_TRAINING_ROOT, TRAINING_DIR, TRAINING_PROFILES, beyond_training_summaries,
                       find_training_summaries, load_training_summaries, quick_runs_dir, run_training_profile,
                       section_training, training_model_size, training_results, uniform_first_importance)

__all__ = ["reproduce", "reproduce_families", "reproduce_beyond", "families_study", "Settings", "FamilySettings", "Context", "Section",
           "ModelRole", "ELEMENTS", "DEFAULT_MODELS"]
