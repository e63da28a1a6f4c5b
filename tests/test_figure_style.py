"""Restylable figures: every public figure function takes ax= (one-panel figures), fig= (any
figure) and cmap=, draws on what it is given and returns that Figure; wrong combinations are
clear errors."""
import importlib
import inspect
import pkgutil

import numpy as np
import pytest
from matplotlib.figure import Figure as PlainFigure

import sinklab as sl
import sinklab.viz
from sinklab.viz.figures_sinks import bos_comparison_figure
from sinklab.viz.plots import importance_heatmap
from tests.support.reference_models import SPECS, make_hf_model, save_hf

NOT_FIGURES = {"sinklab.viz.figures_sweep.sweep_figures",   # writes one file per analysis to a folder
               "sinklab.viz.attention_view.attention_html"}  # an HTML page, not a matplotlib figure


def public_functions():
    for info in pkgutil.iter_modules(sinklab.viz.__path__):
        if info.name in ("figure", "reference"):
            continue
        mod = importlib.import_module(f"sinklab.viz.{info.name}")
        for name, fn in vars(mod).items():
            if inspect.isfunction(fn) and not name.startswith("_") and fn.__module__ == mod.__name__:
                yield f"{mod.__name__}.{name}", fn


def test_every_figure_function_takes_ax_fig_and_cmap():
    found = dict(public_functions())
    assert len(found) >= 20
    missing = [n for n, fn in found.items() if n not in NOT_FIGURES
               and not (getattr(fn, "__restylable__", False)
                        and {"ax", "fig", "cmap"} <= set(inspect.signature(fn).parameters))]
    assert missing == []


def test_one_panel_on_the_callers_axes_with_their_colormap():
    imp = np.random.default_rng(0).random((6, 4))
    fig = PlainFigure()
    ax = fig.add_subplot(1, 2, 2)
    got = importance_heatmap(imp, eps=0.3, ax=ax, cmap="cividis")
    assert got is fig and len(ax.images) == 1
    im = ax.images[0]
    assert im.get_cmap().name == "cividis" and np.array_equal(np.asarray(im.get_array()), imp)
    default = importance_heatmap(imp)                      # a new figure, the default colormap
    assert default is not fig and default.axes[0].images[0].get_cmap().name == "viridis"


@pytest.fixture(scope="module")
def comparison(tmp_path_factory):
    m = sl.load(save_hf(make_hf_model(SPECS["mha"]), tmp_path_factory.mktemp("style") / "tiny"))
    return sl.compare_bos(m, ["the cat sat on the mat and the dog ran away to the river"] * 3, T=8, progress=False)


def test_many_panels_into_the_callers_figure(comparison):
    fig = PlainFigure(figsize=(9, 6))
    fig.add_subplot(1, 1, 1).plot([0, 1])                 # what was there is cleared
    got = bos_comparison_figure(comparison, fig=fig, cmap="Greys")
    assert got is fig and len(fig.axes) > 2
    maps = {im.get_cmap().name for a in fig.axes for im in a.images}
    assert maps == {"Greys"}
    with pytest.raises(ValueError, match="pass fig="):
        bos_comparison_figure(comparison, ax=PlainFigure().add_subplot())


def test_bad_combinations():
    imp = np.zeros((2, 2))
    with pytest.raises(ValueError, match="not both"):
        importance_heatmap(imp, ax=PlainFigure().add_subplot(), fig=PlainFigure())
    with pytest.raises(TypeError, match="cmap"):
        importance_heatmap(imp, cmap=3)


def test_log_axes_over_a_narrow_range_have_several_labels():
    from sinklab.viz.figure import readable_log, subplots

    for lo, hi, at_least in ((0.83, 1.08, 4), (0.5, 3.0, 4), (1e-3, 10.0, 4), (3.0, 30.0, 3)):
        fig, ax = subplots()
        ax.plot(np.arange(10), np.linspace(lo, hi, 10))
        ax.set_yscale("log")
        readable_log(ax, "y")
        fig.canvas.draw()
        y0, y1 = ax.get_ylim()
        shown = [t.get_text() for t, v in zip(ax.get_yticklabels(), ax.get_yticks()) if y0 <= v <= y1 and t.get_text()]
        assert at_least <= len(shown) <= 12, (lo, hi, shown)


def test_sink_comparison_figure_explains_its_marks_and_keeps_percent_in_range(comparison):
    fig = bos_comparison_figure(comparison, eps=0.3)
    titles = [a.get_title() for a in fig.axes]
    assert any("· marks mean a₀ > 0.3" in t for t in titles)
    rate = next(a for a in fig.axes if a.get_title() == "per-layer sink rate")
    assert rate.get_xlim() == (0.0, 100.0)
    assert all(float(t).is_integer() for t in rate.get_yticks())             # layers, not 2.5
    hist = next(a for a in fig.axes if a.get_xlabel().startswith("a₀ (all"))
    assert "eps = 0.3" in [t.get_text() for t in hist.get_legend().get_texts()]


def test_identical_curves_are_named_in_the_legend():
    from sinklab.viz.figure import distinct_label

    drawn = {}
    y = np.array([1.0, 2.0, np.nan])
    assert distinct_label("with BOS", y, drawn) == "with BOS"
    assert distinct_label("sink masked", y.copy(), drawn) == "sink masked (= with BOS)"
    assert distinct_label("without BOS", y + 1e-3, drawn) == "without BOS"
