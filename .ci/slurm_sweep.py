"""A sweep on a real Slurm, the way examples/cluster/ tells a user to run one (run by .ci/slurm,
which starts the daemons): examples/cluster/jobqueue.yaml edited for this site (one CPU and one
worker per job, this venv), examples/cluster/sweep_on_slurm.py's make_cluster, jobs submitted
with cluster.scale(jobs=...), sl.sweep(spec, client=client). While the sweep runs, the batch job
of a worker that is running a task is cancelled with scancel; the check is that only that task's
attempt is lost (rerun on another worker), every task finishes, and the table equals the serial
sweep's."""
import argparse
import json
import os
import subprocess
import sys
import threading
import time

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples", "cluster"))
from sweep_on_slurm import make_cluster  # noqa: E402  (the example's own code)

import sinklab as sl  # noqa: E402

JOBS = 2
SPEC = {"model": ["smollm2-135m-instruct"], "bos": [True, False], "T": [16, 32, 48], "eps": [0.3, 0.8],
        "settings": {"sink_study": {"n_prompts": 96}}}    # a few seconds a task: long enough to be caught running


def site_config(venv: str, work: str) -> str:
    """examples/cluster/jobqueue.yaml with the edits its comments ask of a site."""
    with open(os.path.join(ROOT, "examples", "cluster", "jobqueue.yaml")) as f:
        cfg = yaml.safe_load(f)
    s = cfg["jobqueue"]["slurm"]
    s.update({"cores": 1, "processes": 1, "job-cpu": 1, "memory": "3GB", "walltime": "00:30:00",
              "local-directory": os.path.join(work, "dask"), "log-directory": os.path.join(work, "jobs"),
              "job-script-prologue": [f"source {venv}/bin/activate", f"export SINKLAB_HOME={sl_home()}"]})
    path = os.path.join(work, "jobqueue.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    return path


def sl_home() -> str:
    return os.environ.get("SINKLAB_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "sinklab")


def table(res):
    """The sweep's table without the columns that say where and how fast each task ran."""
    from sinklab.sweeps import INFO_COLUMNS

    df = res.table.drop(columns=list(INFO_COLUMNS))
    return df.sort_values([c for c in ("name", "eps") if c in df.columns]).reset_index(drop=True)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--venv", required=True)
    p.add_argument("--work", required=True)
    a = p.parse_args()
    sl.load("smollm2-135m-instruct", quiet=True)              # fetched once, on the "login node"
    serial = sl.sweep(dict(SPEC, out=os.path.join(a.work, "serial")), serial=True, progress=False, figures=False)
    print(f"slurm: serial sweep: {len(serial.ran)} tasks, {len(serial.table)} rows", flush=True)

    cluster = make_cluster(config=site_config(a.venv, a.work))
    script = cluster.job_script()
    assert "#SBATCH" in script and f"source {a.venv}/bin/activate" in script, script
    cluster.scale(jobs=JOBS)
    from dask.distributed import Client

    out = os.path.join(a.work, "on-slurm")
    with Client(cluster) as client:
        client.wait_for_workers(JOBS, timeout=180)
        jobs = subprocess.run(["squeue", "-h", "-o", "%i %T %j"], capture_output=True, text=True).stdout.split("\n")
        print(f"slurm: {JOBS} workers joined from batch jobs: {[j for j in jobs if j]}", flush=True)
        done = {}

        def run():
            done["res"] = sl.sweep(dict(SPEC, out=out), client=client, progress=False, figures=False)

        t = threading.Thread(target=run)
        t.start()
        victim = None
        deadline = time.time() + 300
        while victim is None and time.time() < deadline and t.is_alive():
            busy = {w: ts for w, ts in client.processing().items() if ts}
            if busy:
                addr = next(iter(busy))
                name = client.scheduler_info()["workers"][addr]["name"]
                job = cluster.workers.get(name) or cluster.workers.get(str(name).rsplit("-", 1)[0])
                victim = (addr, name, job.job_id, busy[addr])
                time.sleep(0.5)                                  # inside the task (model load + study)
                subprocess.run(["scancel", str(job.job_id)], check=True)
                print(f"slurm: scancel {job.job_id} (worker {name}) while it ran {list(busy[addr])}", flush=True)
            time.sleep(0.2)
        t.join(timeout=900)
        assert not t.is_alive(), "the sweep did not finish after its worker's job was cancelled"
    try:
        cluster.close()
    except AssertionError:       # dask-jobqueue asserts on a worker whose job scancel already ended
        pass
    res = done["res"]
    assert victim is not None, "no worker was ever busy: nothing was cancelled"
    print(f"slurm: {res}", flush=True)
    assert not res.failed, res.failed
    assert sorted(res.ran) == sorted(serial.ran), (res.ran, serial.ran)
    assert 1 <= len(res.interrupted) <= len(victim[3]), f"lost attempts {res.interrupted}, the worker ran {victim[3]}"
    a_tab, b_tab = table(res), table(serial)
    assert a_tab.equals(b_tab), f"the tables differ:\n{a_tab}\n{b_tab}"
    print(f"slurm: {len(res.ran)} tasks, {len(res.interrupted)} attempt(s) lost with the cancelled job and rerun; "
          f"the table equals the serial sweep's ({len(a_tab)} rows)", flush=True)
    with open(os.path.join(a.work, "summary.json"), "w") as f:
        json.dump({"ran": res.ran, "interrupted": res.interrupted, "cancelled_job": victim[2]}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
