"""The patching experiment (sinklab.analysis.patching_experiment) against a brute-force loop of
Hugging Face transformers fp32 runs with forward hooks (one hooked row per cell, the clean
activations taken from transformers' own clean run), on SmolLM2-135M and IOI-style name swaps;
plus its figure, its report section's reading on synthetic numbers, and its bad inputs."""
import numpy as np
import pytest

from tests.support.patch_reference import hf_patched
from tests.support.reference_models import assert_close, require

torch = require("torch")
require("transformers")

from sinklab.analysis.patching_experiment import name_swap_pairs, patching_experiment  # noqa: E402


@pytest.fixture(scope="module")
def ioi(smollm2_model):
    return name_swap_pairs(smollm2_model, 2)


def hf_acts(hf, ids, over, layers):
    """transformers' clean activations: resid (N, L+1, T, d) or head_out-style per-head outputs
    (N, layer) -> (H, T, d) computed from o_proj's input."""
    rec = {}
    hooks = []
    if over == "resid":
        return hf_patched(hf, ids, [])["resid"]
    for l in layers:
        o = hf.model.layers[l].self_attn.o_proj

        def hook(mod, args, l=l):
            z = args[0]
            H = hf.config.num_attention_heads
            hd = z.shape[-1] // H
            W = mod.weight
            rec[l] = torch.stack([z[..., h * hd:(h + 1) * hd] @ W[:, h * hd:(h + 1) * hd].T for h in range(H)],
                                 dim=1).numpy()                                    # (N, H, T, d)
        hooks.append(o.register_forward_pre_hook(hook))
    try:
        with torch.no_grad():
            hf(input_ids=torch.as_tensor(ids), use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return rec


def brute_force(hf, pairs, over, layers, index):
    clean, corr, ans, wr = pairs
    acts = hf_acts(hf, clean, over, layers)
    diff = lambda lg, n: float(lg[-1, ans[n]] - lg[-1, wr[n]])  # noqa: E731
    ref_clean = hf_patched(hf, clean, [])["logits"]
    ref_corr = hf_patched(hf, corr, [])["logits"]
    out = np.empty((len(clean), len(layers), len(index)))
    for n in range(len(clean)):
        rows, patches = [], []
        for li, l in enumerate(layers):
            for xi, x in enumerate(index):
                r = len(rows)
                rows.append(corr[n])
                if over == "resid":
                    patches.append(dict(point="resid", layer=l, mode="replace", rows=[r], positions=[x], heads=None,
                                        value=acts[n, l, x][None, None]))
                else:
                    T = clean.shape[1]
                    patches.append(dict(point="head_out", layer=l, mode="replace", rows=[r], positions=list(range(T)),
                                        heads=[x], value=acts[l][n, x][None, None]))
        lg = hf_patched(hf, np.stack(rows), patches)["logits"]
        for r, (li, xi) in enumerate((li, xi) for li in range(len(layers)) for xi in range(len(index))):
            out[n, li, xi] = diff(lg[r], n)
    return out, np.array([diff(ref_clean[n], n) for n in range(len(clean))]), \
        np.array([diff(ref_corr[n], n) for n in range(len(clean))])


@pytest.mark.parametrize("over,layers,index", [("resid", [0, 14, 22], [0, 1, 3, 9, 13]),
                                                ("head_out", [5, 20], [0, 4, 8])])
def test_experiment_matches_brute_force(smollm2_model, smollm2_reference, ioi, over, layers, index):
    clean, corr, ans, wr = ioi
    r = patching_experiment(smollm2_model, clean, corr, ans, wr, over=over, layers=layers, index=index,
                            batch=16, progress=False)
    idx = index
    ref, ref_clean, ref_corr = brute_force(smollm2_reference[0], ioi, over, layers, idx)
    scale = max(np.abs(ref).max(), np.abs(ref_clean).max())
    assert_close("patched logit difference", r.patched_diff, ref, 1e-4 * scale / np.abs(ref).max())
    np.testing.assert_allclose(r.clean_diff, ref_clean, atol=1e-4 * scale)
    np.testing.assert_allclose(r.corrupted_diff, ref_corr, atol=1e-4 * scale)
    want = (ref - ref_corr[:, None, None]) / (ref_clean - ref_corr)[:, None, None]
    np.testing.assert_allclose(r.recovered, want, atol=1e-3)
    assert np.all(r.clean_diff > 0) and np.all(r.corrupted_diff < 0)   # the swap flips the answer
    if over == "resid":
        # layer 0, the position where the prompts differ: patching it restores the clean run exactly
        assert list(np.flatnonzero(clean[0] != corr[0])) == [9]
        np.testing.assert_allclose(r.recovered[:, 0, idx.index(9)], 1.0, atol=1e-3)
        # and positions where the prompts agree carry nothing at layer 0
        np.testing.assert_allclose(r.recovered[:, 0, [0, 1, 2, 4]], 0.0, atol=1e-4)
    assert r.mean.shape == (len(layers), len(idx)) and np.all(r.lo <= r.mean + 1e-12)


def test_figure_and_bad_inputs(smollm2_model, ioi):
    from sinklab.viz.figures_patching import patching_figure

    clean, corr, ans, wr = ioi
    r = patching_experiment(smollm2_model, clean, corr, ans, wr, layers=[0, 20], index=[0, 9], progress=False)
    fig = patching_figure(r, annotate=True)
    assert fig.axes and fig.axes[0].get_images()
    m = smollm2_model
    with pytest.raises(ValueError, match="same"):
        patching_experiment(m, clean, corr[:, :-1], ans, wr, progress=False)
    with pytest.raises(ValueError, match="over="):
        patching_experiment(m, clean, corr, ans, wr, over="mlp", progress=False)
    with pytest.raises(ValueError, match="layers"):
        patching_experiment(m, clean, corr, ans, wr, over="attn_out", layers=[m.config.n_layers], progress=False)
    with pytest.raises(ValueError, match="heads"):
        patching_experiment(m, clean, corr, ans, wr, over="z", index=[99], progress=False)
    with pytest.raises(ValueError, match="answer"):
        patching_experiment(m, clean, corr, [1, 2, 3], wr, progress=False)


def test_report_readings_follow_the_intervals():
    """The section's criteria on synthetic results: which cell first has its interval above 0.5,
    from which layer the last position carries the answer, and what position 0 carries."""
    from sinklab.report import beyond_patching as BP

    iv = lambda v, lo, hi: {"value": v, "lo": lo, "hi": hi, "n": 4, "level": 0.95, "method": "bootstrap"}  # noqa
    lo = np.array([[0.0, 0.0, 0.9, 0.0], [0.0, 0.0, 0.4, 0.2], [0.0, 0.0, 0.0, 0.6]])
    res = {"layers": [0, 2, 4], "lo": lo, "tokens": ["a", "b", "c", "d"],
           "last": [iv(0.1, 0.0, 0.2), iv(0.5, 0.2, 0.7), iv(0.8, 0.6, 0.9)],
           "pos0": [iv(0.0, 0.0, 0.0)] * 3, "differing_positions": [2]}
    assert BP.first_above(res) == {"layer": 0, "position": 2}
    assert BP.last_position_layer(res) == 4
    assert BP.sink_share(res) == "none"
    res["pos0"] = [iv(0.0, 0.0, 0.0), iv(0.2, 0.1, 0.3), iv(0.0, 0.0, 0.0)]
    assert BP.sink_share(res) == "some" and "carries some" in BP.reading("m", res)
    res["pos0"] = [iv(0.02, -0.1, 0.2)] * 3
    assert BP.sink_share(res) == "undetermined"
    res["lo"] = np.full_like(lo, 0.1)
    res["last"] = [iv(0.3, 0.1, 0.6)] * 3
    assert BP.first_above(res) is None and BP.last_position_layer(res) is None
    assert "no cell's interval" in BP.reading("m", res)
