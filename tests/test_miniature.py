"""The miniature search's reading of a run (sinklab.train.miniature): what removing ⟨bos⟩ costs
a trained checkpoint, per held-out document, against transformers' LlamaForCausalLM loaded from
the same checkpoint (float64 log-softmax), its interval, the verdict's thresholds, and the rows
of finished and unfinished runs."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from sinklab.train import checkpoint as ck
from sinklab.train import miniature as mini
from sinklab.train.evaluate import eval_documents
from sinklab.train.run import TrainConfig, train
from tests.support.reference_models import require

CFG = dict(d_model=32, n_layers=1, n_heads=2, context=32, tokens_per_step=128, steps=4, eval_every=4,
           eval_docs=5, eval_windows=2, fixed_bos=True, lr=1e-2, warmup_steps=1, seed=3)


@pytest.fixture(scope="module")
def tiny_run(training_corpus, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("mini") / "runs" / "train-tiny")
    train(TrainConfig(**CFG, out_dir=out), progress=False, corpus=training_corpus)
    return out


def _hf_doc_nll(path, docs, C, bos_id, with_bos):
    torch = require("torch")
    transformers = require("transformers")
    hf = transformers.LlamaForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    out = []
    for d in docs:
        x = np.asarray(d[:C - 1], np.int64)
        ids = np.concatenate([[bos_id], x]) if with_bos else x
        with torch.no_grad():
            logits = hf(input_ids=torch.from_numpy(ids)[None]).logits[0].double()
        lp = torch.log_softmax(logits, -1).numpy()
        first = 1 if with_bos else 0           # the row that predicts x[1]
        rows = lp[first:first + len(x) - 1]
        out.append(-rows[np.arange(len(x) - 1), x[1:]].mean())
    return np.array(out)


def test_bos_dependence_matches_transformers(tiny_run, training_corpus):
    dep = mini.bos_dependence(tiny_run, training_corpus)
    docs = eval_documents(training_corpus.heldout_documents(), CFG["eval_docs"])
    path = ck.latest_checkpoint(tiny_run)
    bos = _hf_doc_nll(path, docs, CFG["context"], training_corpus.bos_id, True)
    text = _hf_doc_nll(path, docs, CFG["context"], training_corpus.bos_id, False)
    assert dep["n_docs"] == len(docs) == CFG["eval_docs"] and dep["step"] == CFG["steps"]
    np.testing.assert_allclose(dep["per_doc_bos"], bos, rtol=1e-5)
    np.testing.assert_allclose(dep["per_doc_text"], text, rtol=1e-5)
    assert dep["delta"].value == pytest.approx(float(np.mean(text - bos)), abs=1e-5)
    assert dep["delta"].lo <= dep["delta"].value <= dep["delta"].hi and dep["delta"].n == len(docs)


def test_verdict_thresholds():
    assert mini.dependence_verdict(0.30, 0.50) == "meets the targets"
    assert mini.dependence_verdict(0.29, 0.60) == "depends, below the targets"
    assert mini.dependence_verdict(0.90, 0.49) == "depends, below the targets"
    assert mini.dependence_verdict(0.90, 0.0) == "does not depend"
    assert mini.dependence_verdict(0.0, -0.2) == "does not depend"


def test_rows_of_finished_and_unfinished_runs(tiny_run, training_corpus, tmp_path):
    sweep = tiny_run.rsplit("/runs/", 1)[0]
    rows = mini.search_rows([sweep], training_corpus, progress=False, threads=1)
    assert len(rows) == 1
    r = rows[0]
    assert r["tokens"] == CFG["steps"] * CFG["tokens_per_step"] and r["threads"] == 1
    assert r["epochs"] == pytest.approx(r["tokens"] / len(training_corpus.train_tokens))
    assert r["a0_uniform"] == pytest.approx(sum(1 / (i + 1) for i in range(32)) / 32)   # T = min(64, C)
    assert "| 32 × 1 × 2 seed 3 |" in mini.search_markdown(rows)      # seed 3: named; fixed <bos>: not
    assert "| 32 × 1 × 2 no fixed ⟨bos⟩ |" in mini.search_markdown([{**r, "seed": 0, "fixed_bos": False}])
    longer = str(tmp_path / "runs" / "train-longer")           # stopped before its last step
    train(TrainConfig(**{**CFG, "steps": 8}, out_dir=longer), progress=False, corpus=training_corpus)
    log = open(longer + "/log.jsonl").read().splitlines()
    assert len(log) == 2
    import shutil
    shutil.rmtree(ck.latest_checkpoint(longer))
    (tmp_path / "runs" / "train-longer" / "latest").write_text("step-000004\n")
    open(longer + "/log.jsonl", "w").write(log[0] + "\n")
    assert mini.search_row(longer, training_corpus) is None


def test_token_trend_on_an_exact_line():
    # delta = 0.01 + 0.02 log2(t / 1M): slope 0.02 per doubling; 0.5 nats at 2^24.5 M tokens
    curve = [[t, 0.01 + 0.02 * np.log2(t / 1e6)] for t in (1e6, 2e6, 4e6, 8e6, 16e6)]
    slope, t = mini.token_trend(curve, curve[-1][1])
    assert slope == pytest.approx(0.02) and t == pytest.approx(1e6 * 2 ** 24.5, rel=1e-9)
    lin = [[t, 0.1 + 0.05 * t / 1e6] for t in (3e6, 6e6, 9e6)]       # 0.05 nats per million tokens
    slope, t = mini.token_trend(lin, lin[-1][1], linear=True)
    assert slope == pytest.approx(0.05) and t == pytest.approx(8e6)   # 0.1 + 0.05 * 8 = 0.5
    assert mini.token_trend([[1e6, 0.3], [2e6, 0.2], [3e6, 0.1]], 0.1)[1] is None   # falling: never
    assert mini.token_trend([[1e6, 0.1]], 0.1) == (None, None)
    # a slope so small that the target lies past any float: infinite, not an OverflowError
    flat = [[t, 0.01 + 1e-6 * math.log2(t)] for t in (3e6, 6e6, 9e6, 12e6)]
    slope, t = mini.token_trend(flat, flat[-1][1])
    assert slope == pytest.approx(1e-6) and t == math.inf


def _vrow(attention, bos, text, sink=0.1, **setting):
    base = {k: None for k in mini.SETTING_KEYS}
    base.update({"d_model": 128, "n_layers": 4, "n_heads": 8, "tokens": 1000, "seed": 0, **setting})
    bos, text = np.asarray(bos, float), np.asarray(text, float)
    d = text - bos
    return {**base, "attention": attention, "run": attention, "per_doc_bos": list(bos), "per_doc_text": list(text),
            "sink_bos": sink, "a0_ratio": 2.0, "delta_loss": d.mean(), "delta_lo": d.min(), "delta_hi": d.max(),
            "val_loss_bos": bos.mean()}


def test_variant_rows_pair_documents_with_the_softmax_run_of_the_same_setting():
    r = np.random.default_rng(0)
    bos = 3.0 + r.random(40)
    soft = _vrow("softmax", bos, bos + 0.05 + 0.01 * r.random(40), sink=0.15)
    # the sink logit closes the gap (text == bos + ~0) and lowers the loss on every document
    sink = _vrow("sink_logit", bos - 0.02, bos - 0.02 + 0.001 * r.standard_normal(40), sink=0.0)
    same = _vrow("gated", bos + 0.001 * r.standard_normal(40), np.asarray(soft["per_doc_text"]), sink=0.2)
    other = _vrow("softmax1", bos, bos, n_heads=4)       # no softmax run with 4 heads: left out
    out = {v["attention"]: v for v in mini.variant_rows([soft, sink, same, other])}
    assert set(out) == {"sink_logit", "gated"}
    want = np.mean((np.subtract(sink["per_doc_text"], sink["per_doc_bos"]))
                   - (np.subtract(soft["per_doc_text"], soft["per_doc_bos"])))
    assert out["sink_logit"]["gap_change"] == pytest.approx(want, rel=1e-12)
    assert out["sink_logit"]["gap_change_lo"] <= want <= out["sink_logit"]["gap_change_hi"]
    assert out["sink_logit"]["dependence"] == "less on ⟨bos⟩" and out["sink_logit"]["loss"] == "lower"
    assert out["sink_logit"]["loss_change"] == pytest.approx(-0.02, abs=1e-12)
    assert out["gated"]["loss"] == "no difference resolved"
    md = mini.variants_markdown(list(out.values()))
    assert "sink_logit: sink rate 0.0 % against softmax's 15.0 %" in md and "depends less on ⟨bos⟩" in md


def _srow(d, H, params, gaps, bos, sink, **kw):
    base = {k: None for k in mini.SETTING_KEYS}
    base.update(n_layers=4, context=256, lr=5e-3, weight_decay=2.0, seed=0, tokens=14_336_000)
    base.update(kw)
    return {**base, "d_model": d, "n_heads": H, "attention": "softmax", "run": f"d{d}", "n_params": params,
            "per_doc_bos": list(bos), "per_doc_text": list(np.asarray(bos) + gaps), "sink_bos": sink,
            "a0_ratio": 2.0, "delta_loss": float(np.mean(gaps)), "delta_lo": 0.0, "delta_hi": 0.1,
            "val_loss_bos": float(np.mean(bos))}


def test_scale_trend_slope_over_documents_and_the_size_it_extrapolates_to():
    r = np.random.default_rng(1)
    bos = 3.0 + r.random(64)
    params = [0.5e6, 1e6, 4e6]
    # the gap grows by 0.02 nats per doubling of parameters, with per-document noise
    rows = [_srow(64 * 2 ** i, 4 * 2 ** i, p, 0.03 + 0.02 * np.log2(p / 0.5e6) + 0.01 * r.standard_normal(64), bos,
                  0.1 * (i + 1)) for i, p in enumerate(params)]
    rows.append(_srow(512, 32, 8e6, np.full(64, 0.9), bos, 0.5, weight_decay=1.0))  # another setting: apart
    rows.append(_srow(128, 16, 1e6, np.full(64, 0.9), bos, 0.5))                     # head dim 8: apart
    groups = mini.scale_groups(rows)
    assert len(groups) == 1 and [g["d_model"] for g in groups[0]] == [64, 128, 256]
    t = mini.scale_trend(groups[0])
    x = np.log2(params)
    y = np.array([np.mean(np.subtract(g["per_doc_text"], g["per_doc_bos"])) for g in groups[0]])
    slope = ((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum()   # closed-form least squares
    assert t["slope"] == pytest.approx(slope, rel=1e-12)
    assert t["slope_lo"] < 0.02 < t["slope_hi"] and t["slope_lo"] > 0 and t["trend"] == "grows with scale"
    top = y.mean() + slope * (x[-1] - x.mean())
    assert t["params_to_target"] == pytest.approx(2 ** (x[-1] + (mini.TARGET_LOSS - top) / slope), rel=1e-12)
    md = mini.scale_markdown([t])
    assert "grows with scale" in md and "not a prediction" in md and md.count("| 64 × 4 |") == 1
    flat = mini.scale_trend([_srow(64 * 2 ** i, 4 * 2 ** i, p, 0.03 + 0.01 * r.standard_normal(64), bos, 0.1)
                             for i, p in enumerate(params)])
    assert flat["slope_lo"] < 0 < flat["slope_hi"] and flat["trend"] == "no difference resolved"
    assert flat["params_to_target"] is None and "no size" in mini.scale_reading(flat)
    assert mini.scale_groups(rows[:2]) == []                                          # two sizes: no trend
    # rising overall but falling from the middle to the largest: no extrapolation, the fall named
    peak = [0.03, 0.20, 0.12]
    bump = mini.scale_trend([_srow(64 * 2 ** i, 4 * 2 ** i, p, g + 0.005 * r.standard_normal(64), bos, 0.1)
                             for i, (p, g) in enumerate(zip(params, peak))])
    assert bump["slope_lo"] > 0 and not bump["monotone"] and bump["params_to_target"] is None
    assert bump["steps"][1]["hi"] < 0 < bump["steps"][0]["lo"]
    assert bump["steps"][1]["value"] == pytest.approx(np.mean(np.subtract(bump["delta_loss"][2], bump["delta_loss"][1])))
    assert "falls by" in mini.scale_reading(bump) and "extrapolates nothing" in mini.scale_reading(bump)
    # a second seed of the middle width: its paired change of the gap over documents is reported
    other = _srow(128, 8, 1e6, np.asarray(rows[1]["per_doc_text"]) - bos + 0.05, bos, 0.4, seed=1)
    sp = mini.scale_trend(groups[0], rows=rows + [other])["seed_spread"]
    assert len(sp) == 1 and sp[0]["seeds"] == [0, 1] and sp[0]["value"] == pytest.approx(0.05, rel=1e-9)
    assert sp[0]["sink_difference"] == pytest.approx(0.4 - rows[1]["sink_bos"])
    assert "seed-to-seed spread" in mini.scale_reading(mini.scale_trend(groups[0], rows=rows + [other]))


REPO = Path(__file__).resolve().parents[1]
COMMITTED = REPO / "notebooks" / "results" / "training" / "miniature"


def test_committed_search_tables_and_figure_are_made_again_from_its_json(tmp_path):
    """The committed search JSON is the whole record of the search: its tables come out of it
    byte for byte as they came out of the runs, and the variants figure's bars are the rows'
    numbers (read here from the JSON, not from variant_rows)."""
    import json

    import matplotlib
    matplotlib.use("Agg")
    from sinklab.viz.figures_training import variants_figure

    assert mini.main(["--from-json", str(COMMITTED / "search.json"), "--out", str(tmp_path / "s")]) == 0
    for name in ("search.md", "search-variants.md", "search-scale.md"):
        assert (tmp_path / name.replace("search", "s")).read_text() == (COMMITTED / name).read_text()
    assert (tmp_path / "s-variants.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = json.loads((COMMITTED / "search.json").read_text())["rows"]
    fig = variants_figure(mini.variant_rows(rows))
    names = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    sink = [b.get_height() for b in fig.axes[0].patches]
    gap = [b.get_height() for b in fig.axes[1].patches]
    variants = {r["attention"]: r for r in rows if r.get("attention") not in (None, "softmax")}
    assert names[0] == "softmax" and set(names[1:]) == set(variants)
    for n, s, g in zip(names[1:], sink[1:], gap[1:]):
        assert s == pytest.approx(100 * variants[n]["sink_bos"]) and g == pytest.approx(variants[n]["delta_loss"])
    soft = [r for r in rows if r.get("attention") in (None, "softmax") and r["run"] == mini.variant_rows(rows)[0]["softmax_run"]]
    assert sink[0] == pytest.approx(100 * soft[0]["sink_bos"])
    with pytest.raises(SystemExit):
        mini.main(["--out", str(tmp_path / "x")])           # neither sweeps nor --from-json
