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
    from sinklab.io.registry import MODELS

    meta = res["meta"]
    assert meta["sha256"] == MODELS["smollm2-135m-instruct"].sha256
    assert meta["bos_token_id"] == 1 and meta["bos_token"] == "<|im_start|>" and meta["eps"] == [0.3, 0.8]
    assert meta["versions"]["sinklab"] and meta["quick"] is True
    md = (out / "report.md").read_text()
    for key in ("sinks", "long_context", "interventions", "noop", "perturbation", "collapse", "oversquashing",
                "quality"):
        assert key in res, key
        for fig in res[key]["figures"]:
            data = (out / fig).read_bytes()
            assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000, fig
            assert f"]({fig})" in md
    nums = list(finite_numbers({k: v for k, v in res.items() if k != "meta"}))
    assert len(nums) > 1000 and all(math.isfinite(v) for v in nums)


def test_every_section_says_paper_here_reading(report):
    """Each section names its paper element, what differs, and a reading; the status table lists
    every element of the paper; nothing cites a file outside the repository."""
    from sinklab.report import PAPER_ELEMENTS, SECTIONS

    out, res = report
    md = (out / "report.md").read_text()
    assert "PAPER" + ".md" not in md  # (spelled so that this file does not cite it either)
    for key, _ in SECTIONS:
        sec = res[key]
        assert sec["paper"] and sec["here"] and len(sec["reading"]) > 40, key
        assert f"**Reading.** {sec['reading']}" in md
    assert md.count("**Paper.**") == len(SECTIONS)
    for element, paper, status, _ in PAPER_ELEMENTS:
        assert f"| {element} | {paper} | {status} |" in md
    statuses = [st.split(":")[0] for _, _, st, _ in PAPER_ELEMENTS]
    assert {"reproduced here", "stand-in", "not yet"} <= set(statuses)
    # The ⟨bos⟩ caveat of a model trained without a fixed ⟨bos⟩ is stated where it matters.
    for key in ("sinks", "interventions", "quality"):
        assert "not trained to rely on a fixed ⟨bos⟩" in res[key]["here"]


def test_oversquashing_section(report):
    """Thm. 3.2 in the report: the bound is never below the exact Jacobian norm, and masking
    attention to ⟨bos⟩ in every head gives the same mixing as the run without ⟨bos⟩ (two different
    computations that must agree: with relative positions the masked run is the no-⟨bos⟩ run)."""
    out, res = report
    sec = res["oversquashing"]
    conds = sec["numbers"]["study"]["conditions"]
    assert set(conds) == {"bos", "nobos", "masked"}
    for k, r in conds.items():
        assert r["violations"] == 0 and r["min_ratio"] >= 1.0, k
        assert 0.0 <= r["share_layer0"] <= 1.0 and -1.0 <= r["spearman_mean"] <= 1.0, k
        assert set(r["share_layer0_by_length"]) == {"32", "128"}, k
    assert abs(conds["masked"]["share_layer0"] - conds["nobos"]["share_layer0"]) < 1e-3
    assert len(sec["figures"]) == 3


def test_numbers_agree_with_independent_runs(report, smollm2_gguf):
    """Key numbers of the report recomputed here through other paths of the API."""
    import sinklab as sl
    from sinklab.prompts import load_passages
    from sinklab.report import INTERVENTIONS, Settings

    _, res = report
    s = Settings.for_run(quick=True)
    model = sl.load(str(smollm2_gguf))
    # Sink rate with BOS from full attention (Gu et al.'s a_0 in float64), not the C statistics.
    imp = []
    for p in load_passages("sinks")[: s.sink_prompts]:
        ids = np.concatenate([[model.config.bos_token_id], model.tokenize(p)[: s.sink_T - 1]])
        A = model.run(ids, capture="attn").attn.astype(np.float64)            # (L, H, T, T)
        imp.append(A[:, :, :, 0].mean(axis=-1))
    imp = np.stack(imp)
    for eps in (0.3, 0.8):
        assert res["sinks"]["numbers"]["bos"]["sink_rate"][str(eps)] == pytest.approx(
            float((imp > eps).mean()), abs=1.0 / imp.size)
    iv = res["interventions"]["numbers"]
    names = [n for n, _, _ in INTERVENTIONS]
    # Masking attention to position 0 in every head cuts ⟨bos⟩ out of the computation; with
    # relative (RoPE) positions the rest is exactly the no-⟨bos⟩ run.
    assert iv[names[3]]["mean_nll"] == pytest.approx(iv[names[4]]["mean_nll"], abs=1e-4)
    moves = iv["where_the_sink_moves"]
    masked, text = moves["⟨bos⟩ + text, attention to position 0 masked"], moves["text only"]
    assert masked["importance_first_text_token"] == pytest.approx(text["importance_first_text_token"], abs=1e-4)
    assert masked["importance_pos0"] < 0.05 < 0.3 < masked["importance_first_text_token"]
    # The quality section reuses the intervention section's perplexities (computed once).
    q = res["quality"]["numbers"]["perplexity"]
    assert q["bos"]["mean_nll"] == iv[names[0]]["mean_nll"]
    assert q["nobos"]["mean_nll"] == iv[names[4]]["mean_nll"]
    # The no-op keeps more of the model than removing ⟨bos⟩'s value for every query.
    assert iv[names[0]]["mean_nll"] < iv[names[1]]["mean_nll"] < iv[names[2]]["mean_nll"]


def test_perturbation_and_prop31(report):
    _, res = report
    st = res["perturbation"]["numbers"]["study"]
    assert st["n_swaps"] >= 30 and st["n_passages"] >= 10
    ent = st["mean_entropy_over_layers"]
    assert set(ent) == {"bos_all_keys", "bos_text_keys", "nobos"}
    col = res["collapse"]["numbers"]
    assert col["prop31_all_hold"] is True and col["prop31"]["holds"] == col["prop31"]["cases"] == 3 * 31 * 2
    for setting in ("bos", "nobos"):
        p = col["settings"][setting]["prop31"]
        last_two, dev = np.array(p["last_two"], float), np.array(p["dev_frob"], float)
        assert np.all(last_two <= 2 * dev) and np.allclose(np.array(p["slack"], float), last_two / (2 * dev))


def test_no_bos_report(smollm2_gguf, tmp_path):
    """``--no-bos`` (small settings): every analysis runs without ⟨bos⟩, the ±⟨bos⟩ comparisons
    are skipped with a note, and nothing reports a with-⟨bos⟩ number."""
    from sinklab.report import SECTIONS, Settings, reproduce

    s = Settings(sink_prompts=4, sink_T=32, long_T=128, noop_prompts=2, collapse_lengths=(16,), ppl_texts=2,
                 ppl_max_tokens=64, passkey_quick=True, perturb_passages=10, perturb_swaps=3, bos=False)
    res = reproduce(str(smollm2_gguf), out=str(tmp_path), progress=False, settings=s)
    assert res["meta"]["bos"] is False
    assert set(res["sinks"]["numbers"]) == {"nobos"}
    assert set(res["long_context"]["numbers"]["sink_rate"]) == {"nobos"}
    assert res["collapse"]["numbers"]["settings"].keys() == {"nobos"}
    for key in ("perturbation", "quality"):
        assert res[key]["reading"] == "Skipped." and "--no-bos" in res[key]["here"]
    md = (tmp_path / "report.md").read_text()
    assert md.count("**Paper.**") == len(SECTIONS)
