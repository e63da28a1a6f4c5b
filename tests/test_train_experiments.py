"""The paper's pre-training experiments in miniature (sinklab.train.experiments) on the quick
profile, and the report's section that reads them (sinklab.report).

Both experiments run once per module into a temporary folder (about 10 s on 2 cores, on the
real corpus, prepared once per machine). Every number in a summary is checked against an
independent read of the runs' own files: ``log.jsonl`` parsed here line by line, and each run's
settings from its checkpoint's ``trainer_state.json`` rather than from its folder name. The
paper's Table 2 is written out again below from the paper, not imported from the code.
"""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest


from sinklab import report
from sinklab.train import experiments as X

# The paper's Table 2 (~120M LLaMA-2-style models, 30B tokens), in its row order:
# (masking, fixed <bos> in training, inference, sink rate %, validation loss).
PAPER_TABLE2 = [("causal", False, "bos", 65.10, 2.69), ("causal", False, "text", 65.15, 2.70),
                ("causal", True, "bos", 90.84, 2.69), ("causal", True, "text", 0.05, 7.56),
                ("intra_doc", False, "text", 28.23, 2.67),
                ("intra_doc", True, "bos", 90.56, 2.67), ("intra_doc", True, "text", 0.00, 7.78)]
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def corpus(training_corpus):
    return training_corpus


class Recorder:
    """Wraps experiments.train: records the folder of every run it is asked to train."""

    def __init__(self, real):
        self.real, self.calls = real, []

    def __call__(self, cfg, *a, **kw):
        self.calls.append(os.path.realpath(cfg.out_dir))
        return self.real(cfg, *a, **kw)


@pytest.fixture(scope="module")
def quick(corpus, tmp_path_factory):
    """Table 2 then Fig. 5 on the quick profile; runs in D/training/runs, summaries in
    D/training (the layout the report's quick profile uses)."""
    d = tmp_path_factory.mktemp("experiments")
    root, out = d / "training" / "runs", d / "training"
    rec = Recorder(X.train)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(X, "train", rec)
        table2 = X.run_experiment("table2", "quick", root=str(root), out=str(out), progress=False)
        fig5 = X.run_experiment("fig5", "quick", root=str(root), out=str(out), progress=False)
    return {"dir": d, "root": root, "out": out, "table2": table2, "fig5": fig5, "trained": rec.calls}


def read_log(folder):
    """log.jsonl parsed here, independently of sinklab.train.run.read_log."""
    with open(Path(folder) / "log.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def run_settings(folder):
    """The run's config as its latest checkpoint recorded it."""
    step = (Path(folder) / "latest").read_text().strip()
    return json.loads((Path(folder) / step / "trainer_state.json").read_text())["run_config"]


def last_eval(log):
    return [r for r in log if r["val_loss_text"] is not None][-1]


def run_folders(root):
    return sorted(p for p in Path(root).iterdir() if (p / "log.jsonl").is_file())


def mtimes(root):
    return {str(p): p.stat().st_mtime_ns for p in Path(root).rglob("*") if p.is_file()}


# ------------------------------------------------------------------------------ profiles
def test_unknown_profile_and_experiment_are_rejected(tmp_path):
    for call in (lambda: X.profile("nope"), lambda: X.run_config("nope", 64), lambda: X.fig5_configs("nope"),
                 lambda: X.table2_configs("nope"),
                 lambda: X.run_experiment("fig5", "nope", root=str(tmp_path), progress=False)):
        with pytest.raises(ValueError, match="nope"):
            call()
    with pytest.raises(ValueError, match="fig6"):
        X.run_experiment("fig6", "quick", root=str(tmp_path), progress=False)
    assert not any(tmp_path.iterdir()), "a rejected call must not create runs"


def test_fig5_configs_have_equal_tokens_per_step_and_in_total():
    for name in X.PROFILES:
        cfgs = X.fig5_configs(name, root="r")
        assert [c.context for c in cfgs] == sorted(c.context for c in cfgs) and len(cfgs) >= 3
        assert len({c.batch_size * c.context for c in cfgs}) == 1          # tokens per optimizer step
        assert len({c.n_steps * c.batch_size * c.context for c in cfgs}) == 1  # tokens in all
        assert all(c.masking == "causal" and not c.fixed_bos for c in cfgs)
        assert len({c.out_dir for c in cfgs}) == len(cfgs)
        t2 = X.table2_configs(name, root="r")
        assert [(c.masking, c.fixed_bos) for c in t2] == [("causal", False), ("causal", True),
                                                         ("intra_doc", False), ("intra_doc", True)]
        # the causal, no-<bos> run of Table 2 is one of Fig. 5's runs: the same folder
        assert t2[0].out_dir in {c.out_dir for c in cfgs}


# ------------------------------------------------------------------------------ runs
def test_shared_causal_run_is_trained_once(quick):
    folders = run_folders(quick["root"])
    assert len(folders) == 6                                    # 4 (Table 2) + 3 (Fig. 5) - 1 shared
    assert sorted(quick["trained"]) == sorted(os.path.realpath(p) for p in folders)   # each trained once
    shared = [p for p in folders if run_settings(p)["masking"] == "causal" and not run_settings(p)["fixed_bos"]
              and run_settings(p)["context"] == X.PROFILES["quick"]["table2_context"]]
    assert len(shared) == 1
    p = X.PROFILES["quick"]
    n = p["total_tokens"] // p["tokens_per_step"]
    expected_steps = sorted(set(range(p["eval_every"], n + 1, p["eval_every"])) | {n})
    assert [r["step"] for r in read_log(shared[0])] == expected_steps   # one log, no line written twice
    fig5_dirs = {os.path.realpath(r["out_dir"]) for r in quick["fig5"]["runs"]}
    assert os.path.realpath(shared[0]) in fig5_dirs


def test_second_call_is_a_no_op_resume(quick, monkeypatch):
    before = mtimes(quick["root"])

    def no_training(*a, **kw):
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(X, "train", no_training)
    again = {name: X.run_experiment(name, "quick", root=str(quick["root"]), out=str(quick["dir"] / "again"),
                                    progress=False) for name in ("table2", "fig5")}
    assert mtimes(quick["root"]) == before
    assert again["table2"]["rows"] == quick["table2"]["rows"]
    assert again["fig5"]["runs"] == quick["fig5"]["runs"]


def test_table2_rows_are_the_papers_rows_with_the_final_log_numbers(quick):
    rows = quick["table2"]["rows"]
    assert [(r["masking"], r["fixed_bos"], r["inference"]) for r in rows] == [t[:3] for t in PAPER_TABLE2]
    assert [(r["paper_sink"], r["paper_loss"]) for r in rows] == [t[3:] for t in PAPER_TABLE2]
    p = X.PROFILES["quick"]
    runs = {}
    for folder in run_folders(quick["root"]):
        s = run_settings(folder)
        if s["context"] == p["table2_context"]:
            runs[(s["masking"], s["fixed_bos"])] = read_log(folder)
    assert len(runs) == 4
    for r in rows:
        log = runs[(r["masking"], r["fixed_bos"])]
        last = last_eval(log)
        assert last["step"] == log[-1]["step"] == p["total_tokens"] // p["tokens_per_step"]
        mode = r["inference"]
        assert r["sink_0.3"] == pytest.approx(100 * last[f"sink_{mode}_0.3"], abs=1e-12)
        assert r["sink_0.8"] == pytest.approx(100 * last[f"sink_{mode}_0.8"], abs=1e-12)
        assert r["val_loss"] == last[f"val_loss_{mode}"] and math.isfinite(r["val_loss"])
        assert r["importance"] == last[f"importance_{mode}"]
        assert r["val_loss_train"] == last["val_loss_train"]
    # the two inference modes of one model are different evaluations (not one number copied)
    assert rows[2]["val_loss"] != rows[3]["val_loss"]
    md = quick["table2"]["markdown"].splitlines()
    assert len(md) == 2 + len(PAPER_TABLE2)
    assert md[5].startswith("| causal | yes | text only |") and md[5].endswith("| 0.05 | 7.56 |")


def test_fig5_runs_see_equal_tokens_per_step_and_in_total(quick):
    p = X.PROFILES["quick"]
    runs = quick["fig5"]["runs"]
    assert [r["context"] for r in runs] == list(p["contexts"])
    per_step, totals = set(), set()
    for r in runs:
        folder = r["out_dir"]
        s = run_settings(folder)
        assert (s["context"], s["masking"], s["fixed_bos"]) == (r["context"], "causal", False)
        log = read_log(folder)
        per_step |= {line["tokens"] / line["step"] for line in log}
        totals.add(log[-1]["tokens"])
        ev = [line for line in log if line["val_loss_text"] is not None]
        assert r["tokens"] == [line["tokens"] for line in ev]
        assert r["sink_0.3"] == [line["sink_text_0.3"] for line in ev]
        assert r["sink_0.8"] == [line["sink_text_0.8"] for line in ev]
        assert r["val_loss"] == [line["val_loss_text"] for line in ev]
        assert r["importance"] == [line["importance_text"] for line in ev]
    assert per_step == {float(p["tokens_per_step"])}
    assert totals == {p["total_tokens"]}
    fig = Path(quick["fig5"]["figure"])
    assert fig.read_bytes()[:8] == PNG and fig.stat().st_size > 10_000


def test_cli_experiment_table2_prints_the_table(quick):
    before = mtimes(quick["root"])
    out = quick["dir"] / "cli"
    res = subprocess.run([sys.executable, "-m", "sinklab.cli", "experiment", "table2", "--profile", "quick",
                          "--root", str(quick["root"]), "--out", str(out), "--quiet"],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("|")]
    assert lines == quick["table2"]["markdown"].splitlines()
    assert json.loads((out / "table2-quick.json").read_text())["rows"] == quick["table2"]["rows"]
    assert mtimes(quick["root"]) == before                     # finished runs: nothing retrained


# ------------------------------------------------------------------------------ the report's section
def test_uniform_first_importance():
    for T in (1, 2, 32, 64):
        A = np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]     # uniform causal attention
        assert report.uniform_first_importance(T) == pytest.approx(A[:, 0].mean(), rel=1e-12)
    with pytest.raises(ValueError):
        report.uniform_first_importance(0)


def test_report_reads_cpu_summaries_or_runs_the_quick_profile(quick, monkeypatch, tmp_path):
    def no_training(*a, **kw):
        raise AssertionError("trained again")

    monkeypatch.setattr(X, "train", no_training)
    # no cpu summaries: the quick profile, whose runs are already finished in out/runs
    res = report.training_results("auto", root=str(tmp_path / "nothing"), out=str(quick["out"]), progress=False)
    assert (res["source"], res["profile"]) == ("ran", "quick")
    assert "No cpu-profile summaries" in res["note"] and "quick profile was run instead" in res["note"]
    assert res["table2"]["rows"] == quick["table2"]["rows"] and res["fig5"]["runs"] == quick["fig5"]["runs"]
    # cpu summaries one folder below the root (as `sinklab experiment --out ROOT/summary` leaves them)
    summary = tmp_path / "exp" / "summary"
    summary.mkdir(parents=True)
    for name in ("fig5", "table2"):
        s = dict(quick[name], profile={**quick[name]["profile"], "name": "cpu"})
        (summary / f"{name}-cpu.json").write_text(json.dumps(s))
    res = report.training_results("auto", root=str(tmp_path / "exp"), out=str(tmp_path / "o"), progress=False)
    assert (res["source"], res["profile"], res["where"]) == ("read", "cpu", str(summary))
    assert res["table2"]["rows"] == quick["table2"]["rows"]
    (summary / "table2-cpu.json").write_text(json.dumps({"rows": []}))
    with pytest.raises(ValueError, match="table2-cpu.json"):
        report.training_results("auto", root=str(tmp_path / "exp"), out=str(tmp_path / "o"), progress=False)
    with pytest.raises(ValueError, match="huge"):
        report.training_results("huge", root=str(tmp_path), out=str(tmp_path / "o"), progress=False)


def test_report_section_states_what_the_numbers_show(quick, monkeypatch, tmp_path):
    monkeypatch.setattr(X, "train", lambda *a, **kw: pytest.fail("trained again"))
    out = tmp_path / "rep"
    (out / report.TRAINING_DIR).mkdir(parents=True)
    # the report's quick layout: OUT/training/runs holds the runs
    os.symlink(quick["root"], out / report.TRAINING_DIR / "runs")
    ctx = report.Context(None, report.Settings.for_run(True), str(out), False, training_profile="quick")
    sec = report.section_training(ctx)
    for f in sec.figures:
        assert (out / f).read_bytes()[:8] == PNG
    assert quick["table2"]["markdown"] in sec.body
    assert "smoke test" in sec.reading and "--profile cpu" in sec.reading
    size = sec.numbers["model_size"]
    m = X.PROFILES["quick"]["model"]
    d, L, f, V = m["d_model"], m["n_layers"], m["d_ff"], size["vocab_size"]
    assert size["params"] == 2 * V * d + d + L * (2 * d + 4 * d * d + 3 * d * f)   # untied, no biases
    assert f"{size['params']:,} parameters" in sec.here and f"{X.PROFILES['quick']['total_tokens']:,}" in sec.here
    # the verdicts follow the logs: sinks formed iff some evaluation has a head above eps = 0.3
    peak = max(line["sink_text_0.3"] for r in quick["fig5"]["runs"] for line in read_log(r["out_dir"])
               if line["sink_text_0.3"] is not None)
    assert sec.numbers["fig5_reading"]["sinks_formed"] == (peak > 0)
    assert ("No head crossed eps = 0.3" in sec.reading) == (peak == 0)
    rows = {(r["masking"], r["fixed_bos"], r["inference"]): r for r in quick["table2"]["rows"]}
    d_causal = rows[("causal", True, "text")]["val_loss"] - rows[("causal", True, "bos")]["val_loss"]
    assert sec.numbers["table2_reading"]["delta_loss_causal_fixed_bos"] == pytest.approx(d_causal)
    assert ("collapses as in the paper" in sec.reading) == (d_causal > 1.0)
    skipped = report.section_training(report.Context(None, report.Settings.for_run(True), str(out), False,
                                                     training_profile="none"))
    assert skipped.figures == [] and "--training-profile none" in skipped.here
