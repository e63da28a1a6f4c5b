"""The shipped notebooks run top to bottom in a real Jupyter kernel (nbclient + ipykernel), and
every cell tagged ``figure`` displays a PNG there, as it does for a user in Jupyter. Running the
cells with ``exec`` outside a kernel could not notice a figure function that switches the
backend or returns something Jupyter prints as ``<Figure size ... with N Axes>``.

The shipped copies must carry their outputs, so the notebook reads on a site that renders
.ipynb without running it."""
import copy
import json
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))
# The families study's saved results (`sinklab reproduce --families`), which the notebook reads
# instead of loading every registered model.
FAMILIES = Path(__file__).resolve().parent.parent / "notebooks" / "results"
pytestmark = pytest.mark.slow  # each notebook runs end to end in a Jupyter kernel


def jupyter():
    """(nbformat, NotebookClient), or a failure/skip naming what is missing."""
    from tests.support.required import unavailable

    try:
        import nbformat
        from jupyter_client.kernelspec import KernelSpecManager
        from nbclient import NotebookClient
    except ImportError as e:
        unavailable(f"nbformat/nbclient/ipykernel not installed: {e}")
    if "python3" not in KernelSpecManager().find_kernel_specs():
        unavailable("no python3 Jupyter kernel (ipykernel) in this environment")
    return nbformat, NotebookClient


def figure_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code" and "figure" in c.metadata.get("tags", [])]


def has_png(cell) -> bool:
    return any("image/png" in o.get("data", {}) for o in cell.get("outputs", []))


def errors(nb):
    return [(c.source[:80], o) for c in nb.cells if c.cell_type == "code"
            for o in c.get("outputs", []) if o.get("output_type") == "error"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_shipped_notebook_has_its_figures(path):
    nbformat, _ = jupyter()
    nb = nbformat.read(path, as_version=4)
    figs = figure_cells(nb)
    assert len(figs) >= 5, "expected the figure cells to be tagged 'figure'"
    missing = [c.source[:60] for c in figs if not has_png(c)]
    assert not missing, f"shipped without their PNG output: {missing}"
    assert not errors(nb)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs_in_a_kernel_and_shows_figures(path, smollm2_gguf, tmp_path, monkeypatch):
    nbformat, NotebookClient = jupyter()
    # The kernel must not be told which backend to use: the figures must show under Jupyter's own.
    monkeypatch.delenv("MPLBACKEND", raising=False)
    monkeypatch.setenv("SINKLAB_FAMILIES_RESULTS", str(FAMILIES / "families.json"))
    nb = nbformat.read(path, as_version=4)
    ran = copy.deepcopy(nb)
    for c in ran.cells:
        if c.cell_type == "code":
            c.outputs = []
    NotebookClient(ran, timeout=1200, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    assert not errors(ran)
    figs = figure_cells(ran)
    assert len(figs) == len(figure_cells(nb)) >= 5
    for c in figs:
        assert has_png(c), f"figure cell produced no image/png output: {c.source[:80]!r} -> " \
                           f"{json.dumps(c.outputs)[:300]}"
    if path.name == "reproduce_paper.ipynb":  # the families section read the shipped results
        text = json.dumps([c.outputs for c in ran.cells if c.cell_type == "code"])
        assert "read families.json: full settings" in text


def test_shipped_families_results():
    """The shipped families results: every registered decoder in Table 1, the encoder row, ⟨bos⟩
    removal on Gemma 3 and Qwen2.5-0.5B; the verdicts follow from the numbers, and the shipped
    families.md is what the report writes from this JSON."""
    from sinklab.analysis.status import STATUSES
    from sinklab.report import (BOS_REMOVAL_MODELS, TABLE1_MODELS, families_figures, families_markdown,
                                load_families)

    res = load_families(FAMILIES / "families.json")
    assert res["meta"]["preset"] == "full" and res["meta"]["settings"]["sink_prompts"] == 144
    assert [r["name"] for r in res["table1"]] == list(TABLE1_MODELS)
    assert [r["name"] for r in res["encoders"]] == ["all-minilm-l6-v2"]
    assert list(res["bos_removal"]) == list(BOS_REMOVAL_MODELS)
    for r in res["table1"] + res["encoders"]:
        assert r["n_prompts"] == 144 and r["T"] == 64
        assert 0.0 <= r["sink_rate"]["0.8"] <= r["sink_rate"]["0.3"] <= 1.0
        # Table 1 in each model's own format: ⟨bos⟩+text exactly where its tokenizer prepends it
        assert r["format"] == ("⟨bos⟩+text" if r["tokenizer_adds_bos"] in (True, None) else "text only"), r["name"]
        for e, ci in r["sink_rate_ci"].items():
            assert ci["lo"] <= r["sink_rate"][e] <= ci["hi"], (r["name"], e)
    # the size trend is tested only within a family (Qwen2.5 0.5B -> 1.5B, the same format and prompts)
    assert list(res["size_trend"]) == ["qwen2"]
    assert all(v["status"] in STATUSES for v in res["size_trend"]["qwen2"]["eps"].values())
    for name, r in res["bos_removal"].items():
        assert set(r["verdicts"]) == {"sinks", "quality", "passkey"}, name
        assert all(v["status"] in STATUSES and v["reason"] and v["criterion"] for v in r["verdicts"].values())
        assert set(r["passkey"]["bos"]["accuracy"]) == {"256", "512", "1024", "2048"}
    md = (FAMILIES / "families.md").read_text(encoding="utf-8")
    assert md == families_markdown(res, list(families_figures(res)))
    for name in families_figures(res):
        assert (FAMILIES / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
