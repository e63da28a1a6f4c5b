"""The sink's key geometry (sinklab.analysis.key_geometry): the split of the mean logit gap holds
exactly, every quantity equals a loop over its definition in float64, the logits formed from the
captured q/k (after RoPE, GQA heads mapped to kv heads) reproduce the captured attention through
a softmax, a_0 equals the one computed from the captured attention, and scaling k_0's norm by
construction raises the norm share while leaving the angle term unchanged."""
import dataclasses
import math

import numpy as np
import pytest

from tests.support.reference_models import BOS_ID, SPECS, make_hf_model, random_ids, require, save_hf

torch = require("torch")
transformers = require("transformers")

import sinklab as sl  # noqa: E402
from sinklab.analysis.key_geometry import KeyGeometry, geometry_of, key_geometry  # noqa: E402

T = 16


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    hf = make_hf_model(SPECS["gqa_tied"])                # GQA: 6 query heads on 2 kv heads
    return hf, sl.load(str(save_hf(hf, tmp_path_factory.mktemp("gqa_tied"))))


@pytest.fixture(scope="module")
def tiny(tiny_pair):
    return tiny_pair[1]


def hf_qk(hf, ids):
    """transformers' q (L, H, T, hd) and k (L, G, T, hd) after RoPE, float64: the q_proj / k_proj
    outputs (forward hooks) rotated by HF's own rotary embedding and apply_rotary_pos_emb."""
    from transformers.models.llama import modeling_llama as ml

    cfg = hf.config
    H, G = cfg.num_attention_heads, cfg.num_key_value_heads
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // H
    got, hooks = {}, []
    for l, layer in enumerate(hf.model.layers):
        a = layer.self_attn
        hooks.append(a.q_proj.register_forward_hook(lambda m, i, o, l=l: got.__setitem__(("q", l), o)))
        hooks.append(a.k_proj.register_forward_hook(lambda m, i, o, l=l: got.__setitem__(("k", l), o)))
    try:
        x = torch.from_numpy(np.asarray(ids, np.int64))[None]
        with torch.no_grad():
            hf(input_ids=x, use_cache=False)
            pos = torch.arange(x.shape[1])[None]
            cos, sin = hf.model.rotary_emb(got[("q", 0)], pos)
            qs, ks = [], []
            for l in range(len(hf.model.layers)):
                q = got[("q", l)].view(1, -1, H, hd).transpose(1, 2)
                k = got[("k", l)].view(1, -1, G, hd).transpose(1, 2)
                q, k = ml.apply_rotary_pos_emb(q, k, cos, sin)
                qs.append(q[0].double().numpy())
                ks.append(k[0].double().numpy())
    finally:
        for h in hooks:
            h.remove()
    return np.stack(qs), np.stack(ks)


def prompts(vocab, n=4, t=T):
    return [random_ids(vocab, t, seed=s, bos=False) for s in range(n)]


def loop_definitions(q, k, scale, layer, head, H, G):
    """The module docstring's definitions, one head, by explicit loops in float64."""
    g = head // (H // G)
    qq, kk = q[layer, head].astype(np.float64), k[layer, g].astype(np.float64)
    n = qq.shape[0]
    cos = lambda a, b: float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))  # noqa: E731
    I = range(1, n)
    pairs = [(i, j) for i in I for j in range(1, i + 1)]
    S0 = np.mean([scale * qq[i] @ kk[0] for i in I])
    S1 = np.mean([scale * qq[i] @ kk[j] for i, j in pairs])
    n0, N1 = np.linalg.norm(kk[0]), np.mean([np.linalg.norm(kk[j]) for _, j in pairs])
    c0 = [cos(qq[i], kk[0]) for i in I]
    return {"sink_logit": S0, "other_logit": S1, "k0_norm": n0, "other_key_norm": N1,
            "kj_norm": np.mean([np.linalg.norm(kk[j]) for j in range(1, n)]),
            "cos0_mean": np.mean(c0), "cos0_std": np.std(c0),
            "cosj_mean": np.mean([cos(qq[i], kk[j]) for i, j in pairs]),
            "norm_term": (n0 - N1) * S0 / n0, "angle_term": N1 * (S0 / n0 - S1 / N1)}


def check_model(model, seqs, heads):
    c = model.config
    scale = c.attn_scale if c.attn_scale is not None else c.head_dim ** -0.5
    r = key_geometry(model, seqs, T=len(seqs[0]) + 1, check_attn=True, progress=False)
    assert r.attn_check <= 1e-5                                        # softmax(formed logits) == captured attn
    gap = r.gap
    assert np.abs(gap - (r.norm_term + r.angle_term)).max() <= 1e-12 * max(1.0, np.abs(gap).max())
    for p, s in enumerate(seqs[:2]):
        ids = np.concatenate([[c.bos_token_id], s])
        tr = model.run(ids, capture=("q", "k", "attn"))
        np.testing.assert_allclose(r.a0[p], sl.first_token_importance(tr.attn), atol=1e-5)
        for l, h in heads:
            want = loop_definitions(tr.q, tr.k, scale, l, h, c.n_heads, c.n_kv_heads)
            for name, v in want.items():
                assert abs(getattr(r, name)[p, l, h] - v) <= 1e-9 * max(1.0, abs(v)), (name, l, h)
    return r


def test_definitions_identity_and_attention_tiny(tiny):
    check_model(tiny, prompts(tiny.config.vocab_size), [(0, 0), (1, 4), (3, 5)])


@pytest.mark.slow
def test_definitions_identity_and_attention_smollm2(smollm2_model):
    m = smollm2_model
    seqs = [m.tokenize(t)[:31] for t in sl.load_passages("sinks")[:3]]
    r = check_model(m, seqs, [(0, 0), (18, 8), (29, 8)])
    l, h = r.strongest(1)[0]
    assert r.a0[:, l, h].mean() > 0.9                                  # SmolLM2 has strong sink heads


def test_matches_transformers_q_and_k(tiny_pair):
    """Every quantity from sinklab's captures equals the same definitions applied to
    transformers' own post-RoPE q and k (float64 recomputation) to 1e-4 relative."""
    hf, model = tiny_pair
    seqs = prompts(model.config.vocab_size, 3)
    r = key_geometry(model, seqs, T=T, progress=False)
    for p, s in enumerate(seqs):
        q, k = hf_qk(hf, np.concatenate([[BOS_ID], s[:T - 1]]))
        ref = geometry_of(q, k, model.config.head_dim ** -0.5)
        for name, v in ref.items():
            got = getattr(r, name)[p]
            assert np.abs(got - v).max() <= 1e-4 * max(1.0, np.abs(v).max()), name
        c = model.config
        for l, h in ((0, 1), (2, 3), (3, 5)):                     # and by the loops, on HF's q/k
            for name, v in loop_definitions(q, k, c.head_dim ** -0.5, l, h, c.n_heads, c.n_kv_heads).items():
                assert abs(getattr(r, name)[p, l, h] - v) <= 1e-4 * max(1.0, abs(v)), (name, l, h)


def test_scaling_k0_raises_norm_share(tiny):
    """By construction: the same captures with k_0 multiplied by c = 10 (what a sink key of 10x the
    norm at the same angle would give). The angle term must stay put, the norm term become
    (c n_0 - N_1) C_0, and the norm share rise wherever |c n_0 - N_1| > |n_0 - N_1|."""
    c = tiny.config
    scale = c.head_dim ** -0.5
    ids = np.concatenate([[BOS_ID], prompts(c.vocab_size, 1)[0][:T - 1]])
    tr = tiny.run(ids, capture=("q", "k"))
    base = geometry_of(tr.q, tr.k, scale)
    k2 = tr.k.astype(np.float64).copy()
    k2[:, :, 0] *= 10.0
    big = geometry_of(tr.q, k2, scale)
    np.testing.assert_allclose(big["angle_term"], base["angle_term"], rtol=1e-10, atol=1e-12)
    n0, N1 = base["k0_norm"], base["other_key_norm"]
    C0 = base["sink_logit"] / n0
    np.testing.assert_allclose(big["norm_term"], (10 * n0 - N1) * C0, rtol=1e-10, atol=1e-12)
    share = lambda g: np.abs(g["norm_term"]) / (np.abs(g["norm_term"]) + np.abs(g["angle_term"]))  # noqa: E731
    rises = np.abs(10 * n0 - N1) > np.abs(n0 - N1)
    assert rises.mean() > 0.5
    assert (share(big)[rises] > share(base)[rises]).all()
    assert share(big).mean() > share(base).mean()


def test_save_load_summary_and_figure(tiny, tmp_path):
    r = key_geometry(tiny, prompts(tiny.config.vocab_size, 3), T=T, progress=False)
    for other in (KeyGeometry.load(r.save(tmp_path / "k.npz")), KeyGeometry.from_dict(r.to_dict())):
        np.testing.assert_array_equal(other.norm_term, r.norm_term)
        assert other.summary() == r.summary()
    s = r.head_summary(*r.strongest(1)[0])
    assert 0 <= s["norm_share"]["value"] <= 1
    from matplotlib.figure import Figure

    from sinklab.viz.figures_beyond import sink_map_figure
    assert isinstance(sink_map_figure(r), Figure)
    fig, ax = sl.viz.figure.subplots()
    assert sink_map_figure(r, ax=ax, annotate=False) is fig


def test_bad_inputs(tiny, monkeypatch):
    v = tiny.config.vocab_size
    with pytest.raises(ValueError, match="context length"):
        key_geometry(tiny, prompts(v, 2), T=100_000, progress=False)
    with pytest.raises(ValueError, match="at least 2"):
        key_geometry(tiny, prompts(v, 2), T=1, progress=False)
    r = key_geometry(tiny, prompts(v, 2), T=T, progress=False)
    with pytest.raises(ValueError, match="layer"):
        r.head_summary(99, 0)
    with pytest.raises(ValueError, match="head"):
        r.head_summary(0, -1)
    monkeypatch.setattr(tiny, "config", dataclasses.replace(tiny.config, window=[4] * tiny.config.n_layers))
    with pytest.raises(ValueError, match="sliding window"):
        key_geometry(tiny, prompts(v, 2), T=T, progress=False)
    monkeypatch.setattr(tiny, "config", dataclasses.replace(tiny.config, bos_token_id=None, window=None))
    with pytest.raises(ValueError, match="no BOS"):
        key_geometry(tiny, prompts(v, 2), T=T, progress=False)
