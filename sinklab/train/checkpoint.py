"""Training checkpoints: a Hugging Face LLaMA folder that ``sinklab.load`` and transformers'
``LlamaForCausalLM.from_pretrained`` both read, plus what resuming needs, written atomically.

A run directory holds ``step-000123/`` folders and a ``latest`` file naming the newest complete
one. Each folder has:

==========================  ===========================================================
``config.json``             a Hugging Face ``LlamaConfig`` (float32)
``model.safetensors``       the weights under their Hugging Face names, float32
``tokenizer.json``          the corpus's tokenizer (with ``tokenizer_config.json``), when known
``optimizer.safetensors``   the flat Adam moments ``mom`` and ``vel`` (float32, the engine's
                            buffers with their alignment padding)
``trainer_state.json``      step, run config, seed, data position, RNG note, metrics so far,
                            sinklab version, the layout of the flat buffers, and the size and
                            sha256 of every other file (and of itself, without that field)
==========================  ===========================================================

Writing: every file goes into ``step-000123.tmp-<pid>`` in the same parent and is fsynced, the
folder is renamed to its final name and the parent fsynced, then ``latest`` is replaced
atomically (temp file, fsync, ``os.replace``). A process killed at any point leaves either the
previous ``latest`` or the new one, never a half-written checkpoint behind it; leftover
``*.tmp-*`` folders of dead processes are ignored and removed by the next load or save.

Restoring (:func:`restore`) copies parameters, moments and step into a :class:`Trainer`
bitwise. There is no random state to save: the initialisation is drawn from the run's seed and
every batch is a pure function of (seed, step), so the data position is the step.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..families import base, llama
from ..families.config import ModelConfig
from ..io.hf_loader import SafetensorsError, read_safetensors
from ..runtime import __version__
from ..system import clean_stale, fsync_dir, write_text_atomic
from .engine import TRAIN_PRECISIONS, AdamW, Trainer, check_train_precision, llama_config

FORMAT = "sinklab.TrainCheckpoint/1"
LATEST = "latest"
CONFIG_FILE = "config.json"
MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
STATE_FILE = "trainer_state.json"
# Test hook: "SECONDS" or "SECONDS@STEP": sleep inside every checkpoint write (or only the one
# of step STEP), after its first file, so a test can kill the process mid-write.
PAUSE_ENV = "SINKLAB_TEST_CKPT_PAUSE"
_STEP_DIR = re.compile(r"^step-(\d{6,})$")


class CheckpointError(ValueError):
    """A checkpoint that is missing, incomplete, corrupted or does not fit the model."""


def step_dir_name(step: int) -> str:
    """``step-000123``: the folder of the checkpoint after optimizer step ``step``."""
    return f"step-{int(step):06d}"


# ------------------------------------------------------------------ Hugging Face layout
def model_kwargs(cfg: ModelConfig) -> Dict[str, Any]:
    """The :func:`llama_config` arguments that rebuild ``cfg`` (JSON-able); ``attn_variant`` only
    when it is not ``"softmax"``, so softmax checkpoints keep the state they always had."""
    out: Dict[str, Any] = dict(vocab_size=cfg.vocab_size, d_model=cfg.d_model, n_layers=cfg.n_layers, n_heads=cfg.n_heads,
               n_kv_heads=cfg.n_kv_heads, d_ff=cfg.d_ff, context_length=cfg.context_length,
               rope_theta=float(cfg.rope_theta), norm_eps=float(cfg.norm_eps),
               tied_embeddings=bool(cfg.tied_embeddings), bos_token_id=cfg.bos_token_id,
               eos_token_id=cfg.eos_token_id)
    if cfg.attn_variant != "softmax":
        out["attn_variant"] = cfg.attn_variant
    return out


def hf_config(cfg: ModelConfig, init_std: float = 0.02) -> Dict[str, Any]:
    """config.json of a Hugging Face ``LlamaForCausalLM`` with ``cfg``'s architecture (float32).

    RoPE's base is written both as ``rope_theta`` (transformers 4) and in ``rope_parameters``
    (transformers 5)."""
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": cfg.d_model, "intermediate_size": cfg.d_ff, "num_hidden_layers": cfg.n_layers,
            "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim,
            "hidden_act": "silu", "vocab_size": cfg.vocab_size, "max_position_embeddings": cfg.context_length,
            "rms_norm_eps": float(cfg.norm_eps), "rope_theta": float(cfg.rope_theta),
            "rope_parameters": {"rope_type": "default", "rope_theta": float(cfg.rope_theta)},
            "tie_word_embeddings": bool(cfg.tied_embeddings), "attention_bias": False, "mlp_bias": False,
            "attention_dropout": 0.0, "initializer_range": float(init_std), "use_cache": True,
            "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id,
            "torch_dtype": "float32", "dtype": "float32",
            **({"sinklab_attn_variant": cfg.attn_variant} if cfg.attn_variant != "softmax" else {})}


def hf_name(key: str) -> str:
    """The Hugging Face tensor name of canonical ``key`` (``blk.3.attn_q`` ->
    ``model.layers.3.self_attn.q_proj.weight``)."""
    if key.startswith("blk."):
        return llama.file_name(base.base_name(key), "hf", int(key.split(".")[1]))
    return llama.file_name(key, "hf")


# ------------------------------------------------------------------ atomic file writing
def _write_file(path: str, data: bytes) -> Dict[str, Any]:
    """Writes ``data`` and fsyncs it; returns its size and sha256."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _file_digest(path: str) -> Tuple[int, str]:
    h = hashlib.sha256()
    n = 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
            n += len(chunk)
    return n, h.hexdigest()


def _pause(step: int) -> None:
    spec = os.environ.get(PAUSE_ENV)
    if spec:
        secs, _, at = spec.partition("@")
        if not at or int(at) == step:
            time.sleep(float(secs))


def _json_bytes(obj: Any) -> bytes:
    return (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode("utf-8")


def _state_digest(state: Dict[str, Any]) -> str:
    """sha256 of the state without its own ``state_sha256`` field, in a canonical form."""
    body = {k: v for k, v in state.items() if k != "state_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode("utf-8")).hexdigest()


def _safetensors_bytes(tensors: Dict[str, np.ndarray], meta: Dict[str, str]) -> bytes:
    from safetensors.numpy import save

    return save({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in tensors.items()}, metadata=meta)


def _tokenizer_config(tokenizer_path: str, cfg: ModelConfig) -> Optional[Dict[str, Any]]:
    """tokenizer_config.json naming the BOS/EOS strings, so transformers' AutoTokenizer and
    sinklab agree on them; None when the tokenizer cannot be read."""
    try:
        from tokenizers import Tokenizer as Backend

        tok = Backend.from_file(tokenizer_path)
    except Exception:  # an unreadable tokenizer still gets copied; config.json names the ids
        return None
    out: Dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": False,
                           "model_max_length": cfg.context_length}
    for key, tid in (("bos_token", cfg.bos_token_id), ("eos_token", cfg.eos_token_id)):
        if tid is not None and tok.id_to_token(int(tid)) is not None:
            out[key] = tok.id_to_token(int(tid))
    return out


# ------------------------------------------------------------------ run folders
def list_checkpoints(run_dir: str) -> List[Tuple[int, str]]:
    """(step, path) of every ``step-NNNNNN`` folder in ``run_dir`` (complete or not), by step."""
    if not os.path.isdir(run_dir):
        return []
    out = []
    for name in os.listdir(run_dir):
        m = _STEP_DIR.match(name)
        if m and os.path.isdir(os.path.join(run_dir, name)):
            out.append((int(m.group(1)), os.path.join(run_dir, name)))
    return sorted(out)


def latest_checkpoint(run_dir: str) -> Optional[str]:
    """The folder ``run_dir/latest`` names, or None when there is no ``latest`` file.

    Raises:
        CheckpointError: ``latest`` names something that is not a checkpoint folder of ``run_dir``.
    """
    path = os.path.join(run_dir, LATEST)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8", errors="replace") as f:
        name = f.read(256).strip()
    if not _STEP_DIR.match(name):
        raise CheckpointError(f"{path} should name a step-NNNNNN folder, holds {name[:80]!r}")
    folder = os.path.join(run_dir, name)
    if not os.path.isdir(folder):
        raise CheckpointError(f"{path} names {name}, which does not exist in {run_dir}")
    return folder


def _delete_dir(path: str) -> None:
    """Removes a folder by first renaming it to a ``.tmp-<pid>`` name, so a half-deleted
    checkpoint is never taken for one."""
    trash = f"{path}.tmp-{os.getpid()}-del"
    os.rename(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def prune(run_dir: str, keep_last: int, keep_steps: Sequence[int] = ()) -> List[str]:
    """Deletes checkpoint folders beyond the ``keep_last`` newest (0: keep all), except those of
    ``keep_steps`` and the one ``latest`` names; returns the deleted paths."""
    if keep_last <= 0:
        return []
    ckpts = list_checkpoints(run_dir)
    latest = latest_checkpoint(run_dir)
    keep = {p for _, p in ckpts[-keep_last:]} | {p for s, p in ckpts if s in set(keep_steps)}
    gone = []
    for _, p in ckpts:
        if p not in keep and (latest is None or os.path.abspath(p) != os.path.abspath(latest)):
            _delete_dir(p)
            gone.append(p)
    if gone:
        fsync_dir(run_dir)
    return gone


# ------------------------------------------------------------------ save
def save_checkpoint(trainer: Trainer, run_dir: str, run_state: Optional[Dict[str, Any]] = None,
                    tokenizer_path: Optional[str] = None, keep_last: int = 0,
                    keep_steps: Sequence[int] = (), init_std: float = 0.02) -> str:
    """Writes the checkpoint of ``trainer`` at its current step into ``run_dir`` atomically
    and points ``run_dir/latest`` at it.

    Args:
        trainer: the engine (its weights, moments, step count and AdamW hyperparameters).
        run_dir: the run's folder (created if missing).
        run_state: JSON-able fields stored in trainer_state.json beside the engine's own (the
            run config, seed, metrics so far, ...).
        tokenizer_path: a ``tokenizer.json`` to copy in (None: the checkpoint has no tokenizer).
        keep_last: afterwards keep only this many newest checkpoints (0: all), plus
            ``keep_steps`` and the new one.
        init_std: written to config.json as ``initializer_range``.

    Returns:
        The checkpoint folder, ``run_dir/step-NNNNNN``.

    Raises:
        CheckpointError: ``latest`` already names this step (it would be overwritten).
    """
    os.makedirs(run_dir, exist_ok=True)
    clean_stale(run_dir)
    step = int(trainer.step_count)
    name = step_dir_name(step)
    final = os.path.join(run_dir, name)
    current = latest_checkpoint(run_dir)
    if current is not None and os.path.basename(current) == name:
        raise CheckpointError(f"{final} is the latest checkpoint already; refusing to overwrite it")
    tmp = f"{final}.tmp-{os.getpid()}"
    if os.path.exists(tmp):
        shutil.rmtree(tmp)
    os.mkdir(tmp)
    # a failed write (full disk, Ctrl-C) removes its temporary folder: nothing half-written stays
    try:
        cfg = trainer.config
        meta = {"format": FORMAT, "step": str(step)}
        files: Dict[str, Dict[str, Any]] = {}
        weights = {hf_name(s.name): trainer.weights[s.name] for s in trainer.layout}
        files[MODEL_FILE] = _write_file(os.path.join(tmp, MODEL_FILE), _safetensors_bytes(weights, meta))
        _pause(step)
        files[OPTIMIZER_FILE] = _write_file(os.path.join(tmp, OPTIMIZER_FILE),
                                            _safetensors_bytes({"mom": trainer.mom, "vel": trainer.vel}, meta))
        files[CONFIG_FILE] = _write_file(os.path.join(tmp, CONFIG_FILE), _json_bytes(hf_config(cfg, init_std)))
        if tokenizer_path is not None:
            with open(tokenizer_path, "rb") as f:
                files[TOKENIZER_FILE] = _write_file(os.path.join(tmp, TOKENIZER_FILE), f.read())
            tcfg = _tokenizer_config(tokenizer_path, cfg)
            if tcfg is not None:
                files[TOKENIZER_CONFIG_FILE] = _write_file(os.path.join(tmp, TOKENIZER_CONFIG_FILE), _json_bytes(tcfg))
        state = dict(run_state or {})
        state.update({"format": FORMAT, "step": step, "data_position": step, "sinklab_version": __version__,
                      "model": model_kwargs(cfg), "optimizer": asdict(trainer.optimizer),
                      "precision": trainer.precision,
                      "n_params": int(trainer.n_params), "n_flat": int(trainer.params.size),
                      "layout": [[s.name, list(s.shape), int(s.offset)] for s in trainer.layout],
                      "rng": "none kept: the weights are drawn from PCG64(seed) at step 0 and every batch is a "
                             "pure function of (seed, step)",
                      "files": files})
        state["state_sha256"] = _state_digest(state)
        _write_file(os.path.join(tmp, STATE_FILE), _json_bytes(state))
        fsync_dir(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if os.path.exists(final):  # left by a run killed between this rename and updating latest
        _delete_dir(final)
    os.rename(tmp, final)
    fsync_dir(run_dir)
    write_text_atomic(os.path.join(run_dir, LATEST), name + "\n")
    prune(run_dir, keep_last, keep_steps)
    return final


# ------------------------------------------------------------------ load
@dataclass
class Checkpoint:
    """A verified checkpoint read from disk.

    Attributes:
        path: its folder.
        step: optimizer steps taken.
        state: trainer_state.json (run config under ``"run_config"`` when written by
            :func:`sinklab.train.run.train`, metrics under ``"metrics"``).
        config: the model's :class:`ModelConfig`.
        optimizer: the AdamW hyperparameters.
        precision: the training precision of the run (``"fp32"`` or ``"bf16"``; ``"fp32"`` for a
            checkpoint written before trainer_state.json recorded it).
        tensors: Hugging Face name -> float32 array (read-only memory maps of model.safetensors).
        mom, vel: (n_flat,) float32 Adam moments (memory maps of optimizer.safetensors).
        tokenizer_path: its tokenizer.json, or None.
    """

    path: str
    step: int
    state: Dict[str, Any]
    config: ModelConfig
    optimizer: AdamW
    tensors: Dict[str, np.ndarray]
    mom: np.ndarray
    vel: np.ndarray
    tokenizer_path: Optional[str]
    precision: str = "fp32"


def read_state(folder: str) -> Dict[str, Any]:
    """trainer_state.json of a checkpoint folder, checked against its own sha256 (the other
    files are not read)."""
    path = os.path.join(folder, STATE_FILE)
    if not os.path.isfile(path):
        raise CheckpointError(f"{folder}: missing {STATE_FILE} (an incomplete checkpoint)")
    try:
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
    except (ValueError, RecursionError) as e:  # bad UTF-8 or JSON, 5000-digit ints, deep nesting
        raise CheckpointError(f"{path} is corrupted: not valid JSON ({type(e).__name__}: {str(e)[:100]})") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a sinklab training state (format {FORMAT!r})")
    if state.get("state_sha256") != _state_digest(state):
        raise CheckpointError(f"{path} is corrupted: its contents do not match its state_sha256")
    return state


def _is_count(v: Any) -> bool:
    return type(v) is int and v >= 0


def _check_state(folder: str, state: Dict[str, Any]) -> None:
    """The kinds of the state's fields that loading reads (``files``, ``step``, ``n_flat``,
    ``model``, ``optimizer``, ``layout``): a state that passes its checksum but was written by
    something else gives a CheckpointError naming the field, not a TypeError."""
    where = os.path.join(folder, STATE_FILE)
    files = state.get("files")
    if not isinstance(files, dict):
        raise CheckpointError(f"{where}: 'files' should map file names to their size and sha256")
    for name, info in files.items():
        # Plain names only: a listed "../x" must not make loading read outside the folder.
        if not name or name != os.path.basename(name) or name in (".", ".."):
            raise CheckpointError(f"{where}: 'files' lists {name[:80]!r}, not a file name of the folder")
        if not (isinstance(info, dict) and _is_count(info.get("bytes")) and isinstance(info.get("sha256"), str)):
            raise CheckpointError(f"{where}: 'files' entry {name!r} should hold 'bytes' (int) and 'sha256' (str)")
    for key in ("step", "n_flat"):
        if not _is_count(state.get(key)):
            raise CheckpointError(f"{where}: {key!r} should be a non-negative integer, holds {state.get(key)!r:.80}")
    for key in ("model", "optimizer"):
        if not isinstance(state.get(key), dict):
            raise CheckpointError(f"{where}: {key!r} should be a JSON object")
    bad = {k: v for k, v in state["optimizer"].items() if type(v) not in (int, float)}
    if bad:
        raise CheckpointError(f"{where}: optimizer hyperparameters should be numbers, got {bad!r:.120}")
    precision = state.get("precision", "fp32")
    if not (isinstance(precision, str) and precision in TRAIN_PRECISIONS):
        raise CheckpointError(f"{where}: 'precision' should be one of {sorted(TRAIN_PRECISIONS)}, holds "
                              f"{state.get('precision')!r:.80}")


def _model_config(folder: str, state: Dict[str, Any]) -> Tuple[ModelConfig, AdamW]:
    """The architecture and optimizer a checked state describes (CheckpointError when they are
    not valid arguments of :func:`llama_config` / :class:`AdamW`)."""
    where = os.path.join(folder, STATE_FILE)
    model = state["model"]
    ints = ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "context_length",
            "bos_token_id", "eos_token_id")
    bad = {k: v for k, v in model.items() if (k in ints and v is not None and not _is_count(v))
           or (k in ("rope_theta", "norm_eps") and type(v) not in (int, float))}
    if bad:
        raise CheckpointError(f"{where}: invalid model fields {bad!r:.120}")
    try:
        return llama_config(**model), AdamW(**state["optimizer"])
    except (TypeError, ValueError, ZeroDivisionError, OverflowError) as e:
        raise CheckpointError(f"{where}: the model or optimizer it describes is invalid ({e})") from None


def _verify_files(folder: str, files: Dict[str, Dict[str, Any]]) -> None:
    for name, info in files.items():
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            raise CheckpointError(f"{folder}: missing {name} (listed in {STATE_FILE})")
        size, digest = _file_digest(path)
        if size != info["bytes"]:
            raise CheckpointError(f"{path} is truncated or corrupted: {size} bytes, {STATE_FILE} records "
                                  f"{info['bytes']}")
        if digest != info["sha256"]:
            raise CheckpointError(f"{path} is corrupted: sha256 {digest[:16]}... differs from the "
                                  f"{info['sha256'][:16]}... recorded in {STATE_FILE}")


def _f32_tensors(path: str) -> Dict[str, np.ndarray]:
    try:
        table = read_safetensors(path)
    except SafetensorsError as e:
        raise CheckpointError(str(e)) from None
    out = {}
    for name, (dtype, shape, raw) in table.items():
        if dtype != "F32":
            raise CheckpointError(f"{path}: tensor {name} is {dtype}, checkpoints hold float32")
        out[name] = np.frombuffer(raw, dtype=np.float32).reshape(shape)
    return out


def resolve(path: str) -> str:
    """The checkpoint folder of ``path``: a checkpoint folder itself, or a run folder (the one
    its ``latest`` names). Stale temp folders of a run folder are removed on the way."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise CheckpointError(f"{path} is not a folder (a checkpoint or a run folder)")
    if os.path.isfile(os.path.join(path, STATE_FILE)) or _STEP_DIR.match(os.path.basename(os.path.normpath(path))):
        return path
    clean_stale(path)
    folder = latest_checkpoint(path)
    if folder is None:
        raise CheckpointError(f"{path} holds no {STATE_FILE} and no {LATEST} file: not a checkpoint or "
                              f"a run folder with one")
    return folder


def load_checkpoint(path: str, verify: bool = True) -> Checkpoint:
    """Reads a checkpoint folder, or the latest checkpoint of a run folder.

    Args:
        path: ``run_dir/step-NNNNNN`` or ``run_dir``.
        verify: check every file's size and sha256 against trainer_state.json (about 0.1 s
            for 100 MB).

    Raises:
        CheckpointError: (a ValueError) a missing file, a size or sha256 mismatch, a corrupted
            safetensors file, or a state that is not sinklab's or whose fields have the wrong
            kind; the message names the file. This is the only exception a hostile checkpoint
            folder raises (checked by benchmarks/fuzz_parsers.py).
        OSError: a file cannot be read (permissions, I/O error).
    """
    folder = resolve(path)
    state = read_state(folder)
    _check_state(folder, state)
    files = state["files"]
    for need in (CONFIG_FILE, MODEL_FILE, OPTIMIZER_FILE):
        if need not in files:
            raise CheckpointError(f"{folder}: {STATE_FILE} lists no {need}")
    if verify:
        _verify_files(folder, files)
    else:
        for name in files:
            if not os.path.isfile(os.path.join(folder, name)):
                raise CheckpointError(f"{folder}: missing {name} (listed in {STATE_FILE})")
    cfg, optimizer = _model_config(folder, state)
    tensors = _f32_tensors(os.path.join(folder, MODEL_FILE))
    opt = _f32_tensors(os.path.join(folder, OPTIMIZER_FILE))
    n = int(state["n_flat"])
    for k in ("mom", "vel"):
        if k not in opt or opt[k].shape != (n,):
            raise CheckpointError(f"{os.path.join(folder, OPTIMIZER_FILE)}: {k} should be ({n},) float32")
    tok = os.path.join(folder, TOKENIZER_FILE)
    return Checkpoint(path=folder, step=int(state["step"]), state=state, config=cfg,
                      optimizer=optimizer, tensors=tensors, mom=opt["mom"], vel=opt["vel"],
                      tokenizer_path=tok if TOKENIZER_FILE in files else None,
                      precision=str(state.get("precision", "fp32")))


def restore(trainer: Trainer, ckpt: Checkpoint) -> None:
    """Copies the checkpoint's weights, Adam moments, step and training precision into ``trainer``
    (bitwise).

    Raises:
        CheckpointError: the trainer's parameter layout differs from the checkpoint's.
    """
    layout = [[s.name, list(s.shape), int(s.offset)] for s in trainer.layout]
    if layout != ckpt.state.get("layout") or trainer.params.size != int(ckpt.state["n_flat"]):
        raise CheckpointError(f"{ckpt.path}: the checkpoint's parameter layout differs from this trainer's "
                              f"(another architecture?)")
    missing = [hf_name(s.name) for s in trainer.layout if hf_name(s.name) not in ckpt.tensors]
    if missing:
        raise CheckpointError(f"{os.path.join(ckpt.path, MODEL_FILE)} lacks {missing[:3]}")
    trainer.params[:] = 0.0  # the alignment padding between tensors stays zero
    for s in trainer.layout:
        src = ckpt.tensors[hf_name(s.name)]
        if src.shape != s.shape:
            raise CheckpointError(f"{os.path.join(ckpt.path, MODEL_FILE)}: {hf_name(s.name)} has shape "
                                  f"{src.shape}, expected {s.shape}")
        trainer.weights[s.name][...] = src
    trainer.mom[:] = ckpt.mom
    trainer.vel[:] = ckpt.vel
    trainer.grads[:] = 0.0
    trainer.optimizer = AdamW(**asdict(ckpt.optimizer))
    trainer.step_count = ckpt.step
    trainer.precision = check_train_precision(ckpt.precision)


def trainer_from_checkpoint(ckpt: Checkpoint, tokenizer: Any = None) -> Trainer:
    """A :class:`Trainer` holding the checkpoint's state, ready to take step ``ckpt.step + 1``."""
    t = Trainer(ckpt.config, tokenizer=tokenizer, optimizer=AdamW(**asdict(ckpt.optimizer)), init=False,
                precision=ckpt.precision)
    restore(t, ckpt)
    return t
