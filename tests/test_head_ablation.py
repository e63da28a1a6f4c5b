"""Sink-head ablation (:func:`sinklab.analysis.head_ablation.head_ablation`) on SmolLM2 against
transformers' fp32 eager forward of the same weights: the heads' first-token importance from its
attention probabilities, and every condition's NLL and top-1 accuracy with a forward pre-hook that
zeroes the same heads' outputs before o_proj."""
import numpy as np
import pytest

from sinklab.analysis.head_ablation import head_ablation, matched_random_heads, top_sink_heads
from sinklab.analysis.massive import sequences
from sinklab.analysis.quality import nll_rows
from sinklab.prompts import load_passages
from tests.support import reference_models as rm

T, P = 48, 3


@pytest.fixture(scope="module")
def result(smollm2_model):
    return head_ablation(smollm2_model, load_passages("sinks")[:P], T=T, n_top=4, draws=3, progress=False)


@pytest.fixture(scope="module")
def seqs(smollm2_model, result):
    return sequences(smollm2_model, load_passages("sinks")[:P], T, result.bos, skip_short=True)[0]


def hf_run(ref_model, ids, heads, attentions=False):
    """logits (T, V) with heads [(layer, head)] writing zero before o_proj, and attentions."""
    torch = rm.require("torch")
    H = ref_model.config.num_attention_heads
    hooks = []
    for layer in sorted({int(h[0]) for h in heads}):
        zero = [int(h[1]) for h in heads if int(h[0]) == layer]

        def pre(_mod, args, zero=zero):
            x = args[0].clone()
            B, n, d = x.shape
            x = x.view(B, n, H, d // H)
            x[:, :, zero] = 0.0
            return (x.view(B, n, d),)
        hooks.append(ref_model.model.layers[layer].self_attn.o_proj.register_forward_pre_hook(pre))
    try:
        with torch.no_grad():
            out = ref_model(input_ids=torch.from_numpy(np.asarray(ids, np.int64)[None]), output_attentions=attentions,
                            use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    attn = np.stack([a[0].float().numpy() for a in out.attentions]) if attentions else None
    return out.logits[0].float().numpy(), attn


@pytest.fixture(scope="module")
def hf(smollm2_reference, result, seqs):
    conds = {"base": np.zeros((0, 2), int), "sink": result.sink_heads}
    conds.update({f"random_{d}": r for d, r in enumerate(result.random_heads)})
    nll, acc, a0 = {}, {}, 0.0
    for name, heads in conds.items():
        nll[name], acc[name] = [], []
        for ids in seqs:
            logits, attn = hf_run(smollm2_reference[0], ids, heads, attentions=name == "base")
            nll[name].append(nll_rows(logits[:-1], ids[1:]).mean())
            acc[name].append(np.mean(np.argmax(logits[:-1], 1) == ids[1:]))
            if name == "base":
                a0 = a0 + attn[:, :, :, 0].astype(np.float64).mean(-1) / len(seqs)
    return nll, acc, a0


def test_first_token_importance_and_head_choice(result, hf):
    _, _, a0 = hf
    assert np.max(np.abs(result.a0 - a0)) < 1e-4
    sink = a0 > result.eps
    assert result.n_sink_total == int(sink.sum())
    chosen = {tuple(h) for h in result.sink_heads.tolist()}
    assert len(chosen) == result.n == 4 and all(sink[l, h] for l, h in chosen)
    # the top 4 by the reference's a0, except heads of layers with no non-sink head left to
    # match them (SmolLM2 has layers where every head is a sink head)
    spare = (~sink).sum(axis=1)
    used = np.bincount(result.sink_heads[:, 0], minlength=a0.shape[0])
    floor = min(a0[l, h] for l, h in chosen)
    for l, h in zip(*np.nonzero(sink)):
        if (l, h) not in chosen and a0[l, h] > floor + 2e-4:
            assert used[l] == spare[l], f"head {(l, h)} (a0 {a0[l, h]:.3f}) skipped though layer {l} had a match"
    for draw in result.random_heads:
        assert all(not sink[l, h] for l, h in draw.tolist())
        assert sorted(draw[:, 0].tolist()) == sorted(result.sink_heads[:, 0].tolist())  # matched histogram
        assert len({tuple(h) for h in draw.tolist()}) == len(draw)


def test_every_condition_matches_transformers_hooked(result, hf):
    nll, acc, _ = hf
    np.testing.assert_allclose(result.nll_base, nll["base"], atol=2e-4)
    np.testing.assert_allclose(result.nll_sink, nll["sink"], atol=2e-4)
    for d in range(len(result.random_heads)):
        np.testing.assert_allclose(result.nll_random[d], nll[f"random_{d}"], atol=2e-4)
    np.testing.assert_allclose(result.acc_sink, acc["sink"], atol=1.5 / (T - 1))
    assert np.any(np.abs(np.asarray(nll["sink"]) - np.asarray(nll["base"])) > 1e-3)  # the ablation does something
    d = np.asarray(nll["sink"]) - np.asarray([nll[f"random_{i}"] for i in range(3)]).mean(0)
    assert result.dnll_difference().value == pytest.approx(d.mean(), abs=2e-4)


def test_greedy_choice_leaves_a_match_in_every_layer():
    a0 = np.array([[0.9, 0.8, 0.7, 0.1],    # layer 0: one non-sink head, so only one sink head
                   [0.6, 0.2, 0.1, 0.05]])  # layer 1: three non-sink heads
    heads = top_sink_heads(a0, 0.3, 3)
    assert heads.tolist() == [[0, 0], [1, 0]]
    r = matched_random_heads(a0, 0.3, heads, np.random.default_rng(0))
    assert sorted(r.tolist())[0] == [0, 3] and r[1, 0] == 1 and a0[1, r[1, 1]] <= 0.3
    assert top_sink_heads(np.full((2, 4), 0.2), 0.3, 3).shape == (0, 2)  # no sink head: nothing to ablate


@pytest.mark.parametrize("kw, match", [(dict(eps=0.0), "eps"), (dict(draws=0), "draws"), (dict(n_top=0), "n_top")])
def test_bad_arguments(smollm2_model, kw, match):
    with pytest.raises(ValueError, match=match):
        head_ablation(smollm2_model, load_passages("sinks")[:2], T=16, draws=kw.pop("draws", 1), progress=False, **kw)


def test_report_section_reading_follows_the_interval(smollm2_model, monkeypatch):
    from sinklab.analysis.stats import Interval
    from sinklab.report import beyond_ablation as BA

    iv = lambda lo, hi: Interval((lo + hi) / 2, lo, hi, 6).to_dict()  # noqa: E731
    assert BA.comparison({"dnll_difference": iv(0.1, 0.3)}) == "more"
    assert BA.comparison({"dnll_difference": iv(-0.3, -0.1)}) == "less"
    assert BA.comparison({"dnll_difference": iv(-0.1, 0.1)}) == "no detectable difference"
    monkeypatch.setattr(BA, "settings", lambda quick: {"n_prompts": 2, "T": 24, "n_top": 2, "draws": 2})
    res = BA.compute(smollm2_model, True, False)
    md = BA.markdown({"m": res})
    assert md.count("**Reading.**") == 1 and BA.comparison(res) in md
    assert Interval.from_dict(res["dnll_sink"]).value == pytest.approx(
        np.mean(np.asarray(res["nll_sink"]) - np.asarray(res["nll_base"])))
    assert set(BA.figures({"m": res})) == {"beyond_ablation.png"}
    mean = res["mean"]                     # mean-ablation of the same heads, its own reading and row
    assert mean["ablation"] == "mean" and mean["sink_heads"] == res["sink_heads"]
    assert mean["nll_base"] == res["nll_base"] and mean["nll_sink"] != res["nll_sink"]
    assert "mean-ablating" in md and md.count("| mean |") == 1 and md.count("| zero |") == 1
    assert Interval.from_dict(mean["dnll_difference"]).value == pytest.approx(
        np.mean(np.asarray(mean["nll_sink"]) - np.asarray(mean["nll_random"]).mean(axis=0)))


def hf_mean_run(ref_model, seqs, ref_seqs, conds):
    """Per condition the NLL per prompt of seqs, each condition's heads' o_proj inputs replaced at
    every position by their mean over the reference sequences' positions, unhooked."""
    torch = rm.require("torch")
    H = ref_model.config.num_attention_heads
    L = ref_model.config.num_hidden_layers
    sums, hooks = {}, []

    def grab(layer):
        def pre(_mod, args):
            x = args[0][0].double()
            sums[layer] = sums.get(layer, 0.0) + x.view(x.shape[0], H, -1).sum(0)
        return pre
    for layer in range(L):
        hooks.append(ref_model.model.layers[layer].self_attn.o_proj.register_forward_pre_hook(grab(layer)))
    try:
        with torch.no_grad():
            for ids in ref_seqs:
                ref_model(input_ids=torch.from_numpy(np.asarray(ids, np.int64)[None]), use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    mean = {l: (sums[l] / (len(ref_seqs) * ref_seqs.shape[1])).float() for l in sums}
    out = {}
    for name, heads in conds.items():
        hooks = []
        for layer in sorted({int(h[0]) for h in heads}):
            hs = [int(h[1]) for h in heads if int(h[0]) == layer]

            def pre(_mod, args, hs=hs, layer=layer):
                x = args[0].clone()
                B, n, d = x.shape
                x = x.view(B, n, H, d // H)
                x[:, :, hs] = mean[layer][hs]
                return (x.view(B, n, d),)
            hooks.append(ref_model.model.layers[layer].self_attn.o_proj.register_forward_pre_hook(pre))
        try:
            with torch.no_grad():
                out[name] = [nll_rows(ref_model(input_ids=torch.from_numpy(np.asarray(ids, np.int64)[None]),
                                                use_cache=False).logits[0].float().numpy()[:-1], ids[1:]).mean()
                             for ids in seqs]
        finally:
            for h in hooks:
                h.remove()
    return out


def test_mean_ablation_matches_transformers_with_mean_outputs(smollm2_model, smollm2_reference, seqs):
    """ablation="mean": the heads' o_proj inputs replaced by their means over the reference
    prompts' positions, as a transformers pre-hook computes them from its own unablated forward."""
    reference = load_passages("heldout")[:4]
    r = head_ablation(smollm2_model, load_passages("sinks")[:P], T=T, n_top=4, draws=2, progress=False,
                      ablation="mean", mean_prompts=reference)
    assert r.ablation == "mean" and r.to_dict()["ablation"] == "mean"
    conds = {"sink": r.sink_heads, **{f"random_{d}": x for d, x in enumerate(r.random_heads)}}
    ref_seqs = sequences(smollm2_model, reference, T, r.bos, skip_short=True)[0]
    assert len(ref_seqs) == 4
    ref = hf_mean_run(smollm2_reference[0], seqs, ref_seqs, conds)
    np.testing.assert_allclose(r.nll_sink, ref["sink"], atol=2e-4)
    for d in range(len(r.random_heads)):
        np.testing.assert_allclose(r.nll_random[d], ref[f"random_{d}"], atol=2e-4)
    zero = head_ablation(smollm2_model, load_passages("sinks")[:P], T=T, n_top=4, draws=1, progress=False)
    assert np.any(np.abs(r.nll_sink - zero.nll_sink) > 1e-3)   # the mean is not the zero ablation
    with pytest.raises(ValueError, match="ablation"):
        head_ablation(smollm2_model, load_passages("sinks")[:2], T=16, draws=1, progress=False, ablation="resample")
