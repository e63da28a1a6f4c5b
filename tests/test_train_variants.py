"""The attention variants with seeds (sinklab.train.variants): the runs are Table 2's recipe with
another attention (softmax's are Table 2's own folders), a real quick-profile run whose summary is
recomputed here from the runs' log files and checkpoints (per seed, the variant minus softmax of
the same seed, t interval with scipy), and the criterion against constructed summaries."""
import json
from pathlib import Path

import pytest

from sinklab.analysis import status as S
from sinklab.train import experiments as X
from sinklab.train import variants as V
from tests.support.run_logs import read_log, t_interval




def test_softmax_runs_are_table2s_and_the_variants_differ_only_in_attention():
    cfgs = V.variant_configs("miniature", seeds=2)
    table2 = X.table2_configs("miniature", seeds=2)
    causal_bos = [c.out_dir for c in table2 if c.masking == "causal" and c.fixed_bos]
    assert [c.out_dir for c in cfgs if c.attention == "softmax"] == causal_bos
    assert [c.attention for c in cfgs] == [a for a in V.VARIANTS for _ in range(2)]
    base = {k: v for k, v in cfgs[0].to_dict().items() if k not in ("attention", "out_dir")}
    for c in cfgs:
        assert {k: v for k, v in c.to_dict().items() if k not in ("attention", "out_dir")} == base | {"seed": c.seed}
        assert c.attention == "softmax" or f"-{c.attention}" in c.out_dir
    assert len({c.out_dir for c in cfgs}) == len(cfgs)
    with pytest.raises(ValueError, match="baseline"):
        V.variant_configs("miniature", variants=("gated", "softmax"))


@pytest.mark.slow  # twelve quick training runs
def test_quick_variants_summary_from_the_logs(training_corpus, tmp_path, monkeypatch):
    root = tmp_path / "runs"
    res = V.run_variants("quick", root=str(root), out=str(tmp_path), progress=False, seeds=3)
    rows = {r["attention"]: r for r in res["variants"]}
    assert list(rows) == list(V.VARIANTS) and res["complete"] is True and res["missing_runs"] == []
    last = {}
    for a, r in rows.items():
        assert r["seeds"] == [0, 1, 2]
        logs = [read_log(d) for d in r["out_dirs"]]
        last[a] = [[e for e in log if e["val_loss_text"] is not None][-1] for log in logs]
        assert r["final_per_seed"]["sink_0.3"] == [e["sink_bos_0.3"] for e in last[a]]
        assert r["final_per_seed"]["bos_gap"] == pytest.approx([e["val_loss_text"] - e["val_loss_bos"] for e in last[a]])
        # each run's own checkpoint says it trained this attention
        for d in r["out_dirs"]:
            st = json.loads((Path(d) / (Path(d) / "latest").read_text().strip() / "trainer_state.json").read_text())
            assert st["run_config"]["attention"] == a and st["run_config"]["fixed_bos"] is True
    gap = lambda e: e["val_loss_text"] - e["val_loss_bos"]  # noqa: E731
    for a in V.VARIANTS[1:]:
        d = rows[a]["vs_softmax"]
        want = [gap(v) - gap(s) for s, v in zip(last["softmax"], last[a])]
        assert d["bos_gap_per_seed"] == pytest.approx(want)
        mean, lo, hi = t_interval(want)
        assert d["bos_gap"]["mean"] == pytest.approx(mean)
        assert d["bos_gap"]["interval"]["lo"] == pytest.approx(lo) and d["bos_gap"]["interval"]["hi"] == pytest.approx(hi)
        assert d["val_loss_per_seed"] == pytest.approx([v["val_loss_bos"] - s["val_loss_bos"]
                                                        for s, v in zip(last["softmax"], last[a])])
        assert res["verdicts"][a]["status"] == V.criterion_variant(res, a).status
        assert f"{a}: sink rate" in res["reading"]
    assert Path(res["figure"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((tmp_path / "variants-quick.json").read_text())["markdown"] == res["markdown"]
    assert res["markdown"].count("\n") == 2 + 4 - 1 and "± +" not in res["markdown"]  # a sign on the mean only
    monkeypatch.setattr(X, "train", lambda *a, **k: pytest.fail("a finished run was trained again"))
    again = V.run_variants("quick", root=str(root), out=str(tmp_path), progress=False, seeds=3)
    assert again["variants"] == res["variants"]


def summary_with(softmax_gaps, variant_gaps):
    """A softmax + one-variant summary with the given per-seed costs of removing ⟨bos⟩."""
    diff = [v - s for s, v in zip(softmax_gaps, variant_gaps)]
    return {"variants": [{"attention": "softmax", "seeds": [0, 1, 2], "final_per_seed": {"bos_gap": softmax_gaps}},
                         {"attention": "gated", "seeds": [0, 1, 2], "final_per_seed": {"bos_gap": variant_gaps},
                          "vs_softmax": {"seeds": [0, 1, 2], "bos_gap_per_seed": diff}}]}


def test_criterion_follows_the_paired_interval_over_seeds():
    assert V.criterion_variant(summary_with([0.05, 0.06, 0.055], [0.01, 0.012, 0.011]), "gated").status == S.REPRODUCED
    assert V.criterion_variant(summary_with([0.05, 0.06, 0.055], [0.09, 0.1, 0.095]), "gated").status == S.CONTRADICTED
    assert V.criterion_variant(summary_with([0.05, 0.06, 0.055], [0.03, 0.09, 0.05]), "gated").status == S.INCONCLUSIVE
    # softmax itself does not depend on <bos>: nothing to remove, whatever the variant does
    none = V.criterion_variant(summary_with([0.01, -0.01, 0.002], [-0.2, -0.21, -0.19]), "gated")
    assert none.status == S.INCONCLUSIVE and "tests nothing" in none.reason
    one = summary_with([0.05], [0.01])
    one["variants"][0]["seeds"] = one["variants"][1]["seeds"] = [0]
    assert V.criterion_variant(one, "gated").status == S.INCONCLUSIVE
    with pytest.raises(ValueError, match="no variant"):
        V.criterion_variant(summary_with([0.05] * 3, [0.01] * 3), "softmax1")
