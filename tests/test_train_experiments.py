"""The paper's pre-training experiments in miniature (sinklab.train.experiments) on the quick
profile with its 3 seeds, their criteria and readings (sinklab.train.criteria), and the report's
section that reads them (sinklab.report).

Both experiments run once per module into a temporary folder (18 runs, about a minute on 2
cores, on the real corpus, prepared once per machine). The criteria are also fed synthetic
summaries, built by the summary functions from made-up logs, that give every status. Every
number in a summary is checked against an independent read of the runs' own files: ``log.jsonl``
parsed here line by line, each run's settings from its checkpoint's ``trainer_state.json``
rather than from its folder name, and mean ± sd and the t interval over seeds in float64 NumPy
with the tabled t quantile. The paper's Table 2 is written out again below from the paper, not
imported from the code.
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
from sinklab.analysis import status as S
from sinklab.train import criteria as K
from sinklab.train import depth as D
from sinklab.train import experiments as X
from sinklab.train import variants as V
from tests.support.run_logs import read_log

SEEDS = [0, 1, 2]
T975_DF2 = 4.302652729911275       # Student's t quantile 0.975 with 2 degrees of freedom (tables)
# Seed 0's folders as they were named before seeds were added (sinklab at 23facf8); the cpu ones
# are the folders of the committed notebooks/results/training/fig5-cpu.json.
OLD_NAMES = {"quick": ["quick-C32-causal-8d48e3e234", "quick-C64-causal-e1eaba989b", "quick-C128-causal-6e4459377e",
                       "quick-C64-causal-bos-57cf8e0f70", "quick-C64-intra_doc-2f73f177f0",
                       "quick-C64-intra_doc-bos-8944dbdb35"],
             "cpu": ["cpu-C64-causal-43a527f152", "cpu-C128-causal-7f2db6dc51", "cpu-C256-causal-b32c677995",
                     "cpu-C512-causal-35c0b9a5bd", "cpu-C1024-causal-38ff10ba7a", "cpu-C256-causal-bos-d7e62bb78c",
                     "cpu-C256-intra_doc-76fde03ceb", "cpu-C256-intra_doc-bos-c278dfcf6b"],
             "cpu2x": ["cpu2x-C256-causal-393190eea9", "cpu2x-C256-causal-bos-2732a0cc90"],
             "full": ["full-C64-causal-e14e52dc22", "full-C256-intra_doc-bos-8241f06399"]}
REPO = Path(__file__).resolve().parents[1]

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


def eval_lines(log):
    return [r for r in log if r["val_loss_text"] is not None]


def seed_stats(values):
    """mean, sd (ddof 1) and the t interval of the mean, in float64 NumPy, for 3 seeds."""
    v = np.asarray(values, np.float64)
    m, sd = v.mean(), v.std(ddof=1)
    h = T975_DF2 * sd / np.sqrt(v.size)
    return m, sd, m - h, m + h


def check_seed_summary(summ, values, rel=1e-12, abs_=1e-12):
    m, sd, lo, hi = seed_stats(values)
    assert summ["n"] == len(values) == 3
    assert summ["values"] == pytest.approx(list(values), rel=rel, abs=abs_)
    assert summ["mean"] == pytest.approx(m, rel=rel, abs=abs_)
    assert summ["sd"] == pytest.approx(sd, rel=1e-9, abs=abs_)
    tol = 1e-9 * (hi - lo) + 1e-12          # the t quantile is found by bisection: relative 1e-9 of the width
    assert summ["interval"]["lo"] == pytest.approx(lo, abs=tol)
    assert summ["interval"]["hi"] == pytest.approx(hi, abs=tol)
    assert summ["interval"]["method"] == "t"


def uniform_a0(T):
    """a_0 of uniform causal attention over T tokens, by materialising it (float64)."""
    A = np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]
    return A[:, 0].mean()


# ------------------------------------------------------------------------------ profiles and seeds
def test_unknown_profile_and_experiment_are_rejected(tmp_path):
    for call in (lambda: X.profile("nope"), lambda: X.run_config("nope", 64), lambda: X.fig5_configs("nope"),
                 lambda: X.table2_configs("nope"),
                 lambda: X.run_experiment("fig5", "nope", root=str(tmp_path), progress=False)):
        with pytest.raises(ValueError, match="nope"):
            call()
    with pytest.raises(ValueError, match="fig6"):
        X.run_experiment("fig6", "quick", root=str(tmp_path), progress=False)
    for bad in (0, [], [1, 1], [-1], 2.5, True):
        with pytest.raises(ValueError, match="seed"):
            X.fig5_configs("quick", root=str(tmp_path), seeds=bad)
    with pytest.raises(ValueError, match="seed"):
        X.run_config("quick", 64, seed=-1)
    assert not any(tmp_path.iterdir()), "a rejected call must not create runs"


def test_fig5_configs_have_equal_tokens_per_step_and_in_total():
    for name in X.PROFILES:
        assert X.PROFILES[name]["seeds"] == 3
        cfgs = X.fig5_configs(name, root="r")
        assert [c.context for c in cfgs] == sorted(c.context for c in cfgs) and len(cfgs) >= 9
        assert [c.seed for c in cfgs] == SEEDS * len(X.PROFILES[name]["contexts"])
        assert len({c.batch_size * c.context for c in cfgs}) == 1          # tokens per optimizer step
        assert len({c.n_steps * c.batch_size * c.context for c in cfgs}) == 1  # tokens in all
        assert all(c.masking == "causal" and not c.fixed_bos for c in cfgs)
        assert len({c.out_dir for c in cfgs}) == len(cfgs)
        t2 = X.table2_configs(name, root="r")
        assert [(c.masking, c.fixed_bos, c.seed) for c in t2] == [
            (m, b, s) for m, b in [("causal", False), ("causal", True), ("intra_doc", False), ("intra_doc", True)]
            for s in SEEDS]
        # the causal, no-<bos> runs of Table 2 are Fig. 5's runs at that context: the same folders
        assert {c.out_dir for c in t2[:3]} <= {c.out_dir for c in cfgs}


def test_seed_zero_keeps_the_folder_names_of_before_seeds():
    for name, old in OLD_NAMES.items():
        zero = {os.path.basename(c.out_dir) for c in X.fig5_configs(name, root="r", seeds=1) +
                X.table2_configs(name, root="r", seeds=1)}
        assert set(old) <= zero
        other = [os.path.basename(c.out_dir) for c in X.fig5_configs(name, root="r", seeds=[1, 2])]
        assert all("-s1-" in n or "-s2-" in n for n in other) and not set(other) & zero
    committed = json.loads((REPO / "notebooks/results/training/fig5-cpu.json").read_text())
    assert [os.path.basename(r["out_dir"]) for r in committed["runs"]] == OLD_NAMES["cpu"][:5]
    # the old one-seed call still names seed 0's folder
    assert X.fig5_configs("cpu", root="r", seed=0)[0].out_dir == os.path.join("r", OLD_NAMES["cpu"][0])
    assert [c.seed for c in X.fig5_configs("quick", root="r", seeds=[0, 2])] == [0, 2] * 3


def fake_finished_log(cfg, **fields):
    steps = sorted(set(range(cfg.eval_every, cfg.n_steps + 1, cfg.eval_every)) | {cfg.n_steps})
    line = {"val_loss_bos": 4.0, "val_loss_text": 4.0, "val_loss_train": 4.0, "importance_bos": 0.07,
            "importance_text": 0.07, **{f"sink_{m}_{e}": 0.0 for m in ("bos", "text") for e in ("0.3", "0.8")}}
    line.update(fields)
    return [{"step": s, "tokens": s * cfg.batch_size * cfg.context, **line} for s in steps]


def write_log(cfg, log):
    os.makedirs(cfg.out_dir, exist_ok=True)
    with open(os.path.join(cfg.out_dir, "log.jsonl"), "w") as f:
        for r in log:
            f.write(json.dumps(r) + "\n")


def test_cpu_profile_reuses_seed_zero_runs_and_trains_seeds_one_and_two(tmp_path, monkeypatch):
    """`sinklab experiment fig5 --profile cpu` on a root holding the runs of before (seed 0,
    finished): only seeds 1 and 2 are trained, seed 0's logs are read as they are; a run left
    unfinished is handed to train (which resumes it)."""
    root = tmp_path / "sinklab-experiments"
    cfgs = X.fig5_configs("cpu", root=str(root))
    assert len(cfgs) == 15
    for c in cfgs:
        if c.seed == 0:
            write_log(c, fake_finished_log(c))
    half = [c for c in cfgs if c.seed == 1][0]
    write_log(half, fake_finished_log(half)[:3])          # killed after 3 evaluations
    called = []

    class Res:
        def __init__(self, log):
            self.log = log

    def fake_train(cfg, *a, **kw):
        called.append(cfg.out_dir)
        return Res(fake_finished_log(cfg))

    monkeypatch.setattr(X, "train", fake_train)
    logs = X.run_all(cfgs, progress=False)
    assert sorted(called) == sorted(c.out_dir for c in cfgs if c.seed != 0)
    assert half.out_dir in called
    assert [os.path.basename(c.out_dir) for c in cfgs if c.seed == 0] == OLD_NAMES["cpu"][:5]
    assert all(log[-1]["step"] == c.n_steps for c, log in zip(cfgs, logs))
    called.clear()
    for c, log in zip(cfgs, logs):
        write_log(c, log)
    X.run_all(cfgs, progress=False)
    assert called == []                                   # all finished: nothing trained


def test_cli_seeds_option(tmp_path, monkeypatch):
    from sinklab import cli

    args = cli.build_parser().parse_args(["experiment", "fig5", "--profile", "quick", "--seeds", "2",
                                          "--records", str(tmp_path / "rec")])
    assert args.seeds == 2 and args.records == str(tmp_path / "rec")
    assert cli.build_parser().parse_args(["experiment", "table2"]).seeds is None
    seen = {}

    def fake_run_experiment(name, profile_name, **kw):
        seen.update(kw, name=name, profile=profile_name)
        raise SystemExit(0)

    monkeypatch.setattr(X, "run_experiment", fake_run_experiment)
    with pytest.raises(SystemExit):
        cli.cmd_experiment(args)
    assert seen["seeds"] == 2 and seen["name"] == "fig5" and seen["records_dir"] == str(tmp_path / "rec")


# ------------------------------------------------------------------------------ runs
@pytest.mark.slow  # the quick profile's 18 training runs (module fixture)
def test_shared_causal_run_is_trained_once(quick):
    folders = run_folders(quick["root"])
    assert len(folders) == 6 * 3                                # (4 (Table 2) + 3 (Fig. 5) - 1 shared) x 3 seeds
    assert sorted(quick["trained"]) == sorted(os.path.realpath(p) for p in folders)   # each trained once
    shared = [p for p in folders if run_settings(p)["masking"] == "causal" and not run_settings(p)["fixed_bos"]
              and run_settings(p)["context"] == X.PROFILES["quick"]["table2_context"]]
    assert sorted(run_settings(p)["seed"] for p in shared) == SEEDS
    p = X.PROFILES["quick"]
    n = p["total_tokens"] // p["tokens_per_step"]
    expected_steps = sorted(set(range(p["eval_every"], n + 1, p["eval_every"])) | {n})
    for f in shared:
        assert [r["step"] for r in read_log(f)] == expected_steps   # one log, no line written twice
    fig5_dirs = {os.path.realpath(d) for r in quick["fig5"]["runs"] for d in r["out_dirs"]}
    assert {os.path.realpath(f) for f in shared} <= fig5_dirs


@pytest.mark.slow  # the quick profile's 18 training runs (module fixture)
def test_seeds_are_distinct_runs_with_different_weights(quick):
    st = pytest.importorskip("safetensors.numpy")
    by_cond = {}
    for f in run_folders(quick["root"]):
        s = run_settings(f)
        by_cond.setdefault((s["context"], s["masking"], s["fixed_bos"]), {})[s["seed"]] = f
    assert len(by_cond) == 6
    for cond, seeds in by_cond.items():
        assert sorted(seeds) == SEEDS
        assert len({p.name for p in seeds.values()}) == 3
        weights = {}
        for seed, f in seeds.items():
            step = (f / "latest").read_text().strip()
            weights[seed] = st.load_file(str(f / step / "model.safetensors"))
        names = sorted(weights[0])
        assert names == sorted(weights[1]) == sorted(weights[2])
        for a, b in ((0, 1), (0, 2), (1, 2)):
            assert any(not np.array_equal(weights[a][k], weights[b][k]) for k in names), (cond, a, b)
        # and the evaluations differ too (different models, not one copied)
        finals = [last_eval(read_log(seeds[s]))["val_loss_text"] for s in SEEDS]
        assert len(set(finals)) == 3


@pytest.mark.slow  # the quick profile's 18 training runs (module fixture)
def test_second_call_is_a_no_op_resume(quick, monkeypatch):
    before = mtimes(quick["root"])

    def no_training(*a, **kw):
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(X, "train", no_training)
    again = {name: X.run_experiment(name, "quick", root=str(quick["root"]), out=str(quick["dir"] / "again"),
                                    progress=False) for name in ("table2", "fig5")}
    assert mtimes(quick["root"]) == before
    assert again["table2"]["rows"] == quick["table2"]["rows"]
    assert again["table2"]["models"] == quick["table2"]["models"]
    assert again["fig5"]["runs"] == quick["fig5"]["runs"]
    assert again["fig5"]["differences"] == quick["fig5"]["differences"]
    # the JSON on disk is the summary (NaN-free: equal after a round trip)
    for name in ("table2", "fig5"):
        disk = json.loads((quick["dir"] / "again" / f"{name}-quick.json").read_text())
        assert disk == json.loads(json.dumps(again[name]))


def table2_logs(quick):
    p = X.PROFILES["quick"]
    runs = {}
    for folder in run_folders(quick["root"]):
        s = run_settings(folder)
        if s["context"] == p["table2_context"]:
            runs.setdefault((s["masking"], s["fixed_bos"]), {})[s["seed"]] = read_log(folder)
    assert len(runs) == 4 and all(sorted(v) == SEEDS for v in runs.values())
    return runs


@pytest.mark.slow  # the quick profile's 18 training runs (module fixture)
def test_table2_rows_are_the_papers_rows_with_the_final_log_numbers(quick):
    rows = quick["table2"]["rows"]
    assert quick["table2"]["seeds"] == SEEDS
    assert [(r["masking"], r["fixed_bos"], r["inference"]) for r in rows] == [t[:3] for t in PAPER_TABLE2]
    assert [(r["paper_sink"], r["paper_loss"]) for r in rows] == [t[3:] for t in PAPER_TABLE2]
    p = X.PROFILES["quick"]
    runs = table2_logs(quick)
    for r in rows:
        assert r["seeds"] == SEEDS
        lasts = []
        for s in SEEDS:
            log = runs[(r["masking"], r["fixed_bos"])][s]
            last = last_eval(log)
            assert last["step"] == log[-1]["step"] == p["total_tokens"] // p["tokens_per_step"]
            lasts.append(last)
        mode = r["inference"]
        per = {"sink_0.3": [100 * x[f"sink_{mode}_0.3"] for x in lasts],
               "sink_0.8": [100 * x[f"sink_{mode}_0.8"] for x in lasts],
               "importance": [x[f"importance_{mode}"] for x in lasts],
               "val_loss": [x[f"val_loss_{mode}"] for x in lasts],
               "val_loss_train": [x["val_loss_train"] for x in lasts]}
        per["importance_over_uniform"] = [v / uniform_a0(min(64, p["table2_context"])) for v in per["importance"]]
        for k, vals in per.items():
            assert r["per_seed"][k] == pytest.approx(vals, rel=1e-12, abs=1e-12)
            check_seed_summary(r["summary"][k], vals)
            if k in r and k != "importance_over_uniform":
                assert r[k] == pytest.approx(np.mean(np.asarray(vals, np.float64)), rel=1e-12, abs=1e-12)
            assert r["sd"][k] == pytest.approx(np.std(np.asarray(vals, np.float64), ddof=1), rel=1e-9, abs=1e-12)
        assert all(math.isfinite(v) for v in per["val_loss"])
    # the two inference modes of one model are different evaluations (not one number copied)
    assert rows[2]["per_seed"]["val_loss"] != rows[3]["per_seed"]["val_loss"]
    md = quick["table2"]["markdown"].splitlines()
    assert len(md) == 2 + len(PAPER_TABLE2)
    assert md[5].startswith("| causal | yes | text only |") and md[5].endswith("| 0.05 | 7.56 |")
    m, sd = np.mean(per["val_loss"]), np.std(per["val_loss"], ddof=1)      # the last row: intra-doc, fixed, text
    assert md[-1].split(" | ")[6] == f"{m:.3f} ± {sd:.3f}"


@pytest.mark.slow  # the quick profile's 18 training runs (module fixture)
def test_table2_paired_changes_without_bos_match_numpy(quick):
    runs = table2_logs(quick)
    models = {(m["masking"], m["fixed_bos"]): m for m in quick["table2"]["models"]}
    assert sorted(models) == sorted(runs)
    for cond, by_seed in runs.items():
        lasts = [last_eval(by_seed[s]) for s in SEEDS]
        rem = models[cond]["bos_removed"]
        d_loss = [x["val_loss_text"] - x["val_loss_bos"] for x in lasts]          # same model and seed
        check_seed_summary(rem["val_loss"], d_loss)
        for e in ("0.3", "0.8"):
            check_seed_summary(rem[f"sink_{e}"], [100 * (x[f"sink_text_{e}"] - x[f"sink_bos_{e}"]) for x in lasts])
            assert models[cond][f"peak_sink_{e}"] == pytest.approx(
                100 * max(max(x[f"sink_text_{e}"], x[f"sink_bos_{e}"]) for x in lasts))
        check_seed_summary(rem["importance"], [x["importance_text"] - x["importance_bos"] for x in lasts])
    # the criteria's paired change is the summary's
    d = K.bos_removed(quick["table2"], "causal", True, "val_loss")
    assert d == pytest.approx(models[("causal", True)]["bos_removed"]["val_loss"]["values"], abs=1e-12)
    assert len(quick["table2"]["differences_markdown"].splitlines()) == 2 + 4


@pytest.mark.slow  # the quick profile's 18 training runs (module fixture)
def test_fig5_runs_see_equal_tokens_per_step_and_in_total(quick):
    p = X.PROFILES["quick"]
    runs = quick["fig5"]["runs"]
    assert [r["context"] for r in runs] == list(p["contexts"])
    assert quick["fig5"]["seeds"] == SEEDS
    per_step, totals = set(), set()
    for r in runs:
        assert r["seeds"] == SEEDS and len(r["out_dirs"]) == 3 and r["out_dir"] == r["out_dirs"][0]
        evs = []
        for s, folder in zip(SEEDS, r["out_dirs"]):
            st = run_settings(folder)
            assert (st["context"], st["masking"], st["fixed_bos"], st["seed"]) == (r["context"], "causal", False, s)
            log = read_log(folder)
            per_step |= {line["tokens"] / line["step"] for line in log}
            totals.add(log[-1]["tokens"])
            evs.append(eval_lines(log))
            assert r["tokens"] == [line["tokens"] for line in evs[-1]]
        for key, field in (("sink_0.3", "sink_text_0.3"), ("sink_0.8", "sink_text_0.8"),
                           ("importance", "importance_text"), ("val_loss", "val_loss_text")):
            table = np.asarray([[line[field] for line in ev] for ev in evs], np.float64)    # (seeds, evaluations)
            assert r["per_seed"][key] == table.tolist()
            assert r[key] == pytest.approx(table.mean(axis=0).tolist(), rel=1e-12, abs=1e-15)
            assert r["sd"][key] == pytest.approx(table.std(axis=0, ddof=1).tolist(), rel=1e-9, abs=1e-15)
            check_seed_summary(r["final"][key], table[:, -1].tolist())
        u = uniform_a0(min(64, r["context"]))
        assert r["uniform_importance"] == pytest.approx(u, rel=1e-12)
        check_seed_summary(r["final"]["importance_over_uniform"], [ev[-1]["importance_text"] / u for ev in evs])
        assert r["peak_sink_0.3"] == max(line["sink_text_0.3"] for ev in evs for line in ev)
    assert per_step == {float(p["tokens_per_step"])}
    assert totals == {p["total_tokens"]}
    d = quick["fig5"]["differences"]["longest_minus_shortest"]
    lo, hi = runs[0], runs[-1]
    assert d["contexts"] == [lo["context"], hi["context"]] and d["seeds"] == SEEDS
    for key in ("sink_0.3", "sink_0.8", "importance", "val_loss"):
        vals = [read_final(hi["out_dirs"][i], key) - read_final(lo["out_dirs"][i], key) for i in range(3)]
        check_seed_summary(d[key], vals)
    fig = Path(quick["fig5"]["figure"])
    assert fig.read_bytes()[:8] == PNG and fig.stat().st_size > 10_000
    assert Path(quick["table2"]["figure"]).read_bytes()[:8] == PNG


@pytest.mark.slow  # the quick profile's 18 training runs (module fixture)
def test_fig5_losses_on_the_same_targets_whatever_the_context(quick, corpus):
    """val_loss_common: every context's model scored on each held-out document's first C_min - 1
    tokens. For the shortest context that is its own evaluation (equal to its logged loss); for
    the others it is recomputed here from the checkpoint's logits in float64."""
    import sinklab
    from sinklab.train.evaluate import eval_documents

    fig5 = quick["fig5"]
    runs = fig5["runs"]
    n = runs[0]["context"] - 1
    assert fig5["common_target_tokens"] == n
    for i, folder in enumerate(runs[0]["out_dirs"]):
        assert runs[0]["final_per_seed"]["val_loss_common"][i] == pytest.approx(
            read_final(folder, "val_loss"), rel=1e-6)
    folder = runs[-1]["out_dirs"][1]
    model = sinklab.load(str(Path(folder) / (Path(folder) / "latest").read_text().strip()))
    docs = eval_documents(corpus.heldout_documents(), run_settings(folder)["eval_docs"])
    nll, count = 0.0, 0
    for d in docs:
        x = np.asarray(d[:n], np.int64)
        lg = model.run(x, capture="logits", progress=False).logits.astype(np.float64)
        lse = np.log(np.exp(lg - lg.max(axis=1, keepdims=True)).sum(axis=1)) + lg.max(axis=1)
        nll += float((lse[:-1] - lg[np.arange(len(x) - 1), x[1:]]).sum())
        count += len(x) - 1
    assert runs[-1]["final_per_seed"]["val_loss_common"][1] == pytest.approx(nll / count, rel=1e-5)
    d = fig5["differences"]["longest_minus_shortest"]
    check_seed_summary(d["val_loss_common"], [b - a for a, b in zip(runs[0]["final_per_seed"]["val_loss_common"],
                                                                     runs[-1]["final_per_seed"]["val_loss_common"])])
    assert "on the same targets" in fig5["reading"]


def read_final(folder, key):
    field = {"sink_0.3": "sink_text_0.3", "sink_0.8": "sink_text_0.8", "importance": "importance_text",
             "val_loss": "val_loss_text"}[key]
    return last_eval(read_log(folder))[field]


@pytest.mark.slow  # the quick profile's 18 training runs (module fixture)
def test_quick_summaries_carry_verdicts_and_readings(quick):
    for name, crit, reading in (("fig5", K.criterion_fig5, K.fig5_reading), ("table2", K.criterion_table2,
                                                                              K.table2_reading)):
        s = quick[name]
        text, nums, verdict = reading(s)
        assert verdict.status == crit(s).status == s["verdict"]["status"] and s["reading"] == text
        assert verdict.status in S.STATUSES and nums["verdict"]["status"] == verdict.status
        assert "rises" not in text
    peak = max(r["peak_sink_0.3"] for r in quick["fig5"]["runs"])
    v = K.criterion_fig5(quick["fig5"])
    if peak == 0:       # what the quick profile gives on this corpus: no sinks, a null that tests nothing
        assert v.status == S.INCONCLUSIVE and "no head crossed ε = 0.3 in any seed" in v.reason
        assert "No head crossed ε = 0.3 in any seed" in quick["fig5"]["reading"]


@pytest.mark.slow  # the quick profile's 18 training runs (module fixture)
def test_cli_experiment_table2_prints_the_table(quick):
    before = mtimes(quick["root"])
    out = quick["dir"] / "cli"
    res = subprocess.run([sys.executable, "-m", "sinklab.cli", "experiment", "table2", "--profile", "quick",
                          "--root", str(quick["root"]), "--out", str(out), "--quiet"],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("|")]
    assert lines == (quick["table2"]["markdown"] + "\n" + quick["table2"]["differences_markdown"]).splitlines()
    assert quick["table2"]["reading"] in res.stdout
    assert json.loads((out / "table2-quick.json").read_text())["rows"] == quick["table2"]["rows"]
    assert mtimes(quick["root"]) == before                     # finished runs: nothing retrained


# ------------------------------------------------------------------------------ criteria on synthetic summaries
def synth_fig5(finals, contexts=(32, 64, 128), early=None):
    """A Fig. 5 summary made by fig5_summary from made-up logs: ``finals[C]`` = the per-seed
    final (sink_text_0.3, val_loss_text); ``early`` the sink rate of an earlier evaluation."""
    cfgs, logs = [], []
    for C in contexts:
        for s, (sink, loss) in enumerate(finals[C]):
            c = X.run_config("quick", C, seed=s, root="synthetic")
            first = {"step": 8, "tokens": 8192, "val_loss_text": loss + 1, "val_loss_bos": loss + 1,
                     "val_loss_train": loss + 1, "importance_text": 0.07, "importance_bos": 0.07,
                     "sink_text_0.3": early or 0.0, "sink_text_0.8": 0.0, "sink_bos_0.3": 0.0, "sink_bos_0.8": 0.0}
            last = {**first, "step": 24, "tokens": 24576, "val_loss_text": loss, "sink_text_0.3": sink,
                    "importance_text": 0.07 + sink}
            cfgs.append(c)
            logs.append([first, {"step": 16, "tokens": 16384, "val_loss_text": None}, last])
    return X.fig5_summary(cfgs, logs)


LOSS = [4.0, 4.01, 3.99]


def test_criterion_fig5_gives_every_status():
    z = [(0.0, v) for v in LOSS]
    rising = synth_fig5({32: z, 64: [(0.1, v) for v in LOSS], 128: [(0.30, 4.0), (0.25, 4.01), (0.35, 3.99)]})
    v = K.criterion_fig5(rising)
    assert v.status == S.REPRODUCED and "C = 128" in v.reason
    assert v.numbers["effect"].lo > 0
    falling = synth_fig5({32: [(0.30, 4.0), (0.25, 4.01), (0.35, 3.99)], 64: z, 128: z})
    v = K.criterion_fig5(falling)
    assert v.status == S.CONTRADICTED and "fewer sinks at the longest context" in v.reason
    none = synth_fig5({C: z for C in (32, 64, 128)})
    v = K.criterion_fig5(none)
    assert v.status == S.INCONCLUSIVE and "no head crossed ε = 0.3 in any seed" in v.reason
    text, nums, vr = K.fig5_reading(none)
    assert vr.status == S.INCONCLUSIVE and not nums["sinks_formed"] and "No head crossed" in text
    noisy = synth_fig5({32: [(0.05, 4.0), (0.1, 4.0), (0.0, 4.0)], 64: z, 128: [(0.1, 4.0), (0.0, 4.0), (0.2, 4.0)]})
    v = K.criterion_fig5(noisy)
    assert v.status == S.INCONCLUSIVE and "includes 0" in v.reason
    text, _, _ = K.fig5_reading(noisy)
    assert "no detectable difference" in text
    # a positive difference but no context whose sink rate is established (its interval reaches 0)
    slight = synth_fig5({32: [(0.0, 4.0), (0.49, 4.0), (0.01, 4.0)], 64: z,
                         128: [(0.01, 4.0), (0.5, 4.0), (0.02, 4.0)]})
    v = K.criterion_fig5(slight)
    assert v.status == S.INCONCLUSIVE and "no context's sink-rate interval lies above 0" in v.reason
    assert K.criterion_fig5(synth_fig5({64: z}, contexts=(64,))).status == S.NOT_TESTABLE
    # sinks only in an earlier evaluation: not "no sinks", but no final difference either
    v = K.criterion_fig5(synth_fig5({C: z for C in (32, 64, 128)}, early=0.2))
    assert v.status == S.INCONCLUSIVE and "no head crossed" not in v.reason
    # losses: comparable within 5 % -> reproduced; 1 nat apart -> contradicted
    assert K.criterion_fig5_loss(rising).status == S.REPRODUCED
    apart = synth_fig5({32: z, 64: z, 128: [(0.0, v + 1.0) for v in LOSS]})
    assert K.criterion_fig5_loss(apart).status == S.CONTRADICTED
    assert "validation losses (contradicted)" in K.criterion_fig5(apart).reason


def test_readings_name_each_groups_seed_count_while_a_campaign_is_partial():
    """A context with 2 seeds beside ones with 3 (a campaign still under way) is not described as
    "over 3 seeds": the reading names the range and each context's count."""
    assert K.seeds_phrase([("C = 32", 3), ("C = 64", 3)]) == "3 seeds"
    assert K.seeds_phrase([("a", 1)]) == "1 seed"
    partial = synth_fig5({32: [(0.30, 4.0), (0.25, 4.01)], 64: [(0.1, v) for v in LOSS],
                          128: [(0.30, 4.0), (0.25, 4.01), (0.35, 3.99)]})
    text, nums, _ = K.fig5_reading(partial)
    assert "over 2–3 seeds (C = 32: 2, C = 64: 3, C = 128: 3)" in text and "over 3 seeds" not in text
    full = synth_fig5({C: [(0.1, v) for v in LOSS] for C in (32, 64, 128)})
    assert "over 3 seeds (mean ± sd)" in K.fig5_reading(full)[0]
    two = K.table2_reading(synth_table2(with_(("intra_doc", False), PAPERLIKE[("intra_doc", False)][:2])))[0]
    assert two.startswith("Over 2–3 seeds (") and "intra-doc, text: 2" in two
    assert K.table2_reading(synth_table2(PAPERLIKE))[0].startswith("Over 3 seeds (mean ± sd;")


def test_the_cli_names_each_contexts_seed_count_while_fig5_is_partial(monkeypatch, capsys):
    """`sinklab experiment fig5` prints one line per context: a context with one finished seed
    beside contexts with three is "one seed", not "mean ± sd over 3 seeds"."""
    from sinklab import cli

    def run(seeds, C):
        return {"context": C, "seeds": seeds, "tokens": [1000], "sink_0.3": [0.1], "sink_0.8": [0.0],
                "val_loss": [4.0], "sd": {k: [None if len(seeds) == 1 else 0.01]
                                          for k in ("sink_0.3", "sink_0.8", "val_loss")}}

    fake = {"seeds": [0, 1, 2], "runs": [run([0, 1, 2], 128), run([0], 512)], "figure": "f.png", "reading": "r"}
    monkeypatch.setattr(X, "run_experiment", lambda *a, **kw: fake)
    assert cli.main(["experiment", "fig5", "--profile", "quick", "--no-train", "--quiet"]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("C = ")]
    assert lines[0].endswith("(mean ± sd over 3 seeds)") and " ± 1.00%" in lines[0], lines
    assert lines[1].endswith("(one seed)") and "±" not in lines[1], lines


def synth_table2(conds, drop=()):
    """A Table 2 summary made by table2_summary from made-up logs: ``conds[(masking, fixed)]``
    = per seed (sink_bos, sink_text, loss_bos, loss_text), sink rates as fractions."""
    cfgs, logs = [], []
    for masking, fixed in X.TABLE2_RUNS:
        if (masking, fixed) in drop:
            continue
        for s, (sb, st, lb, lt) in enumerate(conds[(masking, fixed)]):
            cfgs.append(X.run_config("quick", 64, masking, fixed, seed=s, root="synthetic"))
            logs.append([{"step": 24, "tokens": 24576, "val_loss_bos": lb, "val_loss_text": lt, "val_loss_train": lb,
                          "sink_bos_0.3": sb, "sink_text_0.3": st, "sink_bos_0.8": sb / 2, "sink_text_0.8": st / 2,
                          "importance_bos": 0.07 + sb, "importance_text": 0.07 + st}])
    return X.table2_summary(cfgs, logs)


PAPERLIKE = {("causal", False): [(0.65, 0.652, 2.69, 2.70), (0.64, 0.641, 2.70, 2.70), (0.66, 0.66, 2.68, 2.69)],
             ("causal", True): [(0.90, 0.0005, 2.69, 7.56), (0.91, 0.0, 2.70, 7.40), (0.92, 0.001, 2.68, 7.70)],
             ("intra_doc", False): [(0.28, 0.28, 2.67, 2.67)] * 3,
             ("intra_doc", True): [(0.90, 0.0, 2.67, 7.78), (0.91, 0.0, 2.66, 7.60), (0.89, 0.0, 2.68, 7.90)]}


def with_(cond, rows):
    return {**PAPERLIKE, cond: rows}


def test_criterion_table2_paperlike_summary_is_reproduced():
    s = synth_table2(PAPERLIKE)
    claims = K.table2_claims(s)
    assert {k: v.status for k, v in claims.items()} == {k: S.REPRODUCED for k in claims}
    assert set(claims) == {"reliance_loss_causal", "sink_collapse_causal", "reliance_loss_intra_doc",
                           "sink_collapse_intra_doc", "no_fixed_bos_loss_causal", "no_fixed_bos_sink_causal"}
    assert K.criterion_table2(s).status == S.REPRODUCED
    text, nums, v = K.table2_reading(s)
    assert v.status == S.REPRODUCED and "95% CI" in text and set(nums["claims"]) == set(claims)


def test_criterion_table2_reliance_loss_statuses():
    small = with_(("causal", True), [(0.9, 0.0, 4.0, 4.03), (0.91, 0.0, 4.0, 4.02), (0.92, 0.0, 4.0, 4.04)])
    v = K.table2_claims(synth_table2(small))["reliance_loss_causal"]
    assert v.status == S.INCONCLUSIVE and v.reason.startswith("direction only")
    assert K.criterion_table2(synth_table2(small)).status == S.INCONCLUSIVE
    falls = with_(("causal", True), [(0.9, 0.0, 4.0, 3.7), (0.91, 0.0, 4.0, 3.8), (0.92, 0.0, 4.0, 3.75)])
    v = K.table2_claims(synth_table2(falls))["reliance_loss_causal"]
    assert v.status == S.CONTRADICTED and "reverse" in v.reason
    noisy = with_(("causal", True), [(0.9, 0.0, 4.0, 4.5), (0.91, 0.0, 4.0, 3.6), (0.92, 0.0, 4.0, 4.1)])
    assert K.table2_claims(synth_table2(noisy))["reliance_loss_causal"].status == S.INCONCLUSIVE
    straddle = with_(("causal", True), [(0.9, 0.0, 4.0, 4.3), (0.91, 0.0, 4.0, 4.7), (0.92, 0.0, 4.0, 4.5)])
    v = K.table2_claims(synth_table2(straddle))["reliance_loss_causal"]
    assert v.status == S.INCONCLUSIVE and "straddles 0.5" in v.reason


def test_criterion_table2_sink_statuses_reverse_effect_and_no_sinks():
    # the cpu2x pattern: no sinks with <bos>, a few without it -> the reverse effect, contradicted
    rev = with_(("causal", True), [(0.0, 0.0029, 4.0, 4.0), (0.0, 0.0035, 4.0, 4.0), (0.0, 0.004, 4.0, 4.0)])
    v = K.table2_claims(synth_table2(rev))["sink_collapse_causal"]
    assert v.status == S.CONTRADICTED and "reverse effect" in v.reason and "more sinks without ⟨bos⟩" in v.reason
    assert K.criterion_table2(synth_table2(rev)).status == S.CONTRADICTED
    text, _, _ = K.table2_reading(synth_table2(rev))
    assert "more sinks without ⟨bos⟩ than with it" in text
    zeros = {k: [(0.0, 0.0, 4.0, 4.0)] * 3 for k in PAPERLIKE}
    claims = K.table2_claims(synth_table2(zeros))
    for k in ("sink_collapse_causal", "sink_collapse_intra_doc", "no_fixed_bos_sink_causal"):
        assert claims[k].status == S.INCONCLUSIVE and "no head crossed ε = 0.3 in any seed" in claims[k].reason
    assert claims["no_fixed_bos_loss_causal"].status == S.REPRODUCED      # the loss claim is tested on its own
    text, _, _ = K.table2_reading(synth_table2(zeros))
    assert "no head crossed ε = 0.3 in any seed" in text
    no_with = with_(("causal", True), [(0.0, 0.0, 4.0, 9.0), (0.01, 0.0, 4.0, 9.0), (0.0, 0.0, 4.0, 9.0)])
    v = K.table2_claims(synth_table2(no_with))["sink_collapse_causal"]
    assert v.status == S.INCONCLUSIVE and "with-⟨bos⟩ sink rate's interval includes 0" in v.reason
    # (b) without a fixed <bos>: more sinks without <bos> beyond the margin -> contradicted, said so
    more = with_(("causal", False), [(0.60, 0.80, 2.7, 2.7), (0.61, 0.82, 2.7, 2.7), (0.62, 0.81, 2.7, 2.7)])
    v = K.table2_claims(synth_table2(more))["no_fixed_bos_sink_causal"]
    assert v.status == S.CONTRADICTED and "more sinks without ⟨bos⟩: a reverse effect" in v.reason
    fewer = with_(("causal", False), [(0.60, 0.20, 2.7, 2.7), (0.61, 0.22, 2.7, 2.7), (0.62, 0.21, 2.7, 2.7)])
    v = K.table2_claims(synth_table2(fewer))["no_fixed_bos_sink_causal"]
    assert v.status == S.CONTRADICTED and "fewer sinks without ⟨bos⟩" in v.reason
    wide = with_(("causal", False), [(0.60, 0.50, 2.7, 2.7), (0.61, 0.70, 2.7, 2.7), (0.62, 0.60, 2.7, 2.7)])
    assert K.table2_claims(synth_table2(wide))["no_fixed_bos_sink_causal"].status == S.INCONCLUSIVE


def test_criterion_table2_no_fixed_bos_loss_and_missing_runs():
    up = with_(("causal", False), [(0.65, 0.65, 2.7, 3.7), (0.65, 0.65, 2.7, 3.8), (0.65, 0.65, 2.7, 3.75)])
    v = K.table2_claims(synth_table2(up))["no_fixed_bos_loss_causal"]
    assert v.status == S.CONTRADICTED and "the loss rises without ⟨bos⟩" in v.reason
    claims = K.table2_claims(synth_table2(PAPERLIKE, drop=[("causal", True)]))
    assert claims["reliance_loss_causal"].status == claims["sink_collapse_causal"].status == S.NOT_TESTABLE
    assert claims["reliance_loss_intra_doc"].status == S.REPRODUCED


def test_criteria_read_one_seed_summaries_of_before_as_inconclusive():
    """The committed cpu summaries (one seed, written before seeds were added): no interval, so
    nothing is called reproduced or contradicted."""
    fig5 = json.loads((REPO / "notebooks/results/training/fig5-cpu.json").read_text())
    table2 = json.loads((REPO / "notebooks/results/training/table2-cpu.json").read_text())
    v = K.criterion_fig5(fig5)
    assert v.status == S.INCONCLUSIVE and "no interval" in v.reason
    text, nums, _ = K.fig5_reading(fig5)
    assert nums["n_seeds"] == 1 and "rises" not in text and "no interval" in text
    for k, c in K.table2_claims(table2).items():
        assert c.status == S.INCONCLUSIVE, (k, c.reason)
    assert K.table2_reading(table2)[2].status == S.INCONCLUSIVE
    assert X.table2_markdown(table2).splitlines()[2].count("±") == 0


# ------------------------------------------------------------------------------ the report's section
def test_uniform_first_importance():
    for T in (1, 2, 32, 64):
        A = np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]     # uniform causal attention
        assert report.uniform_first_importance(T) == pytest.approx(A[:, 0].mean(), rel=1e-12)
    with pytest.raises(ValueError):
        report.uniform_first_importance(0)


def _real(x):
    """``x`` with every string naming an existing file or folder replaced by its real path."""
    if isinstance(x, dict):
        return {k: _real(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_real(v) for v in x]
    return os.path.realpath(x) if isinstance(x, str) and os.path.exists(x) else x


def _quick_runs_in_cache(quick, out, monkeypatch, tmp_path):
    """The fixture's finished quick runs where a report into ``out`` looks for them (a link)."""
    monkeypatch.setenv("SINKLAB_HOME", str(tmp_path / "home"))
    where = report.quick_runs_dir(str(out))
    os.makedirs(os.path.dirname(where), exist_ok=True)
    os.symlink(quick["root"], where)


@pytest.mark.slow  # the quick profile's 18 training runs (module fixture)
def test_report_reads_cpu_summaries_or_runs_the_quick_profile(quick, monkeypatch, tmp_path):
    def no_training(*a, **kw):
        raise AssertionError("trained again")

    monkeypatch.setattr(X, "train", no_training)
    # no cpu summaries: the quick profile, whose runs are already finished in its scratch folder
    _quick_runs_in_cache(quick, quick["out"], monkeypatch, tmp_path)
    res = report.training_results("auto", root=str(tmp_path / "nothing"), out=str(quick["out"]), progress=False)
    assert os.path.isdir(quick["root"])    # a linked scratch folder is not removed
    assert (res["source"], res["profile"]) == ("ran", "quick")
    assert "No cpu-profile summaries" in res["note"] and "quick profile was run instead" in res["note"]
    # the same runs, reached through the scratch folder's link: equal numbers, paths to the same folders
    assert _real(res["table2"]["rows"]) == _real(quick["table2"]["rows"])
    assert _real(res["fig5"]["runs"]) == _real(quick["fig5"]["runs"])
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
    # the miniature profile's summaries, where they exist, come before the cpu profile's
    for name in ("fig5", "table2"):
        s = dict(quick[name], profile={**quick[name]["profile"], "name": "miniature"})
        (tmp_path / "exp" / f"{name}-miniature.json").write_text(json.dumps(s))
    res = report.training_results("auto", root=str(tmp_path / "exp"), out=str(tmp_path / "o"), progress=False)
    assert (res["source"], res["profile"], res["where"]) == ("read", "miniature", str(tmp_path / "exp"))
    assert "miniature profile's summaries" in res["note"]
    with pytest.raises(ValueError, match="huge"):
        report.training_results("huge", root=str(tmp_path), out=str(tmp_path / "o"), progress=False)


@pytest.mark.slow  # the quick profile's 18 training runs (module fixture)
def test_report_section_states_what_the_numbers_show(quick, monkeypatch, tmp_path):
    monkeypatch.setattr(X, "train", lambda *a, **kw: pytest.fail("trained again"))
    out = tmp_path / "rep"
    (out / report.TRAINING_DIR).mkdir(parents=True)
    # the report's quick layout: the runs in the cache's scratch folder for OUT/training
    _quick_runs_in_cache(quick, out / report.TRAINING_DIR, monkeypatch, tmp_path)
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
    # the readings are the criteria's (sinklab.train.criteria), computed from the per-seed intervals
    t5, n5, v5 = K.fig5_reading(quick["fig5"], size)
    t2, n2, v2 = K.table2_reading(quick["table2"])
    assert t5 in sec.reading and t2 in sec.reading
    # the verdicts follow the logs: sinks formed iff some evaluation of some seed has a head above eps = 0.3
    peak = max(line["sink_text_0.3"] for r in quick["fig5"]["runs"] for d in r["out_dirs"] for line in read_log(d)
               if line["sink_text_0.3"] is not None)
    assert sec.numbers["fig5_reading"]["sinks_formed"] == (peak > 0)
    assert ("No head crossed ε = 0.3 in any seed" in sec.reading) == (peak == 0)
    runs = table2_logs(quick)
    lasts = [last_eval(runs[("causal", True)][s]) for s in SEEDS]
    d_causal = [x["val_loss_text"] - x["val_loss_bos"] for x in lasts]
    got = sec.numbers["table2_reading"]["delta_loss_causal_fixed_bos"]
    assert got["value"] == pytest.approx(np.mean(d_causal)) and got["method"] == "t" and got["n"] == 3
    assert "collapses as in the paper" not in sec.reading
    skipped = report.section_training(report.Context(None, report.Settings.for_run(True), str(out), False,
                                                     training_profile="none"))
    assert skipped.figures == [] and "--training-profile none" in skipped.here


@pytest.mark.slow  # the quick fixture's runs, and twelve quick runs of the depth sweep and the variants
def test_report_section_shows_depth_and_variants_written_beside_the_paper_experiments(quick, monkeypatch, tmp_path):
    out = tmp_path / "rep"
    where = out / report.TRAINING_DIR
    where.mkdir(parents=True)
    _quick_runs_in_cache(quick, where, monkeypatch, tmp_path)
    depth = D.run_depth("quick", root=str(tmp_path / "runs"), out=str(where), progress=False, seeds=2)
    variants = V.run_variants("quick", root=str(tmp_path / "runs"), out=str(where), progress=False, seeds=2)
    monkeypatch.setattr(X, "train", lambda *a, **kw: pytest.fail("trained again"))
    sec = report.section_training(report.Context(None, report.Settings.for_run(True), str(out), False,
                                                 training_profile="quick"))
    for got in (depth, variants):
        assert got["markdown"] in sec.body and got["reading"] in sec.reading
    assert "Verdict on \"deeper models form stronger sinks\"" in sec.reading
    assert f"{report.TRAINING_DIR}/depth-quick.png" in sec.figures and f"{report.TRAINING_DIR}/variants-quick.png" in sec.figures
    for f in sec.figures:
        assert (out / f).read_bytes()[:8] == PNG
    assert sec.numbers["beyond"]["depth"]["verdict"] == depth["verdict"]
    assert sec.numbers["beyond"]["variants"]["verdict"] == variants["verdicts"]
    (where / "variants-quick.json").write_text(json.dumps({"variants": [], "profile": "quick"}))
    with pytest.raises(ValueError, match="variants-quick.json"):
        report.section_training(report.Context(None, report.Settings.for_run(True), str(out), False,
                                               training_profile="quick"))


def test_finished_runs_of_a_sweep_are_adopted_only_when_every_setting_matches(corpus, tmp_path, monkeypatch):
    """A run trained by a sweep (another folder, another thread count and checkpoint retention)
    with the settings of an experiment's condition is copied in and read, not trained again; a run
    whose learning rate differs, or one that stopped early, is not adopted."""
    import dataclasses

    root, sweep = tmp_path / "root", tmp_path / "sweep" / "runs"
    cfgs = X.table2_configs("quick", root=str(root), seeds=1)
    same = dataclasses.replace(cfgs[1], out_dir=str(sweep / "train-same"), threads=1, keep_last=2)
    other = dataclasses.replace(cfgs[0], out_dir=str(sweep / "train-lr"), lr=cfgs[0].lr * 2)
    killed = dataclasses.replace(cfgs[2], out_dir=str(sweep / "train-killed"), keep_last=2)
    for c in (same, other, killed):
        X.train(c, progress=False)
    steps = sorted(p.name for p in Path(killed.out_dir).glob("step-*"))
    assert len(steps) == 2
    (Path(killed.out_dir) / "latest").write_text(steps[0])  # as if killed before the last checkpoint
    filled = X.adopt_runs(cfgs, [str(sweep.parent)])
    assert filled == [cfgs[1].out_dir]
    assert read_log(cfgs[1].out_dir) == read_log(same.out_dir)
    assert run_settings(cfgs[1].out_dir)["lr"] == cfgs[1].lr
    assert X.adopt_runs(cfgs, [str(sweep)]) == []          # an adopted folder is not overwritten
    called = []
    monkeypatch.setattr(X, "train", lambda cfg, *a, **kw: called.append(cfg.out_dir) or pytest.fail("trained"))
    log = X.run_all([cfgs[1]], progress=False)[0]
    assert called == [] and log[-1]["step"] == cfgs[1].n_steps
    with pytest.raises(FileNotFoundError, match="adopt"):
        X.adopt_runs(cfgs, [str(tmp_path / "nowhere")])
