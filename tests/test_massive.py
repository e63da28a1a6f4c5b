"""Massive activations (sinklab.analysis.massive) against a planted ground truth and against
Hugging Face transformers (fp32 eager) on the same weights.

The planted model is a random tiny LLaMA (tests/support/reference_models.py, spec "mha") edited
so that exactly one MLP neuron of layer 1 fires, and only on position 0 (the ⟨bos⟩):

- the ⟨bos⟩ embedding carries a large value in dimension IN_DIM, every other token 0 there, and
  layer 0's and layer 1's attention and layer 0's MLP write nothing into IN_DIM, so the MLP input
  of layer 1 has IN_DIM = 0 at every position but 0;
- neuron NEURON of layer 1 reads only IN_DIM (gate and up), no other neuron reads it, and it
  writes only dimension OUT_DIM (down_proj column), with a large weight.

So the analysis must find: the norm jump at layer 1, written by the MLP, by neuron NEURON, in
dimension OUT_DIM at position 0 of streams 2 and 3. The unplanted model is the negative control.
"""
import dataclasses

import numpy as np
import pytest

from tests.support.reference_models import BOS_ID, SPECS, hf_forward, make_hf_model, random_ids, require, save_hf

torch = require("torch")
transformers = require("transformers")

import sinklab as sl  # noqa: E402
from sinklab.analysis.massive import MassiveActivations, massive_activations, mlp_neurons  # noqa: E402

IN_DIM, OUT_DIM, NEURON, LAYER = 7, 13, 42, 1
T = 16


def plant(hf):
    """Edits ``hf`` in place (see the module docstring)."""
    m = hf.model
    with torch.no_grad():
        m.embed_tokens.weight[:, IN_DIM] = 0.0
        m.embed_tokens.weight[BOS_ID, IN_DIM] = 30.0
        for l in (0, 1):
            m.layers[l].self_attn.o_proj.weight[IN_DIM, :] = 0.0
        m.layers[0].mlp.down_proj.weight[IN_DIM, :] = 0.0
        mlp = m.layers[LAYER].mlp
        m.layers[LAYER].post_attention_layernorm.weight[IN_DIM] = 1.0
        for w in (mlp.gate_proj.weight, mlp.up_proj.weight):
            w[:, IN_DIM] = 0.0
            w[NEURON, :] = 0.0
            w[NEURON, IN_DIM] = 2.0
        mlp.down_proj.weight[:, NEURON] = 0.0
        mlp.down_proj.weight[OUT_DIM, NEURON] = 1.0
    return hf


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    hf = plant(make_hf_model(SPECS["mha"]))
    return hf, sl.load(str(save_hf(hf, tmp_path_factory.mktemp("planted"))))


@pytest.fixture(scope="module")
def control(tmp_path_factory):
    hf = make_hf_model(SPECS["mha"])
    return hf, sl.load(str(save_hf(hf, tmp_path_factory.mktemp("control"))))


def prompts(n=6):
    return [random_ids(SPECS["mha"].vocab_size, T, seed=s, bos=False) for s in range(n)]


def test_planted_neuron_is_found(planted):
    hf, model = planted
    r = massive_activations(model, prompts(), T=T, top=4, progress=False)
    assert r.jump_layer == LAYER
    assert r.writer == "mlp"
    assert r.mlp_norm0[:, LAYER].min() > 10 * r.attn_norm0[:, LAYER].max()
    assert int(r.neurons[0]) == NEURON
    assert r.neuron_share[:, 0].min() > 0.95                   # it writes (almost) all of the MLP output
    assert r.neuron_check <= 1e-4                               # NumPy neurons reproduce the C mlp_out
    for stream in (LAYER + 1, LAYER + 2):
        assert (r.top_pos[:, stream, 0] == 0).all() and (r.top_dim[:, stream, 0] == OUT_DIM).all()
        assert r.top_dims(stream, 1) == [OUT_DIM]
        assert r.top_at_bos[stream] == 1.0
        assert r.dim_frequency[stream, OUT_DIM] == 1.0
    assert r.top_ratio[:, LAYER + 1].min() > 50
    assert r.norm_jump[:, LAYER].min() > 4


def test_negative_control_has_no_planted_neuron(control):
    hf, model = control
    r = massive_activations(model, prompts(), T=T, top=4, progress=False)
    assert r.top_ratio.max() < 50
    assert not (r.jump_layer == LAYER and r.neurons is not None and int(r.neurons[0]) == NEURON)
    assert r.dim_frequency[LAYER + 1, OUT_DIM] < 1.0


def test_neuron_sum_reproduces_captured_mlp_out(planted, control):
    for _, model in (planted, control):
        ids = np.concatenate([[BOS_ID], prompts(1)[0][:T - 1]])
        tr = model.run(ids, capture=("resid", "attn_out", "mlp_out"))
        for l in range(model.config.n_layers):
            for pos in (0, 5):
                a, C, b = mlp_neurons(model, l, tr.resid[l, pos].astype(np.float64) + tr.attn_out[l, pos])
                ref = tr.mlp_out[l, pos].astype(np.float64)
                assert np.linalg.norm(C.sum(0) + b - ref) <= 1e-4 * np.linalg.norm(ref)


def test_against_transformers_hidden_states_and_neurons(planted):
    hf, model = planted
    ps = prompts(3)
    r = massive_activations(model, ps, T=T, top=4, progress=False)
    acts = {}
    h = hf.model.layers[LAYER].mlp.down_proj.register_forward_pre_hook(lambda m, a: acts.__setitem__("a", a[0][0]))
    try:
        for p, ids in enumerate(ps):
            seq = np.concatenate([[BOS_ID], ids[:T - 1]])
            ref = hf_forward(hf, seq)["resid"].astype(np.float64)          # (L+1, T, d)
            for l in range(ref.shape[0]):
                got = r.top_value[p, l]
                want = ref[l, r.top_pos[p, l], r.top_dim[p, l]]
                assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
                # the top entry is HF's largest |x| too
                assert abs(abs(got[0]) - np.abs(ref[l]).max()) <= 1e-4 * np.abs(ref[l]).max()
                assert abs(r.median_abs[p, l] - np.median(np.abs(ref[l]))) <= 1e-4 * np.median(np.abs(ref[l]))
            a_ref = acts["a"][0, r.neurons].double().numpy()            # HF's neuron activations at position 0
            assert np.abs(r.neuron_act[p] - a_ref).max() <= 1e-4 * np.abs(a_ref).max()
    finally:
        h.remove()


def test_save_load_roundtrip(planted, tmp_path):
    _, model = planted
    r = massive_activations(model, prompts(3), T=T, top=3, progress=False)
    r2 = MassiveActivations.load(r.save(tmp_path / "m.npz"))
    r3 = MassiveActivations.from_dict(r.to_dict())
    for other in (r2, r3):
        assert other.jump_layer == r.jump_layer and other.writer == r.writer
        np.testing.assert_array_equal(other.top_value, r.top_value)
        np.testing.assert_array_equal(other.neurons, r.neurons)
        assert other.summary() == r.summary()


def test_bad_inputs(planted, monkeypatch):
    _, model = planted
    with pytest.raises(ValueError, match="context length"):
        massive_activations(model, prompts(2), T=10_000, progress=False)
    with pytest.raises(ValueError, match="top"):
        massive_activations(model, prompts(2), T=T, top=0, progress=False)
    with pytest.raises(ValueError, match="fewer than"):
        massive_activations(model, [np.arange(3, 6)], T=T, progress=False)
    r = massive_activations(model, prompts(2), T=T, progress=False)
    with pytest.raises(ValueError, match="layer"):
        r.ratio_ci(99)
    with pytest.raises(ValueError, match="layer"):
        r.top_dims(-1)
    monkeypatch.setattr(model, "config", dataclasses.replace(model.config, bos_token_id=None))
    with pytest.raises(ValueError, match="no BOS"):
        massive_activations(model, prompts(2), T=T, progress=False)


def test_figure(planted):
    _, model = planted
    from matplotlib.figure import Figure

    from sinklab.viz.figures_beyond import massive_activations_figure

    r = massive_activations(model, prompts(3), T=T, progress=False)
    fig = massive_activations_figure(r)
    assert isinstance(fig, Figure)
    fig2, ax = sl.viz.figure.subplots(1, 2)
    assert massive_activations_figure(r, ax=ax[0]) is fig2


@pytest.mark.slow
def test_smollm2_top_values_match_transformers(smollm2_model, smollm2_reference):
    hf, _ = smollm2_reference
    model = smollm2_model
    texts = sl.load_passages("sinks")[:2]
    r = massive_activations(model, texts, T=32, top=4, progress=False)
    L = model.config.n_layers
    for p, text in enumerate(texts):
        seq = np.concatenate([[model.config.bos_token_id], model.tokenize(text)[:31]])
        ref = hf_forward(hf, seq)["resid"].astype(np.float64)
        for l in range(L + 1):
            want = ref[l, r.top_pos[p, l], r.top_dim[p, l]]
            assert np.abs(r.top_value[p, l] - want).max() <= 1e-4 * np.abs(want).max(), l
    assert r.neuron_check <= 1e-4
    # the massive activations of SmolLM2 sit on the <bos> after the jump layer
    assert r.top_at_bos[r.jump_layer + 1:].min() == 1.0
