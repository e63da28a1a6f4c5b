"""mypy over the package (pyproject's [tool.mypy]): the public API's annotations hold, and the
Python calls into the C extension match its stub (sinklab/_core.pyi), which tests/test_core_stub.py
ties to the binding's keyword lists. Modules on the typing-debt list are not checked yet; the list
may only shrink."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DEBT_AT_MOST = 28          # modules on the list on 2026-12-07 (of 117); lower it as modules pass

pytestmark = pytest.mark.slow   # about a minute on 2 cores


def test_mypy_passes_on_the_package():
    pytest.importorskip("mypy")
    res = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]


def test_the_typing_debt_list_only_shrinks():
    try:
        import tomllib
    except ImportError:                     # Python < 3.11
        import tomli as tomllib
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    debt = [m for o in cfg["overrides"] if o.get("ignore_errors") for m in o["module"]]
    assert len(debt) <= DEBT_AT_MOST, f"{len(debt)} modules skip mypy; at most {DEBT_AT_MOST} may"
    assert "sinklab.model" not in debt and "sinklab.trace" not in debt and "sinklab.runtime" not in debt
