"""Sweeps (sinklab.sweeps): the grid and its content addresses, results equal to the analyses
called directly, a 2-worker LocalCluster bitwise equal to the serial run, a worker killed
mid-task, and a client killed mid-sweep then resumed."""
import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import sinklab as sl
from sinklab.sweeps import INFO_COLUMNS, Grid, SpecError, sweep
from sinklab.sweeps.grid import EXAMPLE_SPEC, address_all, make_intervention, read_prompts, read_spec

from tests.support.reference_models import require

pd = require("pandas")

# Tasks of about a second each on one thread, so that a kill lands inside one.
GRID = {"analysis": ["sink_study"], "model": ["smollm2-135m-instruct"], "bos": [True, False], "T": [48, 64],
        "eps": [0.3, 0.8], "settings": {"sink_study": {"n_prompts": 40, "capture": "attn"}}}
N_TASKS = 4


def _comparable(df):
    return df.drop(columns=list(INFO_COLUMNS)).reset_index(drop=True)


def _tasks(spec):
    return address_all(Grid.from_spec(spec).tasks(), sl.__version__)


def _arrays(out, spec):
    from sinklab.sweeps import task_arrays

    return {t.name: task_arrays(out, t) for t in _tasks(spec)}


def _assert_same_results(out_a, out_b, spec):
    a, b = _arrays(out_a, spec), _arrays(out_b, spec)
    assert a.keys() == b.keys()
    for name in a:
        for k in a[name]:
            np.testing.assert_array_equal(a[name][k], b[name][k], err_msg=f"{name}:{k}")


def _result_files(out):
    names = sorted(os.listdir(os.path.join(out, "tasks")))
    assert not [n for n in names if ".tmp-" in n], names
    return names


# ------------------------------------------------------------------ the grid
def test_grid_expands_each_analysis_over_the_axes_it_reads():
    g = Grid.from_spec({"analysis": ["sink_study", "perturbation", "quality"], "bos": [True, False],
                        "T": [32, 64], "eps": [0.3, 0.5, 0.8], "intervention": ["none", "mask_first@0-1"]})
    by = {}
    for t in g.tasks():
        by.setdefault(t.analysis, []).append(t)
    assert len(by["sink_study"]) == 2 * 2 * 2 and all(len(t.rows) == 3 for t in by["sink_study"])
    assert len(by["perturbation"]) == 2 and all(t.rows == [{"bos": True}, {"bos": False}] for t in by["perturbation"])
    assert all(t.point["intervention"] == "none" for t in by["perturbation"])
    assert len(by["quality"]) == 8 and all(t.rows == [{}] for t in by["quality"])
    notes = " | ".join(g.not_applicable())
    assert "perturbation takes no intervention" in notes and "quality does not read the axis 'eps'" in notes


def test_content_address_depends_on_what_determines_the_result_only():
    a = _tasks({"bos": [True], "T": [32], "eps": [0.3]})[0]
    same = [t for t in _tasks({"bos": [False, True], "T": [32, 64], "eps": [0.3]})
            if t.point["bos"] and t.point["T"] == 32][0]
    assert a.key == same.key and len(a.key) == 64            # another grid, the same work
    assert a.identity["model_sha256"] == sl.io.registry.resolve_name("smollm2-135m-instruct").sha256
    other = [_tasks({"bos": [True], "T": [32], "eps": [0.3], "settings": {"sink_study": {"n_prompts": 3}}})[0],
             _tasks({"bos": [True], "T": [32], "eps": [0.8]})[0],
             _tasks({"bos": [True], "T": [32], "eps": [0.3], "prompts": ["heldout"]})[0]]
    assert len({a.key} | {t.key for t in other}) == 4


@pytest.mark.parametrize("spec, match", [
    ({"modle": ["x"]}, "unknown key"),
    ({"analysis": ["sinks"]}, "unknown analysis"),
    ({"eps": [1.5]}, r"eps values lie in \(0, 1\)"),
    ({"T": [1]}, "T values are integers"),
    ({"bos": ["yes"]}, "bos values are true/false"),
    ({"intervention": ["mask_last"]}, "unknown intervention"),
    ({"intervention": ["mask_first@a-b"]}, "layers are like"),
    ({"settings": {"sink_study": {"n_promts": 3}}}, "unknown key"),
    ({"train": [{"contxt": 64}]}, "train run sets"),
    ({"model": ["no-such-model"]}, "neither a file"),
    ({"prompts": ["/no/such/file.txt"]}, "neither a shipped split"),
])
def test_bad_specs_are_refused_before_anything_runs(spec, match, tmp_path):
    with pytest.raises(SpecError, match=match):
        sweep(spec, out=str(tmp_path / "o"), serial=True, progress=False, verbose=False)
    assert not (tmp_path / "o" / "tasks").exists() or not os.listdir(tmp_path / "o" / "tasks")


def test_example_spec_and_intervention_names(tmp_path):
    (tmp_path / "ex.toml").write_text(EXAMPLE_SPEC)
    g = Grid.from_spec(read_spec(str(tmp_path / "ex.toml")))
    assert {t.analysis for t in g.tasks()} == {"sink_study", "quality"}
    iv = make_intervention("zero_first_value_all@1,3-4", 6, 2)
    zero = iv.arrays(6, 2)["zero_first_value"]
    np.testing.assert_array_equal(zero[:, 0], [0, 2, 0, 2, 2, 0])     # scope "all" is code 2
    assert make_intervention("none", 6, 2) is None
    with pytest.raises(SpecError, match="outside"):
        make_intervention("mask_first@6", 6, 2)


# ------------------------------------------------------------------ numbers
@pytest.fixture(scope="module")
def serial(smollm2_gguf, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("sweep") / "serial")
    res = sweep(GRID, out=out, serial=True, threads=2, progress=False, figures=True, verbose=False)
    assert len(res.ran) == N_TASKS and not res.failed
    return out, res


@pytest.mark.slow  # a sweep end to end, and the study again
def test_serial_sweep_equals_the_sink_study_called_directly(serial, smollm2_gguf):
    out, res = serial
    model = sl.load(str(smollm2_gguf))
    prompts = read_prompts("sinks")[:40]
    df = res.table
    assert len(df) == N_TASKS * 2 and set(df["eps"]) == {0.3, 0.8}
    for t in _tasks(GRID):
        direct = sl.sink_study(model, prompts, T=t.point["T"], bos=t.point["bos"], skip_short=True,
                               capture="attn", progress=False)
        rows = df[df["name"] == t.name]
        for _, r in rows.iterrows():
            assert r["sink_rate"] == direct.sink_rate(r["eps"])          # bitwise: the same computation
            assert r["mean_importance"] == float(direct.importance.mean())
        np.testing.assert_array_equal(_arrays(out, GRID)[t.name]["importance"], direct.importance)
    assert pd.read_parquet(os.path.join(out, "table.parquet")).equals(df)
    assert [os.path.basename(f) for f in res.figures] == ["sink_study.png"]


@pytest.mark.slow  # a sweep end to end
def test_intervention_in_a_sweep_is_the_one_named(smollm2_gguf, tmp_path):
    """mask_first@0-1: the a_0 of the sweep equals first_token_importance of attention captured
    with the mask applied on layers 0-1 by hand (float64 NumPy over the attn capture)."""
    spec = {"bos": [True], "T": [24], "eps": [0.3], "intervention": ["mask_first@0-1"],
            "settings": {"sink_study": {"n_prompts": 3}}}
    res = sweep(spec, out=str(tmp_path), serial=True, progress=False, figures=False, verbose=False)
    imp = _arrays(str(tmp_path), spec)[res.table["name"][0]]["importance"]
    model = sl.load(str(smollm2_gguf))
    heads = np.zeros((model.config.n_layers, model.config.n_heads), bool)
    heads[:2] = True
    for p, text in enumerate(read_prompts("sinks")[:3]):
        ids = sl.inputs.prepare(model, sl.inputs.text_ids(model, text), True, 24)
        attn = model.run(ids, capture="attn", intervene=sl.Intervention(mask_first=heads)).attn
        ref = attn.astype(np.float64)[..., :, 0].mean(axis=-1)         # (L, H): mean over queries
        np.testing.assert_allclose(imp[p], ref, atol=2e-6)
        assert np.all(imp[p][:2] <= 1.0 / 24 + 1e-6)                    # masked: only query 0 sees key 0


# ------------------------------------------------------------------ Dask
@pytest.mark.slow  # a LocalCluster
def test_two_worker_local_cluster_is_bitwise_the_serial_run(serial, tmp_path):
    require("distributed")
    out = str(tmp_path / "cluster")
    res = sweep(GRID, out=out, workers=2, threads=1, progress=False, figures=False, verbose=False)
    assert len(res.ran) == N_TASKS and not res.failed and res.dashboard
    assert set(res.table["threads"]) == {1} and res.table["pid"].nunique() == 2   # two processes did the work
    assert _comparable(res.table).equals(_comparable(serial[1].table))
    _assert_same_results(serial[0], out, GRID)
    again = sweep(GRID, out=out, workers=2, threads=1, progress=False, figures=False, verbose=False)
    assert again.ran == [] and len(again.skipped) == N_TASKS                     # a rerun skips finished tasks


@pytest.mark.slow  # a LocalCluster, a worker killed
def test_a_worker_killed_mid_task_loses_only_that_task(serial, tmp_path):
    require("distributed")
    out = str(tmp_path / "killed")
    running = os.path.join(out, "running")
    killed = []

    def kill_first_runner():
        deadline = time.time() + 120
        while time.time() < deadline and not killed:
            names = os.listdir(running) if os.path.isdir(running) else []
            if names:
                pid = int(names[0].rsplit(".", 1)[1])
                os.kill(pid, signal.SIGKILL)
                killed.append((names[0], pid))
            time.sleep(0.02)

    th = threading.Thread(target=kill_first_runner, daemon=True)
    th.start()
    res = sweep(GRID, out=out, workers=2, threads=1, progress=False, figures=False, verbose=False)
    th.join()
    assert killed, "no task was seen running"
    assert killed[0][0] in res.interrupted                     # the attempt it lost is recorded ...
    assert not res.failed and len(res.ran) == N_TASKS          # ... and was run again to completion
    assert killed[0][1] not in set(res.table["pid"])           # by another process
    assert len(_result_files(out)) == 2 * N_TASKS              # one .json + one .npz per task, no more
    assert _comparable(res.table).equals(_comparable(serial[1].table))
    _assert_same_results(serial[0], out, GRID)


@pytest.mark.slow  # a client subprocess killed and resumed
def test_a_killed_client_resumes_from_the_finished_tasks(serial, tmp_path):
    require("distributed")
    out = str(tmp_path / "crash")
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(GRID))
    proc = subprocess.Popen([sys.executable, "-m", "sinklab.cli", "--quiet", "sweep", str(spec_path), "--out", out,
                             "--workers", "2", "--threads", "1"], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    tasks = os.path.join(out, "tasks")
    deadline = time.time() + 180
    while time.time() < deadline and proc.poll() is None:
        if os.path.isdir(tasks) and any(n.endswith(".json") for n in os.listdir(tasks)):
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the sweep finished before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)                        # the client and its workers, at once
    proc.wait()
    done = sum(n.endswith(".json") for n in os.listdir(tasks))
    assert 1 <= done < N_TASKS
    res = sweep(GRID, out=out, workers=2, threads=1, progress=False, figures=False, verbose=False)
    assert len(res.skipped) == done and len(res.ran) == N_TASKS - done and not res.failed
    assert len(_result_files(out)) == 2 * N_TASKS
    assert _comparable(res.table).equals(_comparable(serial[1].table))
    _assert_same_results(serial[0], out, GRID)


# ------------------------------------------------------------------ training runs and the CLI
@pytest.mark.slow  # a training run, twice
def test_a_training_run_in_a_sweep_is_the_run_trained_directly(training_corpus, tmp_path):
    from sinklab.train.run import TrainConfig, train

    cfg = {"d_model": 32, "n_layers": 1, "n_heads": 2, "context": 32, "tokens_per_step": 128, "steps": 3,
           "eval_every": 3, "eval_docs": 4, "eval_windows": 2, "seed": 1}
    spec = {"analysis": ["train"], "train": [cfg], "bos": [True, False], "eps": [0.3]}
    res = sweep(spec, out=str(tmp_path / "s"), serial=True, progress=False, figures=False, verbose=False)
    assert not res.failed and len(res.table) == 2
    last = [x for x in train(TrainConfig(**cfg, out_dir=str(tmp_path / "direct")), progress=False).log
            if x.get("val_loss_bos") is not None][-1]
    for _, r in res.table.iterrows():
        mode = "bos" if r["bos"] else "text"
        assert r["val_loss"] == last[f"val_loss_{mode}"] and r["sink_rate"] == last[f"sink_{mode}_0.3"]
        assert r["steps"] == 3 and json.loads(r["train"]) == cfg


def test_cli_sweep_errors_and_example(tmp_path):
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    ex = subprocess.run([sys.executable, "-m", "sinklab.cli", "sweep", "--example"], capture_output=True,
                        text=True, env=env)
    assert ex.returncode == 0 and "analysis" in ex.stdout
    bad = tmp_path / "bad.toml"
    bad.write_text('eps = [2.0]\n')
    r = subprocess.run([sys.executable, "-m", "sinklab.cli", "sweep", str(bad), "--serial"], capture_output=True,
                       text=True, env=env)
    assert r.returncode == 2 and "eps values lie in (0, 1)" in r.stderr
    r = subprocess.run([sys.executable, "-m", "sinklab.cli", "sweep", str(tmp_path / "none.toml")],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 2 and "no such spec file" in r.stderr


# ------------------------------------------------------------------ the cluster example
def test_the_slurm_and_pbs_example_make_the_documented_jobs():
    """examples/cluster: the job scripts dask-jobqueue writes from jobqueue.yaml ask for what
    docs/guides/sweeps.md says (16 CPUs a job, 4 worker processes x 1 Dask thread), and the example spec parses."""
    require("dask_jobqueue")
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "examples" / "cluster"
    spec = importlib.util.spec_from_file_location("sweep_on_slurm", root / "sweep_on_slurm.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    slurm = mod.make_cluster(pbs=False)
    try:
        script = slurm.job_script()
    finally:
        slurm.close()
    assert "#SBATCH --cpus-per-task=16" in script and "#SBATCH -n 1" in script
    assert "--nthreads 1" in script and "--nworkers 4" in script and "sinklab-venv/bin/activate" in script
    pbs = mod.make_cluster(pbs=True)
    try:
        assert "#PBS -l select=1:ncpus=16:mem=32GB" in pbs.job_script()
    finally:
        pbs.close()
    g = Grid.from_spec(read_spec(str(root / "sweep.toml")))
    assert len(g.tasks()) == 4 * 2 * 2 * 2 + 4 * 2 * 2 * 2


def test_openmp_threads_per_task_never_oversubscribe():
    import socket

    from sinklab.sweeps import cluster

    n = len(os.sched_getaffinity(0))
    assert cluster.task_threads(3, None) == 3                               # given: used as is
    assert cluster.task_threads(None, {socket.gethostname(): 2}) == max(1, n // 2)
    assert cluster.task_threads(None, {socket.gethostname(): 4 * n}) == 1
    plan = cluster.plan_local(["smollm2-135m-instruct"] * 10)
    assert plan.workers * plan.threads <= n and plan.workers >= 1
    assert cluster.plan_local(["smollm2-135m-instruct"]).workers == 1


def test_a_grid_dominated_by_one_large_model_gets_fewer_workers_with_more_threads(monkeypatch):
    """On a 16-core node, the 5 registered models x 2 (10 tasks): their sizes add up to 3.7 times
    the largest, so 4 workers x 4 threads; 16 tasks of one model: 16 workers x 1 thread."""
    from sinklab.io import registry
    from sinklab.sweeps import cluster

    monkeypatch.setattr(cluster, "cores", lambda: 16)
    sizes = [m.size for m in registry.MODELS.values()]
    assert 3 < 2 * sum(sizes) / max(sizes) <= 4
    plan = cluster.plan_local(sorted(registry.MODELS) * 2)
    assert (plan.workers, plan.threads) == (4, 4)
    assert cluster.plan_local(["smollm2-135m-instruct"] * 16).workers == 16
    assert cluster.plan_local(["smollm2-135m-instruct"] * 16, workers=3).threads == 5


@pytest.mark.slow  # a LocalCluster
@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="reads Linux's /proc/self/smaps")
def test_a_worker_model_is_loaded_once_and_reads_its_weights_from_the_shared_file_pages(smollm2_gguf):
    """What lets the workers of one node share a model: its quantized weights are read in place
    from the file's read-only mapping (file pages in the page cache, none copied privately), and
    the process's own (anonymous) memory grows by far less than the file."""
    import re

    from sinklab.sweeps import analyses

    path = os.path.realpath(str(smollm2_gguf))

    def mapped():                  # (resident bytes of the file's mappings, privately dirtied bytes)
        rss = dirty = 0
        current = False
        with open("/proc/self/smaps") as f:
            for line in f:
                if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
                    current = line.rstrip().endswith(path)
                elif current and line.startswith("Rss:"):
                    rss += int(line.split()[1]) * 1024
                elif current and line.startswith("Private_Dirty:"):
                    dirty += int(line.split()[1]) * 1024
        return rss, dirty

    def anon():
        with open("/proc/self/status") as f:
            return next(int(x.split()[1]) * 1024 for x in f if x.startswith("RssAnon:"))

    analyses._MODELS.clear()
    before = anon()
    model = analyses.worker_model(path)
    assert analyses.worker_model(path) is model                  # once per process
    model.run(model.tokenize(read_prompts("sinks")[0], bos=True), capture=())
    rss, dirty = mapped()
    size = os.path.getsize(path)
    assert rss > 0.5 * size and dirty == 0
    assert anon() - before < 0.5 * size
    analyses._MODELS.clear()


@pytest.mark.slow  # sweeps end to end
def test_perturbation_and_sensitivity_tasks_equal_the_analyses_called_directly(smollm2_gguf, tmp_path):
    spec = {"analysis": ["perturbation", "sensitivity"], "bos": [True, False], "T": [24],
            "settings": {"perturbation": {"n_prompts": 2, "swaps_per_passage": 2, "min_after": 8},
                         "sensitivity": {"n_probes": 4}}}
    res = sweep(spec, out=str(tmp_path), serial=True, progress=False, figures=False, verbose=False)
    assert not res.failed and len(res.table) == 4
    model = sl.load(str(smollm2_gguf))
    st = sl.perturbation_study(model, read_prompts("sinks"), n_passages=2, swaps_per_passage=2, T=24,
                               min_after=8, progress=False)
    pert = res.table[res.table["analysis"] == "perturbation"]
    for _, r in pert.iterrows():
        setting = "bos" if r["bos"] else "nobos"
        assert r["mean_rel_change"] == float(np.nanmean(st.mean_changes(setting, True)[:, 1:]))
        assert r["n_swaps"] == 4
    for _, r in res.table[res.table["analysis"] == "sensitivity"].iterrows():
        ids = sl.inputs.prepare(model, sl.inputs.text_ids(model, read_prompts("sinks")[0]), r["bos"], 24)
        s = sl.sensitivity(model, ids, method="estimate", n_probes=4, spectral=False, progress=False)
        assert r["first"] == s.fro[0, 0] and r["others_mean"] == s.fro[0, 1:-1].mean()


@pytest.mark.slow  # a scheduler and workers
def test_a_sweep_on_an_existing_scheduler_splits_the_cores_among_its_workers(serial, tmp_path):
    """--scheduler ADDRESS: the tasks run on a cluster the sweep did not start, each with
    cores // (Dask threads on its host) OpenMP threads, and give the serial run's numbers."""
    distributed = require("distributed")
    import logging

    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  silence_logs=logging.ERROR, dashboard_address=":0") as lc:
        res = sweep(GRID, out=str(tmp_path), scheduler=lc.scheduler_address, progress=False, figures=False,
                    verbose=False)
        assert lc.workers                                        # the sweep left the cluster running
    assert not res.failed and set(res.table["threads"]) == {max(1, len(os.sched_getaffinity(0)) // 2)}
    assert _comparable(res.table).equals(_comparable(serial[1].table))


def test_the_core_package_imports_no_cluster_dependency():
    code = ("import sys, sinklab; sinklab.sweep; "
            "print(sorted(m for m in ('dask', 'distributed', 'pandas', 'pyarrow', 'bokeh') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.slow  # long-context sweeps on SmolLM2
def test_sink_location_and_long_context_sweep_analyses(smollm2_gguf, tmp_path):
    """The two analyses the report added for sweeps: where the sink sits and long-context
    statistics, each equal to the direct call (the float64 attention of one window recomputed)."""
    from sinklab.analysis.controls import sink_location
    from sinklab.inputs import prepare, text_ids
    from sinklab.analysis.long_context import long_texts

    spec = {"analysis": ["sink_location", "long_context"], "model": [str(smollm2_gguf)], "prompts": ["sinks"],
            "bos": [True], "eps": [0.3], "T": [64],
            "settings": {"sink_location": {"n_prompts": 6}, "long_context": {"n_windows": 2}}}
    res = sweep(spec, out=str(tmp_path), serial=True, progress=False, figures=False, verbose=False)
    df = res.table
    model = sl.load(str(smollm2_gguf))
    seqs = [prepare(model, text_ids(model, t), True, 64) for t in read_prompts("sinks")[:6]]
    direct = sink_location(model, np.stack([s for s in seqs if len(s) == 64]), text_pos=1, bos_pos=0, eps=0.3)
    row = df[df["analysis"] == "sink_location"].iloc[0]
    assert row["share_top_pos0"] == pytest.approx(float(direct.share["pos0"].mean()), abs=1e-12)
    assert row["sink_rate_pos0"] == pytest.approx(float(direct.sink0.mean()), abs=1e-12)
    lc = df[df["analysis"] == "long_context"].iloc[0]
    windows = long_texts(model, 64, 2)
    rates = []
    for w in windows:
        A = model.run(prepare(model, w, True, 64), capture="attn").attn.astype(np.float64)
        rates.append(float((A[:, :, :, 0].mean(axis=-1) > 0.3).mean()))   # Gu's a_0 from the full matrix
    assert lc["sink_rate"] == pytest.approx(np.mean(rates), abs=1.0 / (2 * 30 * 9))
