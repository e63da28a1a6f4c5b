"""Re-executes a notebook in a real Jupyter kernel and saves it with its outputs, as shipped.

    python notebooks/execute.py notebooks/reproduce_paper.ipynb

Progress bars (tqdm on stderr) are dropped from the saved copy; figures and printed numbers stay.
tests/test_notebooks.py checks that every cell tagged "figure" has a PNG output.
"""
import sys
import time

import nbformat
from nbclient import NotebookClient


def execute(path: str) -> None:
    nb = nbformat.read(path, as_version=4)
    t0 = time.perf_counter()
    NotebookClient(nb, timeout=1800, kernel_name="python3").execute()
    for c in nb.cells:
        if c.cell_type == "code":
            c.outputs = [o for o in c.outputs if not (o.get("output_type") == "stream" and o.get("name") == "stderr")]
    nbformat.write(nb, path)
    print(f"{path}: executed in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    for p in sys.argv[1:]:
        execute(p)
