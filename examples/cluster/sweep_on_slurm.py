"""Runs a sinklab sweep on a Slurm (or PBS) cluster through dask-jobqueue.

Run it on the login node, in the venv where ``pip install 'sinklab[cluster]'`` was done (the
jobs activate the same venv: see ``job-script-prologue`` in jobqueue.yaml):

    python examples/cluster/sweep_on_slurm.py examples/cluster/sweep.toml --jobs 2
    python examples/cluster/sweep_on_slurm.py sweep.toml --jobs 4 --pbs --print-job-script

The results folder (the spec's ``out``) must be on a file system the compute nodes share with
the login node; each task writes its own file there, and a rerun after a lost job or a closed
session runs only what is missing. Fetch the models once on the login node first
(``python -c "import sinklab as sl; sl.load('gemma-3-270m')"``) when compute nodes have no
internet access; they read the shared cache ($SINKLAB_HOME, default ~/.cache/sinklab).
"""
import argparse
import os

import dask
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))


def make_cluster(pbs: bool = False, config: str = os.path.join(HERE, "jobqueue.yaml")):
    """A SLURMCluster (or PBSCluster) configured by ``config``; no job is submitted yet."""
    with open(config) as f:
        dask.config.update(dask.config.config, yaml.safe_load(f), priority="new")
    from dask_jobqueue import PBSCluster, SLURMCluster

    return (PBSCluster if pbs else SLURMCluster)()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("spec", help="the sweep's TOML or JSON spec")
    p.add_argument("--jobs", type=int, default=2, help="batch jobs to submit (each: 4 workers x 4 threads)")
    p.add_argument("--pbs", action="store_true", help="PBS instead of Slurm")
    p.add_argument("--print-job-script", action="store_true", help="print the job script and exit")
    args = p.parse_args()
    cluster = make_cluster(args.pbs)
    if args.print_job_script:
        print(cluster.job_script())
        return
    from dask.distributed import Client

    import sinklab as sl

    cluster.scale(jobs=args.jobs)
    with Client(cluster) as client:
        res = sl.sweep(args.spec, client=client)
    print(res)


if __name__ == "__main__":
    main()
