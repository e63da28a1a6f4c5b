"""`sinklab experiment all` (sinklab.train.campaign): the four experiments' runs as one queue, each
shared run trained once, Table 2's first, then every summary, equal to each experiment's own
summary over the same runs; recorded, and resumed with nothing trained again."""
import json

import pytest

from sinklab.train import campaign as C
from sinklab.train import depth as D
from sinklab.train import experiments as X
from sinklab.train import variants as V


def test_the_queue_holds_each_shared_run_once_table2_first():
    queue, per = C.campaign_configs("miniature", root="r")
    assert list(per) == ["table2", "fig5", "depth", "variants"]
    dirs = [c.out_dir for c in queue]
    assert len(dirs) == len(set(dirs)) == len({c.out_dir for cs in per.values() for c in cs})
    assert dirs[:len(per["table2"])] == [c.out_dir for c in per["table2"]]
    # 12 Table 2 runs; Fig. 5 adds 4 contexts x 3 seeds; depth 3 depths x 3; the variants 3 x 3
    assert (len(per["table2"]), len(queue)) == (12, 12 + 12 + 9 + 9)
    assert "depth" not in C.campaign_configs("cpu", root="r")[1]       # a profile without a depth sweep


@pytest.mark.slow  # eleven quick training runs
def test_campaign_trains_each_run_once_and_writes_every_summary(training_corpus, tmp_path, monkeypatch):
    root, out, rec = str(tmp_path / "runs"), str(tmp_path / "out"), str(tmp_path / "records")
    trained = []
    real = X.train

    def counting(cfg, *a, **kw):
        trained.append(cfg.out_dir)
        return real(cfg, *a, **kw)

    monkeypatch.setattr(X, "train", counting)
    queue, per = C.campaign_configs("quick", root=root, seeds=1)
    union = {c.out_dir for cs in per.values() for c in cs}
    assert len(queue) == len(union) == 4 + 2 + 2 + 3      # Fig. 5, depth and softmax share Table 2's runs
    res = C.run_campaign("quick", root=root, out=out, progress=False, seeds=1, records_dir=rec)
    assert sorted(trained) == sorted(union)               # every distinct run, once
    assert trained[:4] == [c.out_dir for c in per["table2"]]
    assert (res["runs"], res["finished"], res["not_started"]) == (11, 11, [])
    assert sorted(p.name for p in (tmp_path / "records").iterdir()) == sorted(d.split("/")[-1] for d in union)
    # each summary is the experiment's own over the same runs, and nothing is trained again
    monkeypatch.setattr(X, "train", lambda *a, **kw: pytest.fail("trained again"))
    got = res["summaries"]
    alone = str(tmp_path / "alone")
    assert X.run_experiment("table2", "quick", root=root, out=alone, progress=False, seeds=1)["rows"] == \
        got["table2"]["rows"]
    assert X.run_experiment("fig5", "quick", root=root, out=alone, progress=False, seeds=1)["runs"] == \
        got["fig5"]["runs"]
    assert D.run_depth("quick", root=root, out=alone, progress=False, seeds=1)["depths"] == got["depth"]["depths"]
    assert V.run_variants("quick", root=root, out=alone, progress=False, seeds=1)["variants"] == \
        got["variants"]["variants"]
    for name in ("table2-quick", "fig5-quick", "depth-quick", "variants-quick"):
        assert json.loads((tmp_path / "out" / f"{name}.json").read_text())["reading"]
    again = C.run_campaign("quick", root=root, out=out, progress=False, seeds=1, records_dir=rec)
    assert again["finished"] == 11 and again["summaries"]["table2"]["rows"] == got["table2"]["rows"]


def test_nothing_finished_and_nothing_to_train_names_every_experiment(tmp_path):
    res = C.run_campaign("quick", root=str(tmp_path / "runs"), progress=False, seeds=1, train_missing=False)
    assert res["finished"] == 0 and res["summaries"] == {}
    assert res["not_started"] == ["table2", "fig5", "depth", "variants"]
