"""Training checkpoints (sinklab.train.checkpoint): what is on disk (read back with the
`safetensors` package), a bitwise restore, clear errors for missing, truncated and corrupted
files, stale temp folders ignored and removed, pruning, and the folder as a model:
``sinklab.load`` runs the same forward as the trainer's model (bitwise) and transformers'
``LlamaForCausalLM.from_pretrained`` matches it (fp32, <= 1e-4 relative on the logits).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import sinklab as sl
from tests.support.reference_models import require
from sinklab.train import Trainer, llama_config
from sinklab.train import checkpoint as ck
from tests.support.tiny_train import BOS, EOS, V, bits, write_tokenizer

T = 24


def _trainer(steps: int = 3, tied: bool = False, n_kv_heads=None) -> Trainer:
    cfg = llama_config(V, d_model=32, n_layers=2, n_heads=4, n_kv_heads=n_kv_heads, context_length=T,
                       tied_embeddings=tied, bos_token_id=BOS, eos_token_id=EOS)
    t = Trainer(cfg, seed=11)
    rng = np.random.default_rng(0)
    for _ in range(steps):
        ids = rng.integers(2, V, (3, T))
        t.step(ids, np.roll(ids, -1, axis=1), 3e-3)
    return t


@pytest.fixture()
def saved(tmp_path):
    """(trainer after 3 steps, run folder, its checkpoint folder)."""
    t = _trainer()
    run = str(tmp_path / "run")
    tok = write_tokenizer(str(tmp_path))
    path = ck.save_checkpoint(t, run, {"run_config": {"seed": 11}, "metrics": [{"step": 3}]}, tokenizer_path=tok)
    return t, run, path


def test_files_on_disk(saved):
    from safetensors.numpy import load_file

    t, run, path = saved
    assert os.path.basename(path) == "step-000003"
    assert open(os.path.join(run, "latest")).read() == "step-000003\n"
    assert sorted(os.listdir(run)) == ["latest", "step-000003"]   # no temp files left
    assert sorted(os.listdir(path)) == sorted([ck.CONFIG_FILE, ck.MODEL_FILE, ck.OPTIMIZER_FILE, ck.STATE_FILE,
                                               ck.TOKENIZER_FILE, ck.TOKENIZER_CONFIG_FILE])
    w = load_file(os.path.join(path, ck.MODEL_FILE))
    assert np.array_equal(w["model.embed_tokens.weight"], t.weights["tok_embd"])
    assert np.array_equal(w["model.layers.1.self_attn.o_proj.weight"], t.weights["blk.1.attn_output"])
    assert np.array_equal(w["model.layers.0.post_attention_layernorm.weight"], t.weights["blk.0.ffn_norm"])
    assert np.array_equal(w["lm_head.weight"], t.weights["lm_head"])
    assert len(w) == len(t.layout) and all(v.dtype == np.float32 for v in w.values())
    opt = load_file(os.path.join(path, ck.OPTIMIZER_FILE))
    assert np.array_equal(bits(opt["mom"]), bits(t.mom)) and np.array_equal(bits(opt["vel"]), bits(t.vel))
    state = json.load(open(os.path.join(path, ck.STATE_FILE)))
    assert state["step"] == state["data_position"] == 3 and state["metrics"] == [{"step": 3}]
    assert state["run_config"] == {"seed": 11} and state["sinklab_version"] == sl.__version__
    import hashlib

    for name, info in state["files"].items():
        data = open(os.path.join(path, name), "rb").read()
        assert info == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    cfg = json.load(open(os.path.join(path, ck.CONFIG_FILE)))
    assert cfg["model_type"] == "llama" and cfg["hidden_size"] == 32 and cfg["num_hidden_layers"] == 2
    assert cfg["bos_token_id"] == BOS and cfg["eos_token_id"] == EOS and cfg["torch_dtype"] == "float32"


def test_restore_is_bitwise_and_continues_identically(saved):
    t, run, path = saved
    for where in (run, path):
        t2 = ck.trainer_from_checkpoint(ck.load_checkpoint(where))
        assert t2.step_count == 3
        for name in ("params", "mom", "vel"):
            assert np.array_equal(bits(getattr(t2, name)), bits(getattr(t, name))), name
    ids = np.random.default_rng(5).integers(2, V, (3, T))
    a = t.step(ids, np.roll(ids, -1, axis=1), 1e-3)
    b = t2.step(ids, np.roll(ids, -1, axis=1), 1e-3)
    assert a == b and np.array_equal(bits(t.params), bits(t2.params))


def test_missing_truncated_and_corrupted_files(saved):
    _, run, path = saved
    backup = str(path) + "-copy"
    shutil.copytree(path, backup)

    def reset():
        shutil.rmtree(path)
        shutil.copytree(backup, path)

    model = os.path.join(path, ck.MODEL_FILE)
    with open(model, "r+b") as f:
        f.truncate(os.path.getsize(model) - 100)
    with pytest.raises(ck.CheckpointError, match="model.safetensors is truncated"):
        ck.load_checkpoint(run)
    reset()
    opt = os.path.join(path, ck.OPTIMIZER_FILE)
    data = bytearray(open(opt, "rb").read())
    data[-5] ^= 0x40
    open(opt, "wb").write(bytes(data))
    with pytest.raises(ck.CheckpointError, match="optimizer.safetensors is corrupted: sha256"):
        ck.load_checkpoint(run)
    reset()
    os.remove(os.path.join(path, ck.TOKENIZER_FILE))
    with pytest.raises(ck.CheckpointError, match="missing tokenizer.json"):
        ck.load_checkpoint(path)
    reset()
    st = os.path.join(path, ck.STATE_FILE)
    state = json.load(open(st))
    state["step"] = 4
    open(st, "w").write(json.dumps(state))
    with pytest.raises(ck.CheckpointError, match="trainer_state.json is corrupted"):
        ck.load_checkpoint(path)
    open(st, "w").write('{"format": "sinklab.Train')
    with pytest.raises(ck.CheckpointError, match="trainer_state.json is corrupted: not valid JSON"):
        ck.load_checkpoint(path)
    os.remove(st)
    with pytest.raises(ck.CheckpointError, match="missing trainer_state.json"):
        ck.load_checkpoint(path)
    reset()
    open(os.path.join(run, "latest"), "w").write("step-000007\n")
    with pytest.raises(ck.CheckpointError, match="names step-000007, which does not exist"):
        ck.load_checkpoint(run)


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_stale_temp_folders_are_ignored_and_removed(saved):
    t, run, path = saved
    dead = os.path.join(run, f"step-000004.tmp-{_dead_pid()}")
    os.mkdir(dead)
    open(os.path.join(dead, ck.MODEL_FILE), "wb").write(b"half")
    alive = os.path.join(run, f"step-000005.tmp-{os.getppid()}")  # a live process's write: left alone
    os.mkdir(alive)
    loaded = ck.load_checkpoint(run)
    assert loaded.step == 3 and not os.path.exists(dead) and os.path.isdir(alive)
    shutil.rmtree(alive)


def test_overwrites_a_complete_folder_latest_does_not_name(saved, tmp_path):
    """A run killed between renaming step N into place and updating latest leaves step N
    behind latest; the resumed run writes step N again."""
    t, run, path = saved
    tok = str(tmp_path / "tokenizer.json")
    t.step(*(lambda ids: (ids, np.roll(ids, -1, axis=1)))(np.full((1, T), 5)), 1e-3)
    ck.save_checkpoint(t, run, tokenizer_path=tok)
    open(os.path.join(run, "latest"), "w").write("step-000003\n")
    with open(os.path.join(run, "step-000004", ck.MODEL_FILE), "r+b") as f:
        f.truncate(10)   # whatever it holds is replaced
    again = ck.save_checkpoint(t, run, tokenizer_path=tok)
    assert ck.latest_checkpoint(run) == again and ck.load_checkpoint(run).step == 4
    with pytest.raises(ck.CheckpointError, match="latest checkpoint already"):
        ck.save_checkpoint(t, run)


def test_prune_keeps_the_newest_and_the_asked_for(tmp_path):
    t = _trainer(steps=0)
    run = str(tmp_path / "run")
    ids = np.full((1, T), 7)
    for _ in range(5):
        t.step(ids, np.roll(ids, -1, axis=1), 1e-3)
        ck.save_checkpoint(t, run, keep_last=2, keep_steps=[2])
    assert [s for s, _ in ck.list_checkpoints(run)] == [2, 4, 5]
    assert sorted(os.listdir(run)) == ["latest", "step-000002", "step-000004", "step-000005"]


@pytest.mark.parametrize("tied,kv", [(False, None), (True, 2)])
def test_checkpoint_is_a_model_for_sinklab_and_transformers(tmp_path, tied, kv):
    torch = require("torch")
    transformers = require("transformers")
    t = _trainer(tied=tied, n_kv_heads=kv)
    path = ck.save_checkpoint(t, str(tmp_path / "run"), tokenizer_path=write_tokenizer(str(tmp_path)))
    ids = np.random.default_rng(2).integers(0, V, (2, T))
    ids[:, 0] = BOS
    model = sl.load(path)
    assert model.config.tied_embeddings == tied and model.config.n_kv_heads == (kv or 4)
    got = model.run(ids, capture=("logits", "attn"))
    want = t.model.run(ids, capture=("logits", "attn"))
    assert np.array_equal(got.logits, want.logits) and np.array_equal(got.attn, want.attn)
    assert model.tokenizer is not None and list(model.tokenize("w5 w6", bos=True)) == [BOS, 5, 6]
    hf = transformers.LlamaForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        ref = hf(input_ids=torch.from_numpy(ids)).logits.numpy()
    scale = np.abs(ref).max()
    assert np.abs(got.logits - ref).max() <= 1e-4 * scale
