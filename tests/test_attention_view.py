"""Token-labelled attention: the static figure (its images are transformers' attention, its tick
labels the tokens) and the standalone HTML view, opened in a real headless Chromium: the page's
own script, run by the browser, shades each token by the attention the chosen query pays it
(read back from the DOM and compared with transformers), and the page renders (a screenshot)."""
import re

import numpy as np
import pytest
from matplotlib.image import imread

import sinklab as sl
from sinklab.viz.attention_view import attention_html, attention_pattern_figure
from tests.support.browser import headless
from tests.support.reference_models import SPECS, hf_forward, make_hf_model, save_hf

pytestmark = pytest.mark.slow          # starts a browser twice (a few seconds each)
TEXT = "the cat sat on the mat\nand the dog ran away"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    hf = make_hf_model(SPECS["mha"])
    m = sl.load(save_hf(hf, tmp_path_factory.mktemp("view") / "tiny"))
    ids = m.tokenize(TEXT, bos=True)
    return m.run(ids, capture="attn", layers=[1, 2]), hf_forward(hf, ids)["attn"].astype(np.float64)


def test_pattern_figure_is_the_attention_with_token_labels(run):
    tr, ref = run
    fig = attention_pattern_figure(tr, [(1, 0), (2, 3)])
    axes = [a for a in fig.axes if a.images]
    assert len(axes) == 2
    for ax, (l, h) in zip(axes, [(1, 0), (2, 3)]):
        assert np.abs(np.asarray(ax.images[0].get_array()) - ref[l, h]).max() < 1e-5
        shown = [t.replace("\n", "⏎").replace("\t", "⇥").replace(" ", "·") for t in tr.tokens]
        expected = [t if len(t) <= 12 else t[:11] + "…" for t in shown]
        assert [t.get_text() for t in ax.get_xticklabels()] == expected
        assert [t.get_text() for t in ax.get_yticklabels()] == expected
    with pytest.raises(ValueError, match="not captured"):
        attention_pattern_figure(tr, [(0, 0)])


def test_html_view_in_a_real_browser(run, tmp_path):
    tr, ref = run
    page = tmp_path / "view.html"
    assert attention_html(tr, page) == page.read_text()
    q, layer, head = 6, 2, 3
    dom = headless(f"file://{page}#layer={layer}&head={head}&query={q}", "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-1000:]
    shaded = [float(a) for a in re.findall(r'class="tok[^"]*" data-i="\d+" data-a="([^"]+)"', dom.stdout)]
    assert len(shaded) == len(tr.tokens)
    assert np.abs(np.array(shaded) - ref[layer, head, q]).max() < 1e-4 + 1e-5
    assert re.search(rf'class="tok query" data-i="{q}"', dom.stdout)
    shot = tmp_path / "view.png"
    res = headless(f"file://{page}#layer={layer}&head={head}&query={q}", f"--screenshot={shot}",
                   "--window-size=800,400")
    assert res.returncode == 0 and shot.is_file(), res.stderr[-1000:]
    img = imread(shot)[..., :3]
    blue = (img[..., 2] > img[..., 0] + 0.2)                  # the shaded keys: rgba(41, 98, 255, a)
    assert blue.sum() > 50, "the page rendered no shaded token"
