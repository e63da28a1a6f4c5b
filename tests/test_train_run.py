"""Training runs (sinklab.train.run, .evaluate): a run SIGKILLed mid-run and again in the middle
of a checkpoint write, then resumed, ends bitwise where an uninterrupted run ends (weights, Adam
moments, the log's deterministic fields); results do not depend on the thread count; the
evaluation protocol's numbers against float64 NumPy (sink rate from captured attention) and
torch's cross_entropy (validation loss); configs and the CLI's one-line errors.

The corpus here is synthetic (a Markov chain over a 64-word vocabulary, its own word-level
tokenizer), built by this file, so nothing depends on the real corpus download; the packer is
sinklab's.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import sinklab as sl
from sinklab import cli
from sinklab.train import Trainer, llama_config
from sinklab.train import checkpoint as ck
from sinklab.train.evaluate import evaluate, packed_loss
from sinklab.train.packing import Packer
from tests.support.reference_models import require
from sinklab.train.run import TIMING_FIELDS, ConfigError, TrainConfig, example_config, read_log, train
from tests.support.tiny_train import BOS, EOS, V, bits, make_corpus, make_docs, write_tokenizer  # noqa: F401
from tests.support.tiny_train import doc_stream as _stream

HERE = os.path.dirname(os.path.abspath(__file__))


# ------------------------------------------------------------------ synthetic corpus (tests/support/tiny_train.py)
def tiny_config(out_dir: str, **kw) -> TrainConfig:
    base = dict(d_model=32, n_layers=2, n_heads=2, context=32, tokens_per_step=128, steps=12, lr=3e-3,
                min_lr=3e-4, warmup_steps=2, eval_every=4, checkpoint_every=2, eval_docs=4, eval_windows=2,
                masking="intra_doc", fixed_bos=True, keep_last=2, out_dir=out_dir)
    base.update(kw)
    return TrainConfig(**base)


def child_main(corpus_dir: str, out_dir: str) -> None:
    """What the killed subprocesses run: the tiny run into out_dir (resuming if it can)."""
    train(tiny_config(out_dir), corpus=make_corpus(corpus_dir), progress=False)


def deterministic(log):
    return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in log]


# ------------------------------------------------------------------ crash and resume
def _spawn(corpus_dir, out_dir, env_extra):
    # the repository root too: this module imports tests.support
    code = (f"import sys; sys.path[:0] = [{HERE!r}, {os.path.dirname(HERE)!r}]; import test_train_run as t; "
            f"t.child_main({corpus_dir!r}, {out_dir!r})")
    env = {**os.environ, **env_extra}
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)


def _wait_for(cond, proc, timeout=60.0):
    t0 = time.time()
    while not cond():
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before it could be killed: {proc.stderr.read().decode()[-2000:]}")
        if time.time() - t0 > timeout:
            proc.kill()
            raise AssertionError("timed out waiting for the run")
        time.sleep(0.02)


def _latest_step(out_dir):
    try:
        path = ck.latest_checkpoint(out_dir)
    except ck.CheckpointError:
        return -1
    return -1 if path is None else int(os.path.basename(path).split("-")[1])


def _kill(proc):
    proc.send_signal(signal.SIGKILL)
    proc.wait()  # reaped: its pid no longer runs, so its temp folders count as stale
    assert proc.returncode == -signal.SIGKILL


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    make_corpus(str(d))
    return str(d)


@pytest.fixture(scope="module")
def reference(corpus_dir, tmp_path_factory):
    """The uninterrupted run."""
    out = str(tmp_path_factory.mktemp("ref") / "run")
    return train(tiny_config(out), corpus=make_corpus(corpus_dir), progress=False)


@pytest.mark.slow  # training subprocesses killed and resumed
def test_killed_mid_run_and_mid_checkpoint_resumes_bitwise(corpus_dir, reference, tmp_path):
    out = str(tmp_path / "run")
    # 1. SIGKILL between checkpoints: steps are slowed so the kill lands after step 4's checkpoint
    p = _spawn(corpus_dir, out, {ck.PAUSE_ENV: "", "SINKLAB_TEST_STEP_PAUSE": "0.2"})
    _wait_for(lambda: _latest_step(out) >= 4, p)
    _kill(p)
    killed_at = _latest_step(out)
    assert 4 <= killed_at < 12
    # 2. resumed, then SIGKILLed while it writes the checkpoint of step 10 (after its first file)
    p = _spawn(corpus_dir, out, {ck.PAUSE_ENV: "30@10", "SINKLAB_TEST_STEP_PAUSE": ""})
    tmp_dirs = lambda: [n for n in os.listdir(out) if n.startswith("step-000010.tmp-")]  # noqa: E731
    _wait_for(lambda: any(os.path.isfile(os.path.join(out, n, ck.MODEL_FILE)) for n in tmp_dirs()), p)
    _kill(p)
    assert _latest_step(out) == 8 and tmp_dirs()
    # the log may hold lines past the checkpoint: resuming drops them
    with open(os.path.join(out, "log.jsonl"), "a") as f:
        f.write(json.dumps({"step": 9, "stray": True}) + "\n")
    # 3. resumed to the end in this process
    res = train(tiny_config(out), corpus=make_corpus(corpus_dir), progress=False)
    assert res.resumed_from == 8 and res.steps == 12 and not tmp_dirs()
    ref = reference.trainer
    for name in ("params", "mom", "vel"):
        assert np.array_equal(bits(getattr(res.trainer, name)), bits(getattr(ref, name))), name
    assert res.trainer.step_count == ref.step_count == 12
    assert deterministic(read_log(out)) == deterministic(read_log(reference.out_dir)) == deterministic(res.log)
    assert [r["step"] for r in res.log] == [2, 4, 6, 8, 10, 12]
    # and the final checkpoint on disk holds the same bits
    final = ck.load_checkpoint(out)
    assert final.step == 12 and np.array_equal(bits(final.mom), bits(ref.mom))


def test_run_log_and_checkpoints(reference):
    log = reference.log
    assert [r["step"] for r in log] == [2, 4, 6, 8, 10, 12]
    assert [r["tokens"] for r in log] == [s * 128 for s in (2, 4, 6, 8, 10, 12)]
    evals = [r for r in log if r["step"] % 4 == 0 or r["step"] == 12]
    assert all(r["val_loss_bos"] is not None and r["sink_text_0.8"] is not None for r in evals)
    assert all(r["val_loss_bos"] is None for r in log if r not in evals)
    # keep_last=2: the two newest checkpoints remain
    assert [s for s, _ in ck.list_checkpoints(reference.out_dir)] == [10, 12]
    assert log[-1]["train_loss"] < log[0]["train_loss"]


def test_resume_of_a_finished_run_and_config_mismatch(corpus_dir, reference):
    again = train(tiny_config(reference.out_dir), corpus=make_corpus(corpus_dir),
                  progress=False)
    assert again.resumed_from == 12 and again.steps == 12
    assert np.array_equal(bits(again.trainer.params), bits(reference.trainer.params))
    with pytest.raises(ConfigError, match="lr"):
        train(tiny_config(reference.out_dir, lr=1e-2), corpus=make_corpus(corpus_dir), progress=False)


def test_no_resume_starts_over(corpus_dir, tmp_path):
    out = str(tmp_path / "run")
    cfg = tiny_config(out, steps=4)
    train(cfg, corpus=make_corpus(corpus_dir), progress=False)
    res = train(cfg, resume=False, corpus=make_corpus(corpus_dir), progress=False)
    assert res.resumed_from is None and [r["step"] for r in read_log(out)] == [2, 4]


# ------------------------------------------------------------------ threads
def test_same_bits_for_any_thread_count():
    cfg = llama_config(V, d_model=32, n_layers=2, n_heads=2, context_length=48, bos_token_id=BOS, eos_token_id=EOS)
    corpus_tokens, offs = _stream(make_docs(30))
    packer = Packer(corpus_tokens, offs, 48, True, BOS, True)
    before = sl.get_num_threads()
    results = []
    try:
        for n in (1, 2):
            sl.set_num_threads(n)
            t = Trainer(cfg, seed=3)
            losses = [t.step(*packer.batch(s, 4, 0)[:2], 2e-3, key_start=packer.batch(s, 4, 0)[2], keep_first=True)
                      for s in range(4)]
            results.append((t, losses))
    finally:
        sl.set_num_threads(before)
    (t1, l1), (t2, l2) = results
    assert l1 == l2
    for name in ("params", "mom", "vel"):
        assert np.array_equal(bits(getattr(t1, name)), bits(getattr(t2, name))), name


def test_whole_run_same_for_any_thread_count(corpus_dir, tmp_path):
    """Training, evaluation and the log: the same bits on 1 and 2 threads (and the run leaves
    the process's thread count as it found it)."""
    before = sl.get_num_threads()
    runs = [train(tiny_config(str(tmp_path / f"t{n}"), steps=4, threads=n), corpus=make_corpus(corpus_dir),
                  progress=False) for n in (1, 2)]
    assert sl.get_num_threads() == before
    assert np.array_equal(bits(runs[0].trainer.params), bits(runs[1].trainer.params))
    assert deterministic(runs[0].log) == deterministic(runs[1].log)
    assert runs[0].log[-1]["val_loss_train"] is not None


# ------------------------------------------------------------------ evaluation protocol
@pytest.fixture(scope="module")
def trained(reference):
    return reference.trainer


def test_sink_rate_against_float64_recomputation(trained):
    model = trained.model
    docs = make_docs(40)[:12]
    docs = [d for d in docs if len(d) >= 65]
    ev = evaluate(model, docs, context=32, bos_id=BOS, n_docs=5)
    used = docs[:5]
    T = 32  # min(64, C)
    for mode, first in (("bos", [BOS]), ("text", [])):
        a0 = []
        for d in used:
            ids = np.array(first + list(d[:T - len(first)]), np.int64)
            attn = model.run(ids, capture="attn").attn.astype(np.float64)  # (L, H, T, T), one document
            assert attn.shape[-1] == T
            L, H = attn.shape[:2]
            a0.append([[sum(attn[l, h, i, 0] for i in range(T)) / T for h in range(H)] for l in range(L)])
        a0 = np.array(a0)
        np.testing.assert_allclose(ev["importance"][mode], a0, rtol=1e-12, atol=1e-15)
        for eps in (0.3, 0.8):
            assert ev["sink_rate"][mode][f"{eps:g}"] == np.mean(a0 > eps)


def test_val_loss_against_torch_cross_entropy(trained):
    torch = require("torch")
    model = trained.model
    C = 32
    docs = [d for d in make_docs(40) if len(d) >= 65][:4]
    ev = evaluate(model, docs, context=C, bos_id=BOS, n_docs=4)
    sums, n_all = {"bos": 0.0, "text": 0.0}, {"bos": 0, "text": 0}
    for d in docs:
        x = d[:min(len(d), C - 1)]
        for mode, ids, rows in (("bos", np.r_[BOS, x], slice(1, len(x))), ("text", x, slice(0, len(x) - 1))):
            logits = torch.from_numpy(model.run(ids, capture="logits").logits[rows].astype(np.float64))
            ce = torch.nn.functional.cross_entropy(logits, torch.from_numpy(x[1:]), reduction="sum")
            sums[mode] += float(ce)
            n_all[mode] += len(x) - 1
    assert n_all["bos"] == n_all["text"] == ev["n_targets"] == 4 * (C - 2)
    for mode in ("bos", "text"):
        assert abs(ev["val_loss"][mode] - sums[mode] / n_all[mode]) <= 1e-10 * sums[mode] / n_all[mode]


def test_packed_val_loss_is_the_training_loss(trained):
    """The training-format loss (forward with the packing mask) equals the C training loss of
    the same windows (sl_model_loss_grad's fused cross-entropy), window by window."""
    from sinklab import _core

    tokens, offs = _stream(make_docs(30, seed=5))
    packer = Packer(tokens, offs, 32, True, BOS, True)
    total, count = packed_loss(trained.model, packer, 3, seed=7, keep_first=True)
    ids, tg, ks = packer.batch(0, 3, 7)
    want = 0.0
    grads = {k: np.zeros_like(v) for k, v in trained._core_grads.items()}
    for b in range(3):
        loss = _core.model_loss_grad(trained.model._handle, ids[b], tg[b], grads, key_start=ks[b], keep_first=True)
        want += loss * (tg[b] >= 0).sum()
    assert count == 3 * 32
    assert abs(total - want) <= 1e-5 * abs(want)


# ------------------------------------------------------------------ config and CLI
def test_config_validation_and_example():
    assert TrainConfig.from_dict(json.loads(example_config())) == TrainConfig()
    with pytest.raises(ConfigError, match="unknown config keys \\['contxt'\\]"):
        TrainConfig.from_dict({"contxt": 64})
    with pytest.raises(ConfigError, match="multiple of context"):
        TrainConfig.from_dict({"context": 96, "tokens_per_step": 1000})
    with pytest.raises(ConfigError, match="masking"):
        TrainConfig.from_dict({"masking": "document"})
    c = TrainConfig.from_dict({"total_tokens": 1 << 20, "tokens_per_step": 4096, "context": 128})
    assert c.steps is None and c.n_steps == 256 and c.batch_size == 32


def _run_cli(argv, capsys):
    try:
        rc = cli.main([str(a) for a in argv])
    except SystemExit as e:
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_train_example_and_errors(capsys, tmp_path, reference):
    rc, out, _ = _run_cli(["train", "--example"], capsys)
    assert rc == 0 and TrainConfig.from_dict(json.loads(out)) == TrainConfig()
    bad = tmp_path / "bad.json"
    bad.write_text('{"context": 64, "masking": "doc"}')
    rc, out, err = _run_cli(["train", bad], capsys)
    assert rc == 2 and err.count("\n") == 1 and "masking" in err and str(bad) in err
    broken = tmp_path / "broken.json"
    broken.write_text('{"context": 64,')
    rc, _, err = _run_cli(["train", broken], capsys)
    assert rc == 2 and "not valid JSON" in err
    # resuming a run with another config fails before any corpus is prepared
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**json.loads(json.dumps(tiny_config("x").to_dict())), "lr": 0.5}))
    rc, _, err = _run_cli(["train", other, "--out", reference.out_dir], capsys)
    assert rc == 2 and err.count("\n") == 1 and "lr" in err
    rc, _, err = _run_cli(["train"], capsys)
    assert rc == 2


def test_readme_training_example_is_a_valid_config():
    # the Training guide of the documentation (the README links to it) opens with the example config
    md = open(os.path.join(HERE, "..", "docs", "guides", "training.md"), encoding="utf-8").read()
    section = md.split("# Training\n", 1)[1].split("\n## ", 1)[0]
    blocks = section.split("```json\n")[1:]
    assert blocks, "the Training guide (docs/guides/training.md) shows a JSON config before its first section"
    cfg = TrainConfig.from_dict(json.loads(blocks[0].split("```", 1)[0]))
    assert cfg.masking == "intra_doc" and cfg.fixed_bos and cfg.batch_size == 32
