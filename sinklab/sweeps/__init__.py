"""Sweeps: the same analyses over a grid of models, prompt sets, eps, ⟨bos⟩ settings,
interventions, context lengths and training runs, as Dask tasks (a LocalCluster by default,
any scheduler, or Slurm/PBS through dask-jobqueue), with results stored by content address.

    import sinklab as sl
    res = sl.sweep({"model": ["smollm2-135m-instruct"], "bos": [True, False], "T": [32, 64],
                    "eps": [0.3, 0.8]}, out="sweep-results")
    res.table            # pandas DataFrame, also sweep-results/table.parquet

Needs the cluster extra (``pip install 'sinklab[cluster]'``); ``serial=True`` needs only pandas
and pyarrow for the table. The command line: ``sinklab sweep SPEC.toml``.
"""
from .grid import ANALYSES, AXES, Grid, SpecError, Task, read_spec
from .runner import INFO_COLUMNS, SweepResult, execute, sweep, table, task_arrays

__all__ = ["sweep", "SweepResult", "Grid", "Task", "SpecError", "read_spec", "table", "task_arrays",
           "execute", "ANALYSES", "AXES", "INFO_COLUMNS"]
