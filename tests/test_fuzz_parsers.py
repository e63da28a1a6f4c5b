"""The file parsers under hostile input: a short seeded fuzz run per parser (benchmarks/fuzz_parsers.py;
the long run's figures are in benchmarks/RESULTS.md) must end every input in the parser's
documented exception type within the timeout, and every input the fuzzer once broke a parser
with is kept here as a regression test (bytes built in the test). Lengths of 2^62 must be
refused before anything of that size is allocated (tracemalloc)."""
from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import struct
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from tests.support import fuzz_atheris as fa  # noqa: E402
from tests.support import fuzz_parsers as fz  # noqa: E402
from sinklab.io.gguf_loader import GGUFError, open_gguf  # noqa: E402
from sinklab.io.gguf_reader import GGUFFile, GGUFFormatError  # noqa: E402
from sinklab.io.hf_loader import SafetensorsError, read_safetensors  # noqa: E402
from sinklab.tokenizer import Tokenizer  # noqa: E402
from sinklab.train import checkpoint as ck  # noqa: E402

from tests.support.reference_models import require  # noqa: E402

# inputs per parser in CI: about 8 s in all on 2 cores
SHORT_RUN = {"gguf": 2000, "safetensors": 2000, "tokenizer": 800, "checkpoint": 800, "hfconfig": 2000, "core": 1000}


@pytest.mark.parametrize("parser", fz.PARSERS)
def test_short_fuzz_run_raises_only_documented_exceptions(parser, tmp_path):
    r = fz.fuzz(parser, SHORT_RUN[parser], seed=12345, timeout=5.0, out=str(tmp_path))
    assert r["inputs"] == SHORT_RUN[parser]
    assert r["undocumented"] == [], r["undocumented"][:5]
    assert r["hangs"] == []
    # The run exercised both sides: some mutants still parse, most are refused.
    refused = sum(r["exceptions"].values())
    assert 0 < r["accepted"] < r["inputs"] and refused == r["inputs"] - r["accepted"]


def test_harness_reports_an_undocumented_exception(tmp_path, monkeypatch):
    """The property the CI run relies on: a parser raising anything but its documented types is
    counted and its input saved (else the run above could never fail)."""
    def broken(path):
        raise KeyError("boom")

    monkeypatch.setattr(fz, "open_gguf", broken)
    r = fz.fuzz("gguf", 5, seed=0, out=str(tmp_path))
    assert len(r["undocumented"]) == 5 and r["exceptions"] == {"KeyError": 5}
    assert all(os.path.isfile(p) and os.path.isfile(p + ".txt") for _, _, p in r["undocumented"])


def test_harness_reports_a_hang(tmp_path, monkeypatch):
    import time

    monkeypatch.setattr(fz, "open_gguf", lambda path: time.sleep(10))
    r = fz.fuzz("gguf", 1, seed=0, timeout=0.2, out=str(tmp_path))
    assert len(r["hangs"]) == 1 and r["seconds"] < 5


# ------------------------------------------------------------------ coverage-guided short run (atheris)
# inputs per parser in CI: ~3 s each with the instrumented import (the long run: RESULTS.md)
ATHERIS_RUNS = {"gguf": 1500, "safetensors": 3000, "tokenizer": 1000, "checkpoint": 1500, "hfconfig": 2000,
                "core": 1000}


def _atheris():
    """atheris where pyproject's test extra installs it (CPython < 3.12 on x86-64 Linux, where
    its wheel exists; CI fails if it is missing there); elsewhere the test skips."""
    if sys.version_info >= (3, 12) or platform.machine() != "x86_64" or not sys.platform.startswith("linux"):
        pytest.skip("atheris 2.3.0 has no wheel for this Python or platform")
    if fa._under_asan():  # .ci/sanitize fuzzes with fuzz_parsers.py instead (see fuzz_atheris's docstring)
        pytest.skip("under gcc's libasan atheris gets no coverage (libasan provides the coverage symbols)")
    return require("atheris")


@pytest.mark.slow  # timed atheris runs, one per parser
@pytest.mark.parametrize("parser", fa.PARSERS)
def test_short_coverage_guided_run_raises_only_documented_exceptions(parser, tmp_path):
    _atheris()
    runs = ATHERIS_RUNS[parser]
    r = fa.campaign(parser, runs, str(tmp_path), coverage=False)
    assert not fa.failed(r), r["log"][-3000:]
    assert r["executed"] == r["inputs"] == runs and r["accepted"] + sum(r["exceptions"].values()) == runs
    assert set(r["exceptions"]) <= {t.__name__ for t in fz.DOCUMENTED[parser]} | {
        "GGUFError", "UnsupportedGGUFArchitecture", "UnsupportedArchitecture", "JSONDecodeError"}
    # coverage feedback works: inputs that reached new branches were kept beyond the seeds
    n_seeds = len([n for n in os.listdir(tmp_path / f"corpus-{parser}") if n.startswith("seed-")])
    assert r["corpus"] > n_seeds and r["edges"] > 0


@pytest.mark.slow  # a timed atheris run
def test_short_coverage_guided_run_fails_on_an_undocumented_exception(tmp_path):
    """What the run above relies on: a parser raising a type it does not document stops the run
    with a non-zero status and a reproducer (here the parser raises KeyError once it has parsed
    an input: the seed, which parses)."""
    _atheris()
    r = fa.campaign("safetensors", 500, str(tmp_path), coverage=False, inject="KeyError")
    assert fa.failed(r) and r["rc"] != 0 and len(r["crashes"]) == 1
    assert r["exceptions"].get("KeyError") == 1
    assert "KeyError: 'injected'" in Path(r["crashes"][0] + ".txt").read_text()  # the traceback, saved
    read_safetensors(_write(tmp_path, Path(r["crashes"][0]).read_bytes(), "crash.safetensors"))  # parses


def test_packed_checkpoint_input_round_trips():
    files = {"b.json": b"{}", "a.bin": b"\x00\x01", "c": b""}
    assert fa.unpack_files(fa.pack_files(files, 3), list(files)) == (3, files)
    assert fa.unpack_files(b"\x01\x05\x00", list(files)) == (1, {"a.bin": b"", "b.json": b"", "c": b""})


# ------------------------------------------------------------------ huge lengths
def _write(tmp_path, data: bytes, name: str = "x.bin") -> str:
    p = tmp_path / name
    p.write_bytes(data)
    return str(p)


def _peak_alloc(fn) -> int:
    """Peak bytes Python allocates inside ``fn`` (imports done before: they are not the file's)."""
    from sinklab.io.gguf_reader import _type_sizes

    _type_sizes()
    tracemalloc.start()
    try:
        fn()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


def _gguf_header(n_tensors: int, n_kv: int) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv)


@pytest.mark.parametrize("case", ["tensor count", "kv count", "key length", "string length", "u8 array count",
                                  "string array count", "tensor dims"])
def test_gguf_length_of_2_62_is_refused_before_allocation(case, tmp_path):
    huge = 1 << 62
    key = fz._gstr("general.name")
    if case == "tensor count":
        data = _gguf_header(huge, 0)
    elif case == "kv count":
        data = _gguf_header(0, huge)
    elif case == "key length":
        data = _gguf_header(0, 1) + struct.pack("<Q", huge) + b"abc"
    elif case == "string length":
        data = _gguf_header(0, 1) + key + struct.pack("<IQ", 8, huge) + b"abc"
    elif case == "u8 array count":
        data = _gguf_header(0, 1) + key + struct.pack("<IIQ", 9, 0, huge) + b"\0" * 16
    elif case == "string array count":
        data = _gguf_header(0, 1) + key + struct.pack("<IIQ", 9, 8, huge) + b"\0" * 16
    else:  # a tensor of 2^62 x 2^62 F32 elements pointing at offset 0
        data = _gguf_header(1, 0) + fz._gstr("t") + struct.pack("<IQQIQ", 2, huge, huge, 0, 0) + b"\0" * 64
    path = _write(tmp_path, data + b"\0" * 64)

    def parse():
        with pytest.raises(GGUFFormatError):
            GGUFFile(path)

    assert _peak_alloc(parse) < 1 << 20


def test_safetensors_header_length_of_2_62_is_refused_before_allocation(tmp_path):
    path = _write(tmp_path, struct.pack("<Q", 1 << 62) + b"{}" + b"\0" * 64)

    def parse():
        with pytest.raises(SafetensorsError, match="header length"):
            read_safetensors(path)

    assert _peak_alloc(parse) < 1 << 20


# ------------------------------------------------------------------ regressions: safetensors
def _safetensors(header_text: str, body: bytes = b"\0" * 16) -> bytes:
    raw = header_text.encode()
    return struct.pack("<Q", len(raw)) + raw + body


@pytest.mark.parametrize("header", [
    '{"a": {"dtype": "F32", "shape": [1e999], "data_offsets": [0, 4]}}',      # was OverflowError
    '{"a": {"dtype": "F32", "shape": [' + "9" * 5000 + '], "data_offsets": [0, 4]}}',  # was ValueError
    "[" * 100000 + "]" * 100000,                                              # was RecursionError
    '{"a": {"dtype": ["F32"], "shape": [1], "data_offsets": [0, 4]}}',        # was TypeError (unhashable)
    '{"a": {"dtype": "F32", "shape": [1], "data_offsets": ["0", "4"]}}',      # was TypeError
    '{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0.0, 4.0]}}',      # was TypeError when sliced
    '{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4, 8]}}',
    '{"a": {"dtype": "F32", "shape": "4", "data_offsets": [0, 16]}}',
    '{"a": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}}',  # int64 product wraps to 0
    '{"a": {"dtype": "F32", "shape": [-1, -4], "data_offsets": [0, 16]}}',
    '{"a": 5}',
])
def test_safetensors_fuzz_regressions(header, tmp_path):
    path = _write(tmp_path, _safetensors(header))
    with pytest.raises(SafetensorsError):
        read_safetensors(path)


def test_safetensors_valid_file_still_reads(tmp_path):
    from safetensors.numpy import save

    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    path = _write(tmp_path, save({"a": a, "s": np.array(2.0, np.float32)}))
    t = read_safetensors(path)
    assert t["a"][:2] == ("F32", (3, 4)) and np.array_equal(t["a"][2].view(np.float32).reshape(3, 4), a)
    assert t["s"][1] == () and t["s"][2].view(np.float32)[0] == 2.0


# ------------------------------------------------------------------ regressions: tokenizer
def _bpe_kv(**changes):
    tokens = fz._byte_vocab() + ["<|im_start|>"]
    kv = {"general.architecture": (8, "llama"), "tokenizer.ggml.model": (8, "gpt2"),
          "tokenizer.ggml.tokens": (9, (8, tokens)), "tokenizer.ggml.token_type": (9, (5, [1] * 256 + [3])),
          "tokenizer.ggml.merges": (9, (8, ["a b"])), "tokenizer.ggml.bos_token_id": (4, 256)}
    kv.update(changes)
    return fz.gguf_bytes([(k, t, v) for k, (t, v) in kv.items() if t is not None], [])[0]


def test_tokenizer_seed_gguf_builds(tmp_path):
    tok = Tokenizer.from_gguf(_write(tmp_path, _bpe_kv(), "t.gguf"))
    assert tok.bos_token_id == 256 and tok.decode(tok.encode("hi <|im_start|>")) == "hi <|im_start|>"


@pytest.mark.parametrize("changes", [
    {"tokenizer.ggml.merges": (4, 7)},                                # was TypeError: 'int' object is not iterable
    {"tokenizer.ggml.merges": (9, (4, [1, 2]))},                     # was TypeError in _split_merges
    {"tokenizer.ggml.tokens": (9, (4, [1, 2, 3]))},                  # numbers, not strings
    {"tokenizer.ggml.tokens": (12, 1.5)},                            # was TypeError: 'float' not iterable
    {"tokenizer.ggml.pre": (9, (4, [1]))},                           # was TypeError: unhashable ndarray
    {"tokenizer.ggml.bos_token_id": (9, (8, ["x"]))},                # was TypeError in int()
    {"tokenizer.ggml.token_type": (8, "normal")},
    {"tokenizer.ggml.model": (9, (8, ["gpt2"]))},
    {"tokenizer.ggml.model": (8, "llama"), "tokenizer.ggml.merges": (None, None),
     "tokenizer.ggml.scores": (9, (6, [0.0] * 257)), "tokenizer.ggml.unknown_token_id": (8, "0")},  # was '<=' TypeError
    {"tokenizer.ggml.add_space_prefix": (8, "yes")},
])
def test_tokenizer_fuzz_regressions(changes, tmp_path):
    path = _write(tmp_path, _bpe_kv(**changes), "t.gguf")
    with pytest.raises(ValueError):
        Tokenizer.from_gguf(path)


# ------------------------------------------------------------------ regressions: checkpoint
@pytest.fixture(scope="module")
def seed_checkpoint(tmp_path_factory):
    return fz.checkpoint_seed(str(tmp_path_factory.mktemp("ckpt-seed")))


def _restate(folder: str, mutate) -> None:
    """Rewrites trainer_state.json with ``mutate`` applied and its own sha256 recomputed."""
    path = os.path.join(folder, ck.STATE_FILE)
    state = json.loads(Path(path).read_text())
    mutate(state)
    state["state_sha256"] = ck._state_digest(state)
    Path(path).write_bytes(ck._json_bytes(state))


@pytest.mark.parametrize("name,mutate", [
    ("optimizer not an object", lambda s: s.update(optimizer=5)),            # was TypeError in AdamW(**...)
    ("model missing", lambda s: s.pop("model")),                             # was KeyError
    ("optimizer missing", lambda s: s.pop("optimizer")),                     # was KeyError
    ("model field a string", lambda s: s["model"].update(d_model="16")),
    ("unknown model field", lambda s: s["model"].update(colour=1)),          # was TypeError
    ("heads do not divide d", lambda s: s["model"].update(n_heads=3)),       # was a plain ValueError
    ("n_flat a list", lambda s: s.update(n_flat=[1])),                       # was TypeError
    ("step missing", lambda s: s.pop("step")),
    ("files a list", lambda s: s.update(files=[])),
    ("file entry lacks bytes", lambda s: s["files"]["config.json"].pop("bytes")),  # was KeyError
    ("file outside the folder", lambda s: s["files"].update({"../../x": {"bytes": 1, "sha256": "0"}})),
])
def test_checkpoint_fuzz_regressions(name, mutate, seed_checkpoint, tmp_path):
    folder = str(tmp_path / "step-000000")
    shutil.copytree(seed_checkpoint, folder)
    _restate(folder, mutate)
    with pytest.raises(ck.CheckpointError):
        ck.load_checkpoint(folder, verify=False)


@pytest.mark.parametrize("content", [b"[" * 100000 + b"]" * 100000, b'{"a": ' + b"9" * 5000 + b"}", b"\xff\xfe{}"])
def test_checkpoint_state_json_that_breaks_the_decoder(content, seed_checkpoint, tmp_path):
    folder = str(tmp_path / "step-000000")
    shutil.copytree(seed_checkpoint, folder)
    Path(folder, ck.STATE_FILE).write_bytes(content)
    with pytest.raises(ck.CheckpointError, match="not valid JSON"):
        ck.load_checkpoint(folder)


def test_checkpoint_seed_loads_bitwise(seed_checkpoint, tmp_path):
    """The regressions above are refusals of a folder that otherwise loads: the seed's
    tensors equal the bytes of its own model.safetensors (read by the safetensors package)."""
    from safetensors.numpy import load_file

    c = ck.load_checkpoint(seed_checkpoint)
    ref = load_file(os.path.join(seed_checkpoint, ck.MODEL_FILE))
    assert set(c.tensors) == set(ref) and all(np.array_equal(c.tensors[k], ref[k]) for k in ref)
    digest = hashlib.sha256(Path(seed_checkpoint, ck.MODEL_FILE).read_bytes()).hexdigest()
    assert c.state["files"][ck.MODEL_FILE]["sha256"] == digest


def test_gguf_duplicated_metadata_key_is_refused(tmp_path):
    """A second ``tokenizer.ggml.tokens`` would silently replace the first (llama.cpp and gguf-py
    refuse the file)."""
    ok = fz.gguf_bytes([("a", 4, 1), ("b", 4, 2)], [])[0]
    dup = fz.gguf_bytes([("a", 4, 1), ("a", 4, 2)], [])[0]
    assert GGUFFile(_write(tmp_path, ok, "ok.gguf")).fields == {"a": 1, "b": 2}
    with pytest.raises(GGUFFormatError, match="appears twice"):
        GGUFFile(_write(tmp_path, dup))


def test_gguf_open_refuses_truncation_at_every_byte_of_the_header(tmp_path):
    """Every prefix of a small GGUF that ends inside its header or tensor data raises GGUFError."""
    data, _ = fz.gguf_seeds()[1]
    full = GGUFFile(_write(tmp_path, data, "full.gguf"))
    end = full.data_offset + sum(t.data.size for t in full.tensors)
    for cut in range(0, end, 13):
        with pytest.raises(GGUFError):
            open_gguf(_write(tmp_path, data[:cut], "cut.gguf"))


# ------------------------------------------------------------------ regressions: Hugging Face config.json
def _hf_folder(tmp_path, config) -> str:
    folder = tmp_path / "hf"
    folder.mkdir(exist_ok=True)
    (folder / "model.safetensors").write_bytes(fz.tiny_hf_safetensors())
    (folder / "config.json").write_bytes(config if isinstance(config, bytes) else json.dumps(config).encode())
    return str(folder)


def test_hf_seed_config_loads_and_runs(tmp_path):
    """The refusals below are of a folder that otherwise loads: the tiny LLaMA's attention rows
    are probability distributions over the causal prefix."""
    import sinklab as sl

    m = sl.load(_hf_folder(tmp_path, fz._tiny_hf_config()))
    attn = m.run(np.array([1, 5, 2, 7]), capture="attn", progress=False).attn
    assert attn.shape == (1, 2, 4, 4) and np.allclose(attn.sum(-1), 1, atol=1e-6)
    assert np.all(np.triu(attn[0, 0], 1) == 0)


HUGE = 1 << 62


@pytest.mark.parametrize("changes", [
    {"hidden_size": [8]},                                   # was TypeError: int() of a list
    {"num_attention_heads": {"a": 1}},                      # was TypeError
    {"num_hidden_layers": HUGE},                            # was a hang listing 2^62 layers' tensor names
    {"num_hidden_layers": 1 << 40},                         # (the C int bound: each size < 2^31)
    {"vocab_size": -16},
    {"intermediate_size": 1e308},                           # was OverflowError
    {"max_position_embeddings": -5},
    {"rope_theta": float("nan")},                           # was accepted: NaN RoPE frequencies
    {"rope_theta": {"x": 1}},                               # was TypeError: float() of a dict
    {"rope_theta": -10000.0},
    {"rms_norm_eps": [1e-5]},                               # was TypeError
    {"rope_parameters": 5, "rope_theta": None},             # was AttributeError: 'int' has no .get
    {"rope_scaling": [1, 2]},                               # was TypeError: dict() of a list
    {"rope_scaling": {"rope_type": "linear", "factor": float("nan")}},
    {"rope_scaling": {"rope_type": "linear", "factor": "8"}},   # was TypeError deep in RoPE
    {"rope_scaling": {"rope_type": "linear"}},
    {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 16}},  # was 0/0: NaN frequencies
    {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
    {"rope_scaling": {"rope_type": ["llama3"]}},
    {"model_type": "mistral", "sliding_window": 4, "num_hidden_layers": 1 << 40},  # was an 8 TB tuple (ASan)
    {"model_type": "gemma3_text", "sliding_window": 4, "num_hidden_layers": 1 << 31, "layer_types": None},
    {"model_type": "mistral", "sliding_window": 1e308},     # was OverflowError in the C core's model_new
    {"model_type": "mistral", "sliding_window": [4]},       # was TypeError
    {"model_type": "gemma3_text", "layer_types": 7},        # was TypeError: len() of an int
    {"model_type": "nonexistent"},
    {"model_type": ["llama"]},
    {"eos_token_id": {"a": 1}},                             # was TypeError
    {"bos_token_id": "one"},
    {"hidden_size": None},                                  # a missing key: KeyError naming it
])
def test_hf_config_fuzz_regressions(changes, tmp_path):
    import time

    import sinklab as sl

    folder = _hf_folder(tmp_path, fz._tiny_hf_config(**changes))  # a None value drops the key
    t0 = time.perf_counter()
    with pytest.raises(KeyError if changes == {"hidden_size": None} else ValueError):
        sl.load(folder)
    assert time.perf_counter() - t0 < 2.0


@pytest.mark.parametrize("content", [b"[" * 100000 + b"]" * 100000,           # was RecursionError
                                     b'{"model_type": "llama", "hidden_size": ' + b"9" * 5000 + b"}",
                                     b"\xff\xfe\x00{", b"", b"[]", b"NaN"])
def test_hf_config_json_that_breaks_the_decoder(content, tmp_path):
    from sinklab.io.hf_loader import read_config

    with pytest.raises(ValueError):
        read_config(_hf_folder(tmp_path, content))


def test_hf_shard_index_naming_a_file_outside_the_folder_is_refused(tmp_path):
    import sinklab as sl

    folder = _hf_folder(tmp_path, fz._tiny_hf_config())
    Path(folder, "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "../x.safetensors"}}))
    with pytest.raises(ValueError, match="plain file names"):
        sl.load(folder)
    Path(folder, "model.safetensors.index.json").write_text(json.dumps({"weight_map": [1]}))
    with pytest.raises(ValueError, match="weight_map"):
        sl.load(folder)


def test_gguf_block_count_of_2_31_is_refused_fast(tmp_path):
    """A GGUF stating 2^31 - 1 layers is refused before the names of its layers are listed
    (was minutes of CPU and GBs of memory)."""
    import time

    import sinklab as sl

    data, fields = fz.tiny_model_gguf()
    needle = b"llama.block_count" + struct.pack("<I", 4)
    i = data.index(needle) + len(needle)
    assert struct.unpack("<I", data[i:i + 4]) == (1,)
    for count in (2 ** 31 - 1, 2 ** 32 - 1, 7):
        path = _write(tmp_path, data[:i] + struct.pack("<I", count) + data[i + 4:], "m.gguf")
        t0 = time.perf_counter()
        with pytest.raises(GGUFError, match=f"states {count} layers"):
            sl.load(path)
        assert time.perf_counter() - t0 < 2.0
    # with a sliding window, the family built a (count,)-long tuple of windows before any check
    windowed = fz.gguf_bytes([("general.architecture", 8, "llama"), ("llama.block_count", 4, 2 ** 32 - 1),
                              ("llama.attention.sliding_window", 4, 4)], [])[0]
    with pytest.raises(GGUFError, match="layers"):
        sl.load(_write(tmp_path, windowed, "w.gguf"))
    assert sl.load(_write(tmp_path, data, "ok.gguf")).config.n_layers == 1


@pytest.mark.parametrize("kw,match", [
    ({"rope_theta": float("inf")}, "rope_theta"),
    ({"rope_theta": "10000"}, "rope_theta"),
    ({"norm_eps": "1e-5"}, "norm_eps"),                     # was TypeError in math.isfinite
    ({"attn_softcap": float("nan")}, "attn_softcap"),
    ({"window": 5}, "window"),                              # was TypeError: int is not iterable
    ({"window": (2 ** 40,)}, "window"),
    ({"d_model": 2 ** 31}, "d_model"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 0}}, "factor"),
    ({"rope_local_scaling": "linear"}, "rope_local_scaling"),
    ({"layer_norms": 5}, "layer_norms"),
])
def test_model_config_refuses_values_of_the_wrong_type_or_range(kw, match):
    from sinklab.families.config import ModelConfig

    base = dict(arch="llama", n_layers=1, n_heads=2, n_kv_heads=1, d_model=8, head_dim=4, d_ff=16, vocab_size=16,
                context_length=32, rope_theta=10000.0, norm_eps=1e-5, tied_embeddings=False)
    ModelConfig(**base)
    with pytest.raises(ValueError, match=match):
        ModelConfig(**{**base, **kw})
