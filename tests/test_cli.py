"""The main job, `sinklab sinks`, on the real model: outputs exist and agree with the API."""
import json
import subprocess
import sys

import numpy as np
import pytest

import sinklab as sl


def test_sinks_command(smollm2_gguf, tmp_path):
    prompt = "The river rose slowly through the night, and by morning the lower fields were under water."
    out = tmp_path / "out"
    res = subprocess.run([sys.executable, "-m", "sinklab.cli", "sinks", str(smollm2_gguf), "--prompt", prompt,
                          "--eps", "0.5", "--out", str(out), "--quiet"], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    assert "sink rate (first token, eps=0.5)" in res.stdout and "sink rate (first token, eps=0.8)" in res.stdout
    png = (out / "sinks_heatmap.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    result = json.loads((out / "sinks.json").read_text())
    model = sl.load(smollm2_gguf)
    ids = model.tokenize(prompt, bos=True)[:64]
    attn = model.run(ids, capture=("attn",)).attn
    assert result["bos_token_id"] == 1 and result["prompt_tokens"] == [len(ids)]
    assert result["sink_rate"]["0.5"] == pytest.approx(sl.sink_rate(attn, eps=0.5))
    imp = np.array(result["first_token_importance_mean"])
    assert imp.shape == (30, 9) and np.allclose(imp, sl.first_token_importance(attn), atol=1e-12)


def test_cli_rejects_bad_eps():
    res = subprocess.run([sys.executable, "-m", "sinklab.cli", "sinks", "x", "--eps", "1.5"],
                         capture_output=True, text=True)
    assert res.returncode != 0 and "--eps must lie in (0, 1)" in res.stderr
