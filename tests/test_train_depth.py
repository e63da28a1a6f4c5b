"""The depth sweep at matched parameters (sinklab.train.depth): the shapes it picks against a
brute-force search and the engine's own parameter count, a real quick-profile sweep whose summary
is recomputed here from the runs' log files, and the criterion against constructed intervals."""
import json
from pathlib import Path

import pytest

from sinklab.analysis import status as S
from sinklab.train import depth as D
from sinklab.train import experiments as X
from sinklab.train.engine import Trainer, llama_config
from tests.support.run_logs import read_log, t_interval


def brute_force_width(L, d0, L0, hd):
    """Every multiple of hd up to 4·d0: the one whose L·d² is closest to L0·d0² (smaller on ties)."""
    cands = [hd * c for c in range(1, 4 * d0 // hd + 1)]
    return min(cands, key=lambda d: (abs(L * d * d - L0 * d0 * d0), d))


@pytest.mark.parametrize("name", ["miniature", "quick"])
def test_matched_shapes_against_brute_force_and_the_engine(name):
    p = X.PROFILES[name]
    m = p["model"]
    hd = m["d_model"] // m["n_heads"]
    ref = None
    shapes = D.depth_models(name)
    assert [s["n_layers"] for s in shapes] == list(p["depths"])
    for s in shapes:
        assert s["d_model"] == brute_force_width(s["n_layers"], m["d_model"], m["n_layers"], hd)
        assert s["d_model"] % hd == 0 and s["n_heads"] == s["d_model"] // hd
        # the engine's count of the same model (its own layout), embeddings and final norm included
        tr = Trainer(llama_config(4096, s["d_model"], s["n_layers"], s["n_heads"], d_ff=s["d_ff"]), init=False)
        assert D.model_params(s["d_model"], s["n_layers"], 4096, s["d_ff"]) == tr.n_params
        if s["n_layers"] == m["n_layers"]:
            ref = D.block_params(s["d_model"], s["n_layers"], s["d_ff"])
            assert s["d_model"] == m["d_model"] and s["d_ff"] == m.get("d_ff")
    assert ref is not None
    for s in shapes:
        block = D.block_params(s["d_model"], s["n_layers"], s["d_ff"])
        # no other multiple of 32 for the MLP comes closer to the reference's block parameters
        best = min(abs(D.block_params(s["d_model"], s["n_layers"], 32 * f) - ref) for f in range(1, 200))
        assert s["n_layers"] == m["n_layers"] or abs(block - ref) == best
        if name == "miniature":
            assert abs(block / ref - 1) < 0.05, (s, block, ref)


def test_the_reference_depth_is_table2s_run_and_other_depths_are_named_by_their_shape():
    depth = D.depth_configs("miniature", seeds=1)
    table2 = X.table2_configs("miniature", seeds=1)
    causal_bos = [c for c in table2 if c.masking == "causal" and c.fixed_bos][0]
    assert [c.out_dir for c in depth if c.n_layers == 4] == [causal_bos.out_dir]
    assert all(f"-L{c.n_layers}-d{c.d_model}-" in c.out_dir for c in depth if c.n_layers != 4)
    assert all(c.masking == "causal" and c.fixed_bos and c.weight_decay == 2.0 for c in depth)
    with pytest.raises(ValueError, match="no depth sweep"):
        D.depth_configs("cpu")




@pytest.mark.slow  # six quick training runs
def test_quick_depth_sweep_summary_from_the_logs(training_corpus, tmp_path, monkeypatch):
    root = tmp_path / "runs"
    res = D.run_depth("quick", root=str(root), out=str(tmp_path), progress=False, seeds=2)
    assert [r["n_layers"] for r in res["depths"]] == [1, 2, 4]
    finals = {}
    for r in res["depths"]:
        assert len(r["out_dirs"]) == 2 and r["seeds"] == [0, 1]
        logs = [read_log(d) for d in r["out_dirs"]]
        last = [[e for e in log if e["val_loss_text"] is not None][-1] for log in logs]
        assert r["final_per_seed"]["sink_0.3"] == [e["sink_bos_0.3"] for e in last]
        assert r["final_per_seed"]["bos_gap"] == pytest.approx([e["val_loss_text"] - e["val_loss_bos"] for e in last])
        finals[r["n_layers"]] = last
        # the run's own checkpoint says it has this shape
        st = json.loads((Path(r["out_dirs"][0]) / (Path(r["out_dirs"][0]) / "latest").read_text().strip()
                         / "trainer_state.json").read_text())
        assert st["run_config"]["n_layers"] == r["n_layers"] and st["run_config"]["d_model"] == r["d_model"]
    d = res["differences"]["deepest_minus_shallowest"]
    gap = [b["val_loss_text"] - b["val_loss_bos"] - (a["val_loss_text"] - a["val_loss_bos"])
           for a, b in zip(finals[1], finals[4])]
    assert d["bos_gap_per_seed"] == pytest.approx(gap)
    mean, lo, hi = t_interval(gap)
    assert d["bos_gap"]["mean"] == pytest.approx(mean)
    assert d["bos_gap"]["interval"]["lo"] == pytest.approx(lo) and d["bos_gap"]["interval"]["hi"] == pytest.approx(hi)
    v = D.criterion_depth(res)
    assert res["verdict"]["status"] == v.status and "Verdict" in res["reading"]
    assert Path(res["figure"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((tmp_path / "depth-quick.json").read_text())["markdown"] == res["markdown"]
    assert res["markdown"].count("\n") == 2 + 3 - 1
    monkeypatch.setattr(X, "train", lambda *a, **k: pytest.fail("a finished run was trained again"))
    assert D.run_depth("quick", root=str(root), out=str(tmp_path), progress=False, seeds=2)["depths"] == res["depths"]


def summary_with(sinks_lo, sinks_hi, peak=0.2):
    """A two-depth summary whose per-seed final sink rates are given."""
    rows = [{"n_layers": L, "d_model": 64, "n_heads": 4, "seeds": [0, 1, 2], "peak_sink_0.3": peak,
             "final_per_seed": {"sink_0.3": v}} for L, v in ((2, sinks_lo), (12, sinks_hi))]
    diff = [b - a for a, b in zip(sinks_lo, sinks_hi)]
    return {"depths": rows, "differences": {"deepest_minus_shallowest": {"seeds": [0, 1, 2],
                                                                         "sink_0.3_per_seed": diff}}}


def test_criterion_follows_the_interval_over_seeds():
    assert D.criterion_depth(summary_with([0.10, 0.11, 0.12], [0.30, 0.32, 0.31])).status == S.REPRODUCED
    assert D.criterion_depth(summary_with([0.30, 0.32, 0.31], [0.10, 0.11, 0.12])).status == S.CONTRADICTED
    assert D.criterion_depth(summary_with([0.10, 0.30, 0.20], [0.25, 0.12, 0.22])).status == S.INCONCLUSIVE
    none = D.criterion_depth(summary_with([0.0] * 3, [0.0] * 3, peak=0.0))
    assert none.status == S.INCONCLUSIVE and "tests nothing" in none.reason
    one = summary_with([0.1] * 3, [0.2] * 3)
    one["depths"] = one["depths"][:1]
    assert D.criterion_depth(one).status == S.NOT_TESTABLE
