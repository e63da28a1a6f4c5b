"""Run records (sinklab.train.records): a finished run's log and settings, a few kB, that stand
in for the run on a machine that never trained it.

Fig. 5 on the quick profile with one seed (3 runs, seconds) is trained into one root with a
records folder, then run again into a fresh root from the records alone, with training disabled:
the summaries must agree number for number, Fig. 5's losses on the common targets included (the
first run computed them from the checkpoints; the second can only read them from the records).
The records are checked against the runs' own files (log bytes, weight digests in each
checkpoint's trainer_state.json); records that do not match a run's settings, that end early or
that are corrupted are not adopted.
"""
import hashlib
import json
import shutil
from pathlib import Path

import pytest

from sinklab.train import experiments as X
from sinklab.train import records as R


@pytest.fixture(scope="module")
def recorded(training_corpus, tmp_path_factory):
    d = tmp_path_factory.mktemp("records")
    recs = d / "records"
    first = X.run_experiment("fig5", "quick", root=str(d / "a"), out=str(d / "a"), progress=False, seeds=1,
                             records_dir=str(recs))
    return {"dir": d, "records": recs, "first": first, "configs": X.fig5_configs("quick", root=str(d / "a"), seeds=1)}


def _no_training(monkeypatch):
    monkeypatch.setattr(X, "train", lambda cfg, *a, **kw: pytest.fail(f"trained {cfg.out_dir}"))


def test_a_record_holds_the_runs_log_settings_and_weight_digests(recorded):
    cfgs = recorded["configs"]
    assert sorted(p.name for p in recorded["records"].iterdir()) == sorted(Path(c.out_dir).name for c in cfgs)
    for c in cfgs:
        rec_dir = recorded["records"] / Path(c.out_dir).name
        assert sorted(p.name for p in rec_dir.iterdir()) == ["log.jsonl", "record.json"]
        assert (rec_dir / "log.jsonl").read_bytes() == (Path(c.out_dir) / "log.jsonl").read_bytes()
        rec = json.loads((rec_dir / "record.json").read_text())
        ckpt = Path(c.out_dir) / (Path(c.out_dir) / "latest").read_text().strip()
        state = json.loads((ckpt / "trainer_state.json").read_text())
        digests = {k: hashlib.sha256((ckpt / k).read_bytes()).hexdigest() for k in state["files"]
                   if k.endswith(".safetensors")}
        assert digests and rec["weights_sha256"] == digests
        assert rec["step"] == state["step"] == c.n_steps
        assert rec["run_config"]["lr"] == c.lr and rec["run_config"]["seed"] == c.seed
        assert rec["run_config"]["context"] == c.context and rec["cpu"]
        # the loss on Fig. 5's common targets (the shortest context - 1 tokens) is kept
        assert set(rec["common_losses"]) == {str(min(X.PROFILES["quick"]["contexts"]) - 1)}
        assert sum(len(p.read_bytes()) for p in rec_dir.iterdir()) < 20_000


def test_records_alone_give_the_same_summary_without_training(recorded, monkeypatch):
    _no_training(monkeypatch)
    d = recorded["dir"]
    again = X.run_experiment("fig5", "quick", root=str(d / "b"), out=str(d / "b"), progress=False, seeds=1,
                             records_dir=str(recorded["records"]))
    first = recorded["first"]
    for a, b in zip(first["runs"], again["runs"]):
        assert a["context"] == b["context"]
        for k in ("sink_0.3", "sink_0.8", "importance", "val_loss", "tokens"):
            assert a[k] == b[k]
        assert a["final_per_seed"]["val_loss_common"] == b["final_per_seed"]["val_loss_common"]
        assert a["final_per_seed"]["val_loss_common"][0] is not None
    assert first["verdict"] == again["verdict"] and first["reading"] == again["reading"]
    # the folders filled from records hold no checkpoint, only the log and the record
    for c in X.fig5_configs("quick", root=str(d / "b"), seeds=1):
        assert sorted(p.name for p in Path(c.out_dir).iterdir()) == ["log.jsonl", "record.json"]


def test_a_partial_fig5_from_records_compares_on_the_whole_experiments_targets(recorded, tmp_path, monkeypatch):
    """Fig. 5 with its shortest context not yet run: its summary still scores every context on the
    shortest context's targets (C_min - 1 tokens, which every record keeps), not on the shortest
    finished context's (which no record holds)."""
    _no_training(monkeypatch)
    recs = tmp_path / "records"
    shortest = min(recorded["configs"], key=lambda c: c.context)
    shutil.copytree(recorded["records"], recs, ignore=lambda d, names: [n for n in names
                                                                     if n == Path(shortest.out_dir).name])
    part = X.run_experiment("fig5", "quick", root=str(tmp_path / "r"), out=str(tmp_path / "r"), progress=False,
                            seeds=1, records_dir=str(recs), train_missing=False)
    assert part["complete"] is False and part["common_target_tokens"] == shortest.context - 1
    full = {r["context"]: r for r in recorded["first"]["runs"]}
    for r in part["runs"]:
        assert r["final_per_seed"]["val_loss_common"] == full[r["context"]]["final_per_seed"]["val_loss_common"]


def test_only_matching_complete_records_are_adopted(recorded, tmp_path):
    src = tmp_path / "src"
    name = Path(recorded["configs"][0].out_dir).name
    good = recorded["records"] / name
    # another learning rate: not this run
    lr = src / "lr"
    lr.mkdir(parents=True)
    (lr / "log.jsonl").write_bytes((good / "log.jsonl").read_bytes())
    rec = json.loads((good / "record.json").read_text())
    (lr / "record.json").write_text(json.dumps({**rec, "run_config": {**rec["run_config"], "lr": 1.0}}))
    # a log that stops before the last step
    short = src / "short"
    short.mkdir()
    lines = (good / "log.jsonl").read_text().splitlines()
    (short / "log.jsonl").write_text("\n".join(lines[:-1]) + "\n")
    (short / "record.json").write_bytes((good / "record.json").read_bytes())
    # a corrupted record
    bad = src / "bad"
    bad.mkdir()
    (bad / "log.jsonl").write_bytes((good / "log.jsonl").read_bytes())
    (bad / "record.json").write_bytes((good / "record.json").read_bytes()[:50])
    assert R.read_record(str(lr)) is not None
    assert R.read_record(str(short)) is None and R.read_record(str(bad)) is None
    cfgs = X.fig5_configs("quick", root=str(tmp_path / "root"), seeds=1)
    assert X.adopt_runs(cfgs, [str(src)]) == []
    assert X.adopt_runs(cfgs, [str(src), str(recorded["records"])]) == [c.out_dir for c in cfgs]


def test_a_record_without_the_common_loss_says_what_is_missing(recorded, tmp_path):
    name = Path(recorded["configs"][0].out_dir).name
    src = tmp_path / "src" / name
    src.mkdir(parents=True)
    (src / "log.jsonl").write_bytes((recorded["records"] / name / "log.jsonl").read_bytes())
    rec = json.loads((recorded["records"] / name / "record.json").read_text())
    (src / "record.json").write_text(json.dumps({**rec, "common_losses": {}}))
    cfg = X.fig5_configs("quick", root=str(tmp_path / "root"), seeds=1)[0]
    assert X.adopt_runs([cfg], [str(src.parent)]) == [cfg.out_dir]
    with pytest.raises(ValueError, match="no checkpoint"):
        X.common_target_losses([cfg], 31)


def test_finished_runs_are_recorded_when_the_experiment_is_interrupted(training_corpus, tmp_path, monkeypatch):
    cfgs = X.table2_configs("quick", root=str(tmp_path / "root"), seeds=1)
    real = X.train

    def stop_at_second(cfg, *a, **kw):
        if cfg.out_dir == cfgs[1].out_dir:
            raise KeyboardInterrupt
        return real(cfg, *a, **kw)

    monkeypatch.setattr(X, "train", stop_at_second)
    with pytest.raises(KeyboardInterrupt):
        X.run_experiment("table2", "quick", root=str(tmp_path / "root"), progress=False, seeds=1,
                         records_dir=str(tmp_path / "records"))
    assert sorted(p.name for p in (tmp_path / "records").iterdir()) == [Path(cfgs[0].out_dir).name]


def test_runs_trained_two_at_a_time_log_the_same_numbers(recorded, tmp_path):
    """jobs=2 trains in two spawned processes of one thread each; the logs equal the one-process
    runs' of the module fixture, timing fields aside (a run's numbers do not depend on threads)."""
    from sinklab.train.run import TIMING_FIELDS

    cfgs = X.fig5_configs("quick", root=str(tmp_path / "root"), seeds=1, threads=2)
    logs = X.run_all(cfgs, progress=False, jobs=2)
    strip = lambda log: [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in log]  # noqa: E731
    for c, log, ref in zip(cfgs, logs, recorded["configs"]):
        assert strip(log) == strip(X.read_log(ref.out_dir)) and log[-1]["step"] == c.n_steps
        state = json.loads((Path(c.out_dir) / (Path(c.out_dir) / "latest").read_text().strip()
                            / "trainer_state.json").read_text())
        assert state["run_config"]["threads"] == 1
    with pytest.raises(ValueError, match="jobs"):
        X.run_all(cfgs, jobs=0)


def test_a_partial_experiment_summarizes_the_finished_runs_and_names_the_rest(training_corpus, tmp_path,
                                                                              monkeypatch):
    root = tmp_path / "root"
    cfgs = X.table2_configs("quick", root=str(root), seeds=1)
    with pytest.raises(ValueError, match="none of the 4 runs"):
        X.run_experiment("table2", "quick", root=str(root), progress=False, seeds=1, train_missing=False)
    X.run_all(cfgs[:2], progress=False)           # the two causal conditions
    _no_training(monkeypatch)
    summ = X.run_experiment("table2", "quick", root=str(root), progress=False, seeds=1, train_missing=False)
    assert summ["complete"] is False
    assert summ["missing_runs"] == [Path(c.out_dir).name for c in cfgs[2:]]
    assert {r["masking"] for r in summ["rows"]} == {"causal"} and len(summ["rows"]) == 4
    assert summ["reading"].startswith("Partial: 2 of 4 runs have finished; not yet trained: ")
    for c in cfgs[2:]:
        assert Path(c.out_dir).name in summ["reading"] and not Path(c.out_dir).exists()
    # the rows are the finished runs' last evaluations, read here from their logs
    last = X.read_log(cfgs[1].out_dir)[-1]
    row = next(r for r in summ["rows"] if r["fixed_bos"] and r["inference"] == "text")
    assert row["val_loss"] == pytest.approx(last["val_loss_text"], rel=1e-12)


REPO = Path(__file__).resolve().parents[1]
RECORDS = REPO / "notebooks" / "results" / "training" / "records"
SEARCH = REPO / "notebooks" / "results" / "training" / "miniature" / "search.json"


def test_committed_records_are_complete_and_match_the_runs_they_name():
    """Every committed record of this project's experiments is complete (its log reaches the
    last step of its settings) and sits in the folder its settings name."""
    from sinklab.train.depth import depth_configs

    dirs = sorted(d for d in RECORDS.iterdir() if d.is_dir())
    assert dirs, f"no run records in {RECORDS}"
    names = {Path(c.out_dir).name: c for prof in ("miniature",)
             for c in X.table2_configs(prof) + X.fig5_configs(prof) + depth_configs(prof)}
    for d in dirs:
        rec = R.read_record(str(d))
        assert rec is not None, f"{d.name}: not a complete record"
        assert d.name in names, f"{d.name}: no experiment of the miniature profile has this run"
        want = names[d.name]
        assert X._settings(rec["config"].to_dict()) == X._settings(want.to_dict())


def test_records_trained_again_reproduce_the_search_runs_of_the_same_settings():
    """Table 2's miniature runs whose settings equal a run of the miniature search were trained
    again, sessions later, on another machine, from nothing but the code. The search's JSON rows
    were written from the first runs (since lost); the records' logs must give the same numbers
    to the bit: a₀ with ⟨bos⟩ at every evaluation, the final sink rate, and the ⟨bos⟩ loss gap
    at every evaluation (sinklab's numbers do not depend on the machine or the thread count)."""
    from sinklab.train.miniature import SETTING_KEYS

    rows = json.loads(SEARCH.read_text())["rows"]
    matched = []
    for d in sorted(x for x in RECORDS.iterdir() if x.is_dir()):
        cfg = R.read_record(str(d))["config"]
        log = X.read_log(str(d))
        for r in rows:
            if all(r.get(k) == getattr(cfg, k) for k in SETTING_KEYS) and r["tokens"] == log[-1]["tokens"]:
                ev = [x for x in log if x.get("importance_bos") is not None]
                assert [[x["tokens"], x["importance_bos"]] for x in ev] == r["a0_curve"], d.name
                assert ev[-1]["sink_bos_0.3"] == r["sink_bos"], d.name
                assert [[x["tokens"], x["val_loss_text"] - x["val_loss_bos"]] for x in ev] == r["delta_curve"], d.name
                matched.append(d.name)
    assert len(matched) >= 2, matched


def test_a_partial_summary_figure_names_each_rows_seed_count():
    """A summary whose rows have different numbers of finished seeds (Table 2 partway through)
    says "2-3 seeds", not the most any row has; a whole one "3 seeds"."""
    from sinklab.viz.figures_training import table2_miniature_figure

    committed = json.loads((Path(__file__).resolve().parents[1] / "notebooks" / "results" / "training"
                            / "table2-miniature.json").read_text())

    def legends(summary):
        fig = table2_miniature_figure(summary)
        return [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()]

    whole = json.loads(json.dumps(committed))
    for r in whole["rows"]:
        r["seeds"] = [0, 1, 2]
    partial = json.loads(json.dumps(whole))
    partial["rows"][-1]["seeds"] = [0, 1]
    assert any("over 3 seeds" in t for t in legends(whole))
    got = legends(partial)
    assert any("over 2-3 seeds" in t for t in got) and not any("over 3 seeds" in t for t in got), got
