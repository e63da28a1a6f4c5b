"""MkDocs hook: the shipped notebooks and the figures in their outputs, as files of the site.

The notebooks live in notebooks/ (the tests execute them there), not in docs/, so they are added
here and rendered by mkdocs-jupyter. The analysis pages show the figures the notebooks already
hold (their cells' PNG outputs), so nothing is recomputed at build time: FIGURES names each one by
the notebook and the cell that drew it, and a cell without a PNG fails the build. The beyond-the-paper
pages show the figures of the committed quick report (notebooks/results/beyond/, written by
``sinklab reproduce --beyond --quick``): RESULT_FIGURES names each by its file in the repository,
and a missing file fails the build.
"""
from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Dict, Tuple

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ("reproduce_paper.ipynb", "training.ipynb")

# site path under figures/ -> (notebook, cell index): the code cell whose first PNG output it is
FIGURES: Dict[str, Tuple[str, int]] = {
    "compare_bos.png": ("reproduce_paper.ipynb", 3),
    "perturbation_spread.png": ("reproduce_paper.ipynb", 5),
    "perturbation_heatmaps.png": ("reproduce_paper.ipynb", 7),
    "noop_norms.png": ("reproduce_paper.ipynb", 9),
    "noop_intervention.png": ("reproduce_paper.ipynb", 10),
    "collapse_vs_length.png": ("reproduce_paper.ipynb", 13),
    "oversquashing_bound.png": ("reproduce_paper.ipynb", 15),
    "sensitivity_maps.png": ("reproduce_paper.ipynb", 16),
    "mixing_vs_length.png": ("reproduce_paper.ipynb", 17),
    "long_context_stats.png": ("reproduce_paper.ipynb", 20),
    "bos_quality.png": ("reproduce_paper.ipynb", 22),
    "families_table1.png": ("reproduce_paper.ipynb", 25),
    "families_bos_removal.png": ("reproduce_paper.ipynb", 27),
    "training_curve.png": ("training.ipynb", 3),
    "training_sinks.png": ("training.ipynb", 6),
    "fig5_cpu.png": ("training.ipynb", 12),
    "table2_cpu.png": ("training.ipynb", 15),
}


# site path under figures/ -> committed figure, relative to the repository root
RESULT_FIGURES: Dict[str, str] = {
    f"beyond/{name}": f"notebooks/results/beyond/{name}"
    for name in (
        "beyond_massive.png",
        "beyond_key_geometry.png",
        "beyond_secondary_classes.png",
        "beyond_secondary_heads.png",
        "beyond_multidoc.png",
        "beyond_windowed.png",
        "beyond_ablation.png",
        "beyond_patching.png",
    )
}
RESULT_FIGURES["training/search-variants.png"] = "notebooks/results/training/miniature/search-variants.png"
RESULT_FIGURES["training/table2-miniature.png"] = "notebooks/results/training/table2-miniature.png"


def result_png(path: str) -> bytes:
    """The bytes of the committed figure ``path`` (relative to the repository root); FileNotFoundError if absent."""
    f = ROOT / path
    if not f.is_file():
        raise FileNotFoundError(f"{path} is not in the repository (RESULT_FIGURES in docs/hooks/notebook_files.py "
                                "names it; rerun `sinklab reproduce --beyond` and commit its figures)")
    return f.read_bytes()


def cell_png(notebook: str, cell: int) -> bytes:
    """The first PNG output of code cell ``cell`` of ``notebooks/notebook``; ValueError if none."""
    nb = json.loads((ROOT / "notebooks" / notebook).read_text(encoding="utf-8"))
    c = nb["cells"][cell]
    for out in c.get("outputs", []):
        data = out.get("data", {})
        if "image/png" in data:
            png = data["image/png"]
            return base64.b64decode("".join(png) if isinstance(png, list) else png)
    raise ValueError(f"notebooks/{notebook} cell {cell} has no PNG output (was the notebook re-run with other cells?)")


@event_priority(100)  # before mkdocs-jupyter turns .ipynb files into pages
def on_files(files: Files, config) -> Files:
    for name in NOTEBOOKS:
        # src_dir is the repository root, so notebooks/NAME is both the source and the site path
        files.append(File(f"notebooks/{name}", src_dir=str(ROOT), dest_dir=config["site_dir"],
                          use_directory_urls=config["use_directory_urls"]))
    for name, (notebook, cell) in FIGURES.items():
        files.append(File.generated(config, f"figures/{name}", content=cell_png(notebook, cell)))
    for name, path in RESULT_FIGURES.items():
        files.append(File.generated(config, f"figures/{name}", content=result_png(path)))
    return files
