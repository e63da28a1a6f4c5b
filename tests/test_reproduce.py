"""`sinklab reproduce --quick` end to end on the real model: every figure and number exists,
is finite, and has the documented shape; key figures are checked against the API directly."""
import json
import math
import subprocess
import sys

import numpy as np
import pytest


@pytest.fixture(scope="module")
def report(smollm2_gguf, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    res = subprocess.run([sys.executable, "-m", "sinklab.cli", "reproduce", "--model", str(smollm2_gguf),
                          "--quick", "--out", str(out), "--quiet"], capture_output=True, text=True, timeout=1800)
    assert res.returncode == 0, res.stderr[-3000:]
    return out, json.loads((out / "results.json").read_text())


def finite_numbers(x):
    if isinstance(x, dict):
        for v in x.values():
            yield from finite_numbers(v)
    elif isinstance(x, list):
        for v in x:
            yield from finite_numbers(v)
    elif isinstance(x, (int, float)) and not isinstance(x, bool):
        yield x


def test_files_and_metadata(report, smollm2_gguf):
    out, res = report
    from sinklab.registry import MODELS

    meta = res["meta"]
    assert meta["sha256"] == MODELS["smollm2-135m-instruct"].sha256
    assert meta["bos_token_id"] == 1 and meta["bos_token"] == "<|im_start|>" and meta["eps"] == [0.3, 0.8]
    assert meta["versions"]["sinklab"] and meta["quick"] is True
    md = (out / "report.md").read_text()
    for key in ("sinks", "long_context", "interventions", "noop", "perturbation", "collapse", "quality"):
        assert key in res, key
        for fig in res[key]["figures"]:
            data = (out / fig).read_bytes()
            assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000, fig
            assert f"]({fig})" in md
    nums = list(finite_numbers({k: v for k, v in res.items() if k != "meta"}))
    assert len(nums) > 1000 and all(math.isfinite(v) for v in nums)


def test_numbers_are_sane(report):
    _, res = report
    sinks = res["sinks"]["numbers"]
    for cond in ("with_bos", "without_bos"):
        for eps, rate in sinks[cond]["sink_rate"].items():
            assert 0.0 <= rate <= 1.0
        assert sinks[cond]["sink_rate"]["0.3"] >= sinks[cond]["sink_rate"]["0.8"]
    lc = res["long_context"]["numbers"]
    assert len(lc["to_first_per_layer"]["with_bos"]) == 30
    assert all(0 <= v <= 1 for v in lc["to_first_per_layer"]["with_bos"])
    assert all(0 <= v <= math.log(lc["T"]) for v in lc["entropy_per_layer"]["without_bos"])
    iv = res["interventions"]["numbers"]
    assert all(1.0 < v["perplexity"] < 1e4 for v in iv.values())
    # Masking attention to position 0 in every head cuts the BOS out of the computation; with
    # relative (RoPE) positions the rest is exactly the no-BOS run.
    assert iv["BOS, attention to position 0 masked (all heads)"]["mean_nll"] == pytest.approx(
        iv["no BOS"]["mean_nll"], abs=1e-4)
    ratio = np.array(res["perturbation"]["numbers"]["spread_ratio"], dtype=float)
    assert ratio.shape == (31,)
