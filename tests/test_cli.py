"""The command line: `sinklab sinks` on a Hugging Face folder and a GGUF file, Gu et al.'s
exactly-T-tokens rule, global options, one-line errors, and `reproduce`'s arguments.

Reference for the numbers: transformers' fp32 eager forward of the tiny model, its prompts
tokenized by the `tokenizers` library from the folder's tokenizer.json and cut by hand; the
first-token importance a_0 = 1/T * sum_i A[i, 0] is computed here in float64 NumPy.
"""
import hashlib
import json
import subprocess
import sys

import numpy as np
import pytest

import sinklab as sl
from sinklab import cli
from tests.support.reference_models import BOS_ID, SPECS, hf_forward, make_hf_model, require, save_hf

T = 12
LONG = ["the cat sat on the mat and the dog ran away",
        "a river rose slowly through the night and the fields were under water"]
SHORT = "hi there"  # fewer than T tokens: dropped


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(transformers model, its saved Hugging Face folder)."""
    model = make_hf_model(SPECS["mha"])
    return model, save_hf(model, tmp_path_factory.mktemp("cli") / "tiny-hf")


def run_cli(argv, capsys):
    """(exit status, stdout, stderr) of sinklab's main() run in this process."""
    try:
        rc = cli.main([str(a) for a in argv])
    except SystemExit as e:  # argparse: usage errors and --version
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


def reference_importance(hf_model, folder, texts):
    """(P, L, H) float64 a_0 of [BOS] + each text's first T-1 tokens, from transformers."""
    tokenizers = require("tokenizers")
    tok = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    out = []
    for text in texts:
        ids = [BOS_ID] + tok.encode(text, add_special_tokens=False).ids[: T - 1]
        assert len(ids) == T
        attn = hf_forward(hf_model, np.array(ids))["attn"].astype(np.float64)  # (L, H, T, T)
        out.append(attn[:, :, :, 0].sum(axis=-1) / T)
    return np.stack(out)


def test_sinks_on_a_hf_folder_keeps_exactly_T_tokens(tiny, tmp_path, capsys):
    hf_model, folder = tiny
    out = tmp_path / "out"
    argv = ["sinks", folder, "--prompt", LONG[0], "--prompt", SHORT, "--prompt", LONG[1],
            "--max-tokens", T, "--eps", 0.3, "--out", out, "--quiet"]
    rc, stdout, stderr = run_cli(argv, capsys)
    assert rc == 0, stderr
    assert f"dropped 1 of 3 prompts shorter than {T} tokens" in stdout
    res = json.loads((out / "sinks.json").read_text())
    assert (res["T"], res["n_prompts"], res["n_dropped"], res["kept_prompts"]) == (T, 2, 1, [0, 2])
    assert res["prompt_tokens"] == [T, T]

    ref = reference_importance(hf_model, folder, LONG)
    assert np.abs(np.array(res["first_token_importance_mean"]) - ref.mean(axis=0)).max() < 1e-5
    for eps in (0.3, 0.8):
        assert np.abs(ref - eps).min() > 1e-4  # no a_0 on the threshold, so the rates are exact
        assert res["sink_rate"][f"{eps:g}"] == pytest.approx(float(np.mean(ref > eps)), abs=1e-12)
        assert f"sink rate (first token, eps={eps:g}): {100 * np.mean(ref > eps):.2f}%" in stdout

    # the folder's fingerprint: sha256 of a sha256sum-style manifest of the model's files
    names = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    files = {n: hashlib.sha256((folder / n).read_bytes()).hexdigest() for n in names}
    text = "".join(f"{files[n]}  {n}\n" for n in sorted(names))
    assert res["sha256_manifest"] == files
    assert res["sha256"] == hashlib.sha256(text.encode()).hexdigest()
    png = (out / "sinks_heatmap.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_sinks_json_is_the_result_on_stdout_alone(tiny, tmp_path, capsys, monkeypatch):
    """``--json``: stdout is one JSON document (the numbers of sinks.json, checked against
    transformers), nothing else; no files unless --out is given."""
    hf_model, folder = tiny
    monkeypatch.chdir(tmp_path)
    rc, stdout, stderr = run_cli(["sinks", folder, "--prompt", LONG[0], "--prompt", LONG[1], "--max-tokens", T,
                                  "--json"], capsys)
    assert rc == 0, stderr
    res = json.loads(stdout)
    assert list(tmp_path.iterdir()) == []
    ref = reference_importance(hf_model, folder, LONG)
    assert np.abs(np.array(res["first_token_importance_mean"]) - ref.mean(axis=0)).max() < 1e-5
    assert res["sink_rate"]["0.3"] == pytest.approx(float(np.mean(ref > 0.3)), abs=1e-12)
    rc, stdout2, _ = run_cli(["sinks", folder, "--prompt", LONG[0], "--prompt", LONG[1], "--max-tokens", T,
                              "--json", "--out", tmp_path / "o", "--quiet"], capsys)
    assert rc == 0 and json.loads(stdout2) == json.loads((tmp_path / "o" / "sinks.json").read_text())


def test_python_dash_m_sinklab_is_the_command():
    res = subprocess.run([sys.executable, "-m", "sinklab", "--version"], capture_output=True, text=True)
    assert res.returncode == 0 and res.stdout.startswith("sinklab "), res.stderr


def test_every_subcommand_and_argument_has_help():
    """Each option's help names its default when it has one (argparse prints none by itself)."""
    import argparse

    def actions(p):
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, sp in a.choices.items():
                    assert sp.description or any(c.dest == name and c.help for c in a._choices_actions), name
                    yield from actions(sp)
            elif not isinstance(a, (argparse._HelpAction, argparse._VersionAction)):
                yield a

    for a in actions(cli.build_parser()):
        assert a.help, a.option_strings or a.dest
        if a.default not in (None, False, argparse.SUPPRESS) and a.option_strings:
            assert "default" in a.help.lower(), (a.option_strings, a.default)


def test_sinks_with_no_prompt_long_enough(tiny, tmp_path, capsys):
    rc, stdout, stderr = run_cli(["sinks", tiny[1], "--prompt", SHORT, "--max-tokens", T,
                                  "--out", tmp_path, "--quiet"], capsys)
    assert rc == 1 and not (tmp_path / "sinks.json").exists()
    assert stderr.count("\n") == 1 and stderr.startswith("sinklab: error: --max-tokens 12: no prompt has")


def test_sinks_on_the_real_gguf(smollm2_gguf, tmp_path):
    """End to end through the installed entry point, with global options after the subcommand."""
    prompt = sl.load_passages("sinks")[0]
    out = tmp_path / "out"
    res = subprocess.run([sys.executable, "-m", "sinklab.cli", "sinks", str(smollm2_gguf), "--prompt", prompt,
                          "--prompt", "Too short.", "--eps", "0.5", "--out", str(out), "--quiet", "--threads", "1"],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    assert "sink rate (first token, eps=0.5)" in res.stdout and "dropped 1 of 2" in res.stdout
    # the first line is the model's, and ⟨bos⟩ is named by its text (SmolLM2's is <|im_start|>, id 1)
    assert res.stdout.startswith("model: ") and "BOS: '<|im_start|>' (id 1) prepended" in res.stdout
    result = json.loads((out / "sinks.json").read_text())
    assert result["sha256"] == sl.io.registry.MODELS["smollm2-135m-instruct"].sha256
    assert result["sha256_manifest"] == {smollm2_gguf.name: result["sha256"]}
    model = sl.load(smollm2_gguf)
    ids = model.tokenize(prompt, bos=True)[:64]
    assert len(ids) == 64 and result["bos_token_id"] == 1 and result["n_prompts"] == 1
    attn = model.run(ids, capture="attn").attn.astype(np.float64)
    a0 = attn[:, :, :, 0].mean(axis=-1)
    imp = np.array(result["first_token_importance_mean"])
    assert imp.shape == (30, 9) and np.abs(imp - a0).max() < 1e-5


@pytest.mark.parametrize("precision", ["bf16", "int8"])
def test_sinks_at_low_precision_is_the_api_at_that_precision(smollm2_gguf, tmp_path, capsys, precision):
    """--precision reaches the forward: the a_0 map equals the API's at that precision (float64
    from the full attention matrices) and differs from fp32's; the JSON records it."""
    prompt = sl.load_passages("sinks")[0]
    out = tmp_path / "out"
    rc, stdout, stderr = run_cli(["sinks", smollm2_gguf, "--prompt", prompt, "--precision", precision,
                                  "--out", out, "--quiet"], capsys)
    assert rc == 0, stderr
    assert f"weight products in {precision}" in stdout
    result = json.loads((out / "sinks.json").read_text())
    assert result["precision"] == precision
    model = sl.load(smollm2_gguf, quiet=True)
    ids = model.tokenize(prompt, bos=True)[:64]
    imp = np.array(result["first_token_importance_mean"])
    a0 = {p: model.run(ids, capture="attn", precision=p).attn.astype(np.float64)[:, :, :, 0].mean(axis=-1)
          for p in ("fp32", precision)}
    assert np.abs(imp - a0[precision]).max() < 1e-5 < np.abs(imp - a0["fp32"]).max()


# ------------------------------------------------------------------ options
def test_version():
    from importlib.metadata import version

    res = subprocess.run([sys.executable, "-m", "sinklab.cli", "--version"], capture_output=True, text=True)
    assert res.returncode == 0 and res.stdout.strip() == f"sinklab {version('sinklab')}"


@pytest.mark.parametrize("argv", [["--threads", "2", "--quiet", "--debug", "sinks", "M"],
                                  ["sinks", "M", "--threads", "2", "--quiet", "--debug"],
                                  ["--quiet", "sinks", "M", "--threads", "2", "--debug"]])
def test_global_options_before_or_after_the_subcommand(argv):
    args = cli.build_parser().parse_args(argv)
    assert (args.model, args.threads, args.quiet, args.debug) == ("M", 2, True, True)
    plain = cli.build_parser().parse_args(["sinks", "M"])
    assert (plain.threads, plain.quiet, plain.debug) == (None, False, False)
    r = cli.build_parser().parse_args(["reproduce", "--threads", "3", "--quiet"])
    assert (r.threads, r.quiet) == (3, True)


def test_threads_after_the_subcommand_take_effect(tiny, tmp_path, capsys):
    before = sl.get_num_threads()
    try:
        rc, _, err = run_cli(["sinks", tiny[1], "--prompt", LONG[0], "--max-tokens", T,
                              "--out", tmp_path, "--threads", 1, "--quiet"], capsys)
        assert rc == 0, err
        assert sl.get_num_threads() == 1
    finally:
        sl.set_num_threads(before)


@pytest.mark.parametrize("bad", [["--eps", "1.5"], ["--threads", "0"], ["--max-tokens", "1"]])
def test_bad_option_values(bad, capsys):
    rc, _, err = run_cli(["sinks", "x", *bad], capsys)
    assert rc == 2 and f"sinklab: error: {bad[0]} must" in err and "Traceback" not in err


# ------------------------------------------------------------------ one-line errors
def test_missing_path_is_one_line(tmp_path):
    res = subprocess.run([sys.executable, "-m", "sinklab.cli", "sinks", str(tmp_path / "nope.gguf")],
                         capture_output=True, text=True)
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("sinklab: error: ")
    assert "nope.gguf" in res.stderr and "neither a file" in res.stderr


@pytest.mark.parametrize("kind", ["garbage_gguf", "empty_folder", "truncated_safetensors"])
def test_bad_model_file_is_one_line(kind, tiny, tmp_path, capsys):
    if kind == "garbage_gguf":
        bad = tmp_path / "bad.gguf"
        bad.write_bytes(b"GGUF" + bytes(100))
    elif kind == "empty_folder":
        bad = tmp_path / "empty"
        bad.mkdir()
    else:
        import shutil

        bad = tmp_path / "trunc"
        shutil.copytree(tiny[1], bad)
        st = bad / "model.safetensors"
        st.write_bytes(st.read_bytes()[:-1000])
    argv = ["sinks", bad, "--prompt", LONG[0], "--max-tokens", T, "--out", tmp_path / "o", "--quiet"]
    rc, stdout, stderr = run_cli(argv, capsys)
    assert rc == 1 and stderr.count("\n") == 1 and stderr.startswith("sinklab: error: "), stderr
    assert "Traceback" not in stderr
    with pytest.raises(Exception) as e:  # --debug: the exception propagates with its traceback
        cli.main([str(a) for a in argv] + ["--debug"])
    assert not isinstance(e.value, SystemExit)
    assert str(e.value).splitlines()[0] in stderr


def test_debug_shows_the_traceback(tmp_path):
    res = subprocess.run([sys.executable, "-m", "sinklab.cli", "sinks", str(tmp_path / "nope"), "--debug"],
                         capture_output=True, text=True)
    assert res.returncode != 0 and "Traceback (most recent call last)" in res.stderr


# ------------------------------------------------------------------ reproduce
@pytest.fixture
def fake_reproduce(monkeypatch):
    import sinklab.report

    calls = []

    def fake(model, **kw):
        calls.append((model, kw))
        return {"meta": {"seconds_total": 1.0}}

    monkeypatch.setattr(sinklab.report, "reproduce", fake)
    return calls


def test_reproduce_passes_its_arguments(fake_reproduce, tiny, tmp_path, capsys):
    rc, out, err = run_cli(["reproduce", "--model", tiny[1], "--model", tiny[1], "--eps", "0.5", "0.9", "--quick",
                            "--out", tmp_path, "--threads", 1], capsys)
    assert rc == 0, err
    assert fake_reproduce == [((str(tiny[1]), str(tiny[1])), dict(out=str(tmp_path), quick=True, progress=True,
                                                                  eps=(0.5, 0.9)))]
    assert "report.md" in out


def test_reproduce_defaults(fake_reproduce, capsys):
    """The default pair: Gemma-3-270M (trained with a fixed ⟨bos⟩: the study model) and SmolLM2."""
    rc, _, err = run_cli(["reproduce", "--quiet"], capsys)
    assert rc == 0, err
    models, kw = fake_reproduce[0]
    assert models == ("gemma-3-270m", "smollm2-135m-instruct")
    assert kw == dict(out="sinklab-report", quick=False, progress=False, eps=(0.3, 0.8))
    assert all(type(e) is float for e in kw["eps"])


def test_reproduce_rejects_bad_input(fake_reproduce, tmp_path, capsys):
    rc, _, err = run_cli(["reproduce", "--model", tmp_path / "missing.gguf"], capsys)
    assert rc == 1 and err.startswith("sinklab: error: ") and err.count("\n") == 1
    rc, _, err = run_cli(["reproduce", "--eps", "0.3", "1.2"], capsys)
    assert rc == 2 and "--eps must lie in (0, 1), got 1.2" in err
    assert fake_reproduce == []


# ------------------------------------------------------------------ every family
@pytest.fixture
def cached_load(monkeypatch):
    """sinklab.load through the session's model cache (each real model loaded once)."""
    from tests.support.model_cache import real_model

    load = sl.load

    def cached(name, quiet=False, precision="fp32"):   # the cache holds fp32 models only
        return real_model(str(name)) if precision == "fp32" else load(name, quiet=quiet, precision=precision)

    monkeypatch.setattr(sl, "load", cached)
    return real_model


def _registered():
    from tests.support.model_cache import registered_names

    return registered_names()


@pytest.mark.real
@pytest.mark.parametrize("name", _registered())
def test_sinks_on_every_registered_model(name, cached_load, tmp_path, capsys):
    """`sinklab sinks NAME` on each registered model: a_0 per (layer, head) and the sink rates
    against float64 NumPy on the model's captured attention (first T tokens, BOS first)."""
    prompt = sl.load_passages("sinks")[1]
    Tn = 24
    rc, out, err = run_cli(["sinks", name, "--prompt", prompt, "--max-tokens", Tn, "--out", tmp_path, "--quiet"],
                           capsys)
    assert rc == 0, err
    model = cached_load(name)
    c = model.config
    res = json.loads((tmp_path / "sinks.json").read_text())
    ids = np.array([c.bos_token_id] + list(model.tokenize(prompt, bos=False))[: Tn - 1])
    A = model.run(ids, capture="attn").attn.astype(np.float64)
    a0 = A[:, :, :, 0].sum(axis=-1) / Tn                 # every query counts (0 where it cannot see key 0)
    imp = np.array(res["first_token_importance_mean"])
    assert imp.shape == (c.n_layers, c.n_heads) and np.abs(imp - a0).max() < 1e-5
    for eps in (0.3, 0.8):
        assert res["sink_rate"][f"{eps:g}"] == pytest.approx(float(np.mean(a0 > eps)), abs=1.0 / a0.size)
    assert f"{c.n_layers} layers x {c.n_heads} heads" in out
    assert ("bidirectional encoder" in out) == bool(c.bidirectional)
    assert res["bos_token_id"] == c.bos_token_id and res["n_prompts"] == 1


def _unsupported(kind, tmp_path):
    if kind == "hf":
        d = tmp_path / "mamba"
        d.mkdir()
        (d / "config.json").write_text(json.dumps({"model_type": "mamba", "hidden_size": 8}))
        return d, "mamba"
    gguf = require("gguf")
    path = tmp_path / "rwkv.gguf"
    w = gguf.GGUFWriter(str(path), "rwkv6")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path, "rwkv6"


@pytest.mark.parametrize("kind", ["hf", "gguf"])
@pytest.mark.parametrize("command", ["sinks", "reproduce"])
def test_unsupported_architecture_exits_2(kind, command, tmp_path, capsys):
    """A model file of another architecture: one line naming it and the supported ones, exit 2."""
    from sinklab.families import SUPPORTED_GGUF_ARCHS, SUPPORTED_HF_TYPES

    path, arch = _unsupported(kind, tmp_path)
    argv = (["sinks", path, "--prompt", LONG[0]] if command == "sinks" else ["reproduce", "--model", path])
    rc, _, err = run_cli(argv + ["--out", tmp_path / "o", "--quiet"], capsys)
    assert rc == 2, err
    assert err.count("\n") == 1 and err.startswith("sinklab: error: ") and "Traceback" not in err
    assert f"unsupported architecture {arch!r}" in err
    for a in (SUPPORTED_HF_TYPES if kind == "hf" else SUPPORTED_GGUF_ARCHS):
        assert a in err
    assert not (tmp_path / "o" / "report.md").exists()


def test_reproduce_families_arguments(monkeypatch, tmp_path, capsys):
    import sinklab.report

    calls = []
    monkeypatch.setattr(sinklab.report, "reproduce_families",
                        lambda out, **kw: calls.append((out, kw)) or {"meta": {"seconds_total": 2.0}})
    rc, out, err = run_cli(["reproduce", "--families", "--quick", "--out", tmp_path], capsys)
    assert rc == 0, err
    assert calls == [(str(tmp_path), dict(quick=True, progress=True))] and "families.md" in out
    rc, _, _ = run_cli(["reproduce", "--families", "--quiet"], capsys)
    assert rc == 0 and calls[-1] == ("sinklab-families", dict(quick=False, progress=False))
    rc, _, err = run_cli(["reproduce", "--families", "--model", "gemma-3-270m"], capsys)
    assert rc == 1 and "--families runs its own models" in err and len(calls) == 2


def test_models_lists_the_registry_with_cache_states(tmp_path, monkeypatch, capsys):
    """Every registered model with its pinned size and licence; the cache state follows the files
    (absent in an empty SINKLAB_HOME, cached once the verified file and its marker are there,
    unverified after an edit), without hashing."""
    from sinklab.io import registry

    monkeypatch.setenv("SINKLAB_HOME", str(tmp_path))
    rc, out, _ = run_cli(["models", "--json"], capsys)
    rows = json.loads(out)
    assert rc == 0 and [r["name"] for r in rows] == list(registry.MODELS)
    for r in rows:
        m = registry.MODELS[r["name"]]
        assert (r["size_bytes"], r["licence"], r["cache"]) == (m.size, m.licence, "absent")
    m = registry.RegisteredModel("fake-model", "fake==1.0", "x", hashlib.sha256(b"GGUF").hexdigest(), "f.gguf", "t")
    monkeypatch.setitem(registry.MODELS, "fake-model", m)
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "f.gguf").write_bytes(b"GGUF")
    assert registry.cache_state("fake-model") == "unverified"      # no marker yet
    registry.fetch("fake-model")                                   # verifies it (sha256 matches), writes the marker
    assert registry.cache_state("fake-model") == "cached"
    rc, out, _ = run_cli(["models"], capsys)
    assert rc == 0 and any(line.startswith("fake-model") and " cached " in line for line in out.splitlines())
    (tmp_path / "models" / "f.gguf").write_bytes(b"GGUX")
    assert registry.cache_state("fake-model") == "unverified"
