"""`sinklab reproduce --beyond` on SmolLM2 with the quick preset: the files, the numbers against
transformers' fp32 forward (residual streams and attention), the readings' criteria, resuming
from the cache, and the errors."""
import json

import numpy as np
import pytest

from sinklab.analysis.massive import sequences
from sinklab.analysis.stats import Interval
from sinklab.prompts import load_passages
from sinklab.report import beyond
from sinklab.report import beyond_key_geometry as KG
from sinklab.report import beyond_massive as MA
from tests.support.reference_models import hf_forward


@pytest.fixture(scope="module")
def report(smollm2_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("beyond")
    res = beyond.reproduce_beyond([smollm2_model.source], out=str(out), quick=True, progress=False,
                                  loader=lambda _: smollm2_model)
    return out, res, smollm2_model


@pytest.fixture(scope="module")
def hf_run(report, smollm2_reference):
    """transformers' fp32 resid (P, L+1, T, d) and attention (P, L, H, T, T), float64, on the
    report's own token sequences."""
    _, res, model = report
    s = res["massive"]["results"][model.name]["settings"]
    seqs, _, _ = sequences(model, load_passages("sinks")[: s["n_prompts"]], s["T"], s["bos"], skip_short=True)
    ref = hf_forward(smollm2_reference[0], seqs)
    return ref["resid"].astype(np.float64), ref["attn"].astype(np.float64)


def test_files_and_sections(report):
    out, res, model = report
    assert res["meta"]["sections"] == list(beyond.BEYOND_SECTIONS)
    assert res["meta"]["models"][0]["sha256"] and json.loads((out / "beyond.json").read_text()) == res
    md = (out / "beyond.md").read_text()
    for k in beyond.BEYOND_SECTIONS:
        assert f"## {res[k]['title']}" in md and res[k]["results"][model.name]
        for f in res[k]["figures"]:
            data = (out / f).read_bytes()
            assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, f
            assert f"]({f})" in md
    assert md.count("**Reading.**") == len(beyond.BEYOND_SECTIONS)
    # the summary table: a row per section, a cell per model, each cell the section's criterion's word
    glance = beyond.summary_table(res)
    assert glance in md and len(glance.splitlines()) == 2 + len(beyond.BEYOND_SECTIONS)
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ")[1] for line in glance.splitlines()[2:]}
    ma, kg = res["massive"]["results"][model.name], res["key_geometry"]["results"][model.name]
    assert rows[MA.SUMMARY].startswith({"massive": "yes", "outliers": "outliers", "none": "no"}[MA.classify(ma)])
    assert rows[KG.SUMMARY].startswith(KG.winner(kg))


def test_massive_numbers_against_transformers(report, hf_run):
    """The top/median ratio of the reported stream and the share of prompts whose top entry sits
    at position 0, recomputed from transformers' hidden states in float64."""
    _, res, model = report
    r = res["massive"]["results"][model.name]
    resid, _ = hf_run
    l = r["summary"]["max_ratio_layer"]
    a = np.abs(resid[:, l])                                        # (P, T, d)
    ratio = a.reshape(len(a), -1).max(axis=1) / np.median(a.reshape(len(a), -1), axis=1)
    assert Interval.from_dict(r["ratio"]).value == pytest.approx(ratio.mean(), rel=1e-4)
    at0 = np.array([np.unravel_index(np.argmax(x), x.shape)[0] == 0 for x in a])
    assert Interval.from_dict(r["top_at_pos0"]).value == pytest.approx(at0.mean())
    # the verdict follows the stated criterion on the intervals' lower ends
    iv = Interval.from_dict(r["ratio"])
    assert MA.classify(r) == ("massive" if iv.lo >= 1000 and Interval.from_dict(r["top_abs"]).lo > 100
                              else "outliers" if iv.lo >= 100 else "none")
    md = MA.markdown({model.name: r})
    assert f"| {l} | {iv.fmt('.0f')} |" in md


def test_key_geometry_sink_heads_against_transformers(report, hf_run):
    """The sink heads (mean a_0 > 0.3) counted from transformers' attention match the report's;
    the gap split is exact (norm term + angle term = gap); the winner follows the interval."""
    _, res, model = report
    r = res["key_geometry"]["results"][model.name]
    _, attn = hf_run
    a0 = attn[..., 0].mean(axis=-1).mean(axis=0)                   # (L, H): mean over queries, then prompts
    assert np.abs(np.asarray(r["a0_map"]) - a0).max() < 1e-4
    assert r["n_sink_heads"] == int((a0 > KG.EPS).sum()) > 0
    g, n, a = (Interval.from_dict(r[k]).value for k in ("gap", "norm_term", "angle_term"))
    assert n + a == pytest.approx(g, rel=1e-9, abs=1e-9)
    share = Interval.from_dict(r["norm_share"])
    assert KG.winner(r) == ("norm" if share.lo > 0.5 else "angle" if share.hi < 0.5 else "both")


def test_rerun_reuses_the_cache_and_a_new_preset_does_not(report, monkeypatch):
    out, res, model = report

    def fail(*a, **k):
        raise AssertionError("recomputed a cached result")

    for mod in (MA, KG):
        monkeypatch.setattr(mod, "compute", fail)
    again = beyond.reproduce_beyond([model.source], out=str(out), quick=True, progress=False, loader=lambda _: model)
    for k in beyond.BEYOND_SECTIONS:
        assert again[k]["results"] == res[k]["results"]
    with pytest.raises(AssertionError, match="recomputed"):             # the full preset is another key
        beyond.reproduce_beyond([model.source], out=str(out), quick=False, progress=False, loader=lambda _: model,
                                sections=["massive"])


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="unknown beyond section 'nope'"):
        beyond.reproduce_beyond(["x"], out=str(tmp_path), sections=["nope"], loader=lambda _: None)
    with pytest.raises(ValueError, match="at least one model"):
        beyond.reproduce_beyond([], out=str(tmp_path))


@pytest.mark.parametrize("argv, message", [
    (["--families"], "two reports"),
    (["--precision", "bf16"], "runs in fp32"),
    (["--eps", "0.5"], "runs in fp32"),
    (["--training-profile", "quick"], "trains nothing"),
])
def test_cli_refuses_what_it_does_not_take(argv, message, capsys):
    from sinklab import cli

    rc = cli.main(["reproduce", "--beyond", *argv])
    assert rc == 1 and message in capsys.readouterr().err
