"""A synthetic GGUF of LLaMA 3.1 8B's shape in Q4_K_M's type mix, and the Table 1 sink study on it:
can a user with an 8B Q4_K_M file run the study in < 8 GB of memory?

    python benchmarks/make_synthetic_gguf.py --out /tmp/llama8b-synth.gguf          # write (~4.7 GB)
    python benchmarks/make_synthetic_gguf.py --out /tmp/llama8b-synth.gguf --study  # write if absent, study
    python benchmarks/make_synthetic_gguf.py --out /tmp/llama8b-synth.gguf --study --delete
    python benchmarks/make_synthetic_gguf.py --smoke                                # tiny shape, end to end

The file: architecture ``llama``, 32 layers, d 4096, 32 heads (8 kv heads, head_dim 128),
F 14336, vocabulary 128256, context 131072, RoPE base 500000 with LLaMA 3.1's llama3 scaling
stored as llama.cpp does (``rope_freqs.weight``, divisors per frequency: factor 8, low/high
frequency factors 1/4, original context 8192). Types as llama.cpp's Q4_K_M: Q4_K for the
embedding and most matrices; Q6_K for the output head and for attn_v / ffn_down in the layers
llama.cpp's ``use_more_bits`` picks (the first and last eighth and every third between: 16 of
32); norms F32. Blocks are random but valid: random 4/6-bit quants and sub-block scales with a
fixed small fp16 super-block scale (weights of standard deviation ~0.02, as at initialisation),
so every activation stays finite. The tokenizer is a minimal LLaMA-3-style byte-level BPE
(``gpt2`` model, ``llama-bpe`` pre-tokenizer): the 256 byte tokens, 20 merges, unreachable filler
tokens up to id 127999 and 256 control tokens (``<|begin_of_text|>`` = 128000, the BOS). Every
tensor is streamed to disk in chunks of at most 64 MB (the writer never holds the file).

``--study`` runs, in a fresh subprocess, what Table 1 measures: ``sinklab.load`` the file, then
``sink_study(model, T=64, eps=(0.3, 0.8))`` over the shipped passages (split "sinks", 144; with
BOS), and reports the sink rates, the wall time of load and study, and the subprocess's peak
resident memory (VmHWM, also ru_maxrss of the child) against the 8 GB budget. Weights are random,
so the sink rates say nothing about LLaMA; memory and speed are what this measures.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np

LLAMA31_8B = dict(n_layers=32, d_model=4096, n_heads=32, n_kv_heads=8, d_ff=14336, vocab=128256,
                  context=131072, rope_theta=500000.0, norm_eps=1e-5)
SMOKE = dict(n_layers=4, d_model=256, n_heads=4, n_kv_heads=2, d_ff=512, vocab=2048,
             context=4096, rope_theta=500000.0, norm_eps=1e-5)
LLAMA3_SCALING = dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192)
N_SPECIAL = 256          # LLaMA 3's control tokens at the top of the vocabulary
CHUNK_BYTES = 64 << 20   # most bytes generated and written at once
BUDGET = 8e9             # the memory target for the study
Q4_K, Q6_K = 12, 14      # ggml type ids
BLOCK = {Q4_K: (256, 144), Q6_K: (256, 210)}  # (elements, bytes) per block
# fp16 super-block scales: weight std ~0.02 (see _blocks); fp16 normal numbers, so finite and exact
Q4K_D, Q4K_DMIN = 7.6e-5, 7.5 * 7.6e-5  # dmin = 7.5 d centres q*sc - m*7.5 on average
Q6K_D, Q6K_SCALE = 1.1e-4, 16           # int8 sub-block scales in [-16, 16]
MERGES = [("Ġ", "t"), ("h", "e"), ("i", "n"), ("r", "e"), ("o", "n"), ("Ġt", "he"), ("e", "r"), ("Ġ", "a"),
          ("a", "n"), ("Ġ", "s"), ("Ġ", "o"), ("Ġ", "w"), ("e", "n"), ("a", "t"), ("o", "r"), ("i", "s"),
          ("e", "s"), ("Ġ", "c"), ("i", "t"), ("a", "l")]


# ----------------------------------------------------------------------------- shapes and types
def use_more_bits(layer: int, n_layers: int) -> bool:
    """llama.cpp's choice of the layers whose attn_v / ffn_down get Q6_K in Q4_K_M."""
    return layer < n_layers // 8 or layer >= 7 * n_layers // 8 or (layer - n_layers // 8) % 3 == 2


def tensor_plan(s: Dict) -> List[Tuple[str, Tuple[int, ...], int]]:
    """(GGUF name, numpy shape (out, in), ggml type) of every tensor, in file order."""
    d, F, V, hd = s["d_model"], s["d_ff"], s["vocab"], s["d_model"] // s["n_heads"]
    kv = s["n_kv_heads"] * hd
    plan = [("token_embd.weight", (V, d), Q4_K), ("rope_freqs.weight", (hd // 2,), 0)]
    for l in range(s["n_layers"]):
        big = Q6_K if use_more_bits(l, s["n_layers"]) else Q4_K
        plan += [(f"blk.{l}.attn_norm.weight", (d,), 0), (f"blk.{l}.attn_q.weight", (d, d), Q4_K),
                 (f"blk.{l}.attn_k.weight", (kv, d), Q4_K), (f"blk.{l}.attn_v.weight", (kv, d), big),
                 (f"blk.{l}.attn_output.weight", (d, d), Q4_K), (f"blk.{l}.ffn_norm.weight", (d,), 0),
                 (f"blk.{l}.ffn_gate.weight", (F, d), Q4_K), (f"blk.{l}.ffn_up.weight", (F, d), Q4_K),
                 (f"blk.{l}.ffn_down.weight", (d, F), big)]
    return plan + [("output_norm.weight", (d,), 0), ("output.weight", (V, d), Q6_K)]


def nbytes_of(shape: Tuple[int, ...], qtype: int) -> int:
    if qtype == 0:
        return 4 * int(np.prod(shape))
    elems, nb = BLOCK[qtype]
    return int(np.prod(shape)) // elems * nb


def llama3_rope_factors(head_dim: int, theta: float, sc: Dict) -> np.ndarray:
    """rope_freqs.weight as llama.cpp's convert_hf_to_gguf.py writes it for llama3 scaling."""
    factor, low, high = sc["factor"], sc["low_freq_factor"], sc["high_freq_factor"]
    old = sc["original_max_position_embeddings"]
    out = []
    for freq in 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim)):
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, np.float32)


# ----------------------------------------------------------------------------- random blocks
def _blocks(rng: np.random.Generator, qtype: int, n_blocks: int) -> np.ndarray:
    """(n_blocks * block_bytes,) uint8 of random valid blocks.

    Q4_K: w = d*sc*q - dmin*m with q in 0..15 and 6-bit sc, m (random bytes); E[w] = 0 with
    dmin = 7.5 d, std ~ 263 d = 0.02. Q6_K: w = d*sc*(q - 32), q in 0..63, sc in [-16, 16];
    std ~ 181 d = 0.02."""
    nb = BLOCK[qtype][1]
    b = np.frombuffer(rng.bytes(n_blocks * nb), np.uint8).reshape(n_blocks, nb).copy()
    if qtype == Q4_K:
        b[:, 0:4] = np.array([Q4K_D, Q4K_DMIN], np.float16).view(np.uint8)
    else:
        b[:, 192:208] = rng.integers(-Q6K_SCALE, Q6K_SCALE + 1, size=(n_blocks, 16), dtype=np.int8).view(np.uint8)
        b[:, 208:210] = np.array([Q6K_D], np.float16).view(np.uint8)
    return b.reshape(-1)


def _chunks(rng: np.random.Generator, name: str, shape: Tuple[int, ...], qtype: int, s: Dict):
    """The tensor's bytes in pieces of at most CHUNK_BYTES."""
    if qtype == 0:
        if name == "rope_freqs.weight":
            yield llama3_rope_factors(shape[0] * 2, s["rope_theta"], LLAMA3_SCALING)
        else:
            yield np.ones(shape, np.float32)  # RMSNorm gains of 1, as at initialisation
        return
    elems, nb = BLOCK[qtype]
    total = int(np.prod(shape)) // elems
    step = max(1, CHUNK_BYTES // nb)
    for b0 in range(0, total, step):
        yield _blocks(rng, qtype, min(step, total - b0))


# ----------------------------------------------------------------------------- tokenizer
def _byte_tokens() -> List[str]:
    """GPT-2's byte-to-unicode alphabet, in byte order (LLaMA 3 spells bytes the same way)."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs))
    return [chr(table[b]) for b in range(256)]


def tokenizer_fields(vocab: int) -> Dict:
    """tokens, token types, merges and BOS/EOS ids of the minimal LLaMA-3-style tokenizer."""
    tokens = _byte_tokens() + [a + b for a, b in MERGES]
    n_normal = vocab - N_SPECIAL
    tokens += [f"<filler_{i}>" for i in range(len(tokens), n_normal)]
    special = (["<|begin_of_text|>", "<|end_of_text|>"]
               + [f"<|reserved_special_token_{i}|>" for i in range(N_SPECIAL - 2)])
    types = [1] * n_normal + [3] * N_SPECIAL  # NORMAL, CONTROL
    return dict(tokens=tokens + special, types=types, merges=[f"{a} {b}" for a, b in MERGES],
                bos=n_normal, eos=n_normal + 1)


# ----------------------------------------------------------------------------- writer
def write(path: Path, s: Dict, seed: int = 0, quiet: bool = False) -> Dict:
    """Streams the synthetic GGUF to ``path``; returns {"bytes", "seconds", "types"}."""
    import gguf

    t0 = time.perf_counter()
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("synthetic LLaMA-3.1-8B-shaped Q4_K_M (random weights)")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    w.add_context_length(s["context"])
    w.add_embedding_length(s["d_model"])
    w.add_block_count(s["n_layers"])
    w.add_feed_forward_length(s["d_ff"])
    w.add_head_count(s["n_heads"])
    w.add_head_count_kv(s["n_kv_heads"])
    w.add_rope_freq_base(s["rope_theta"])
    w.add_rope_dimension_count(s["d_model"] // s["n_heads"])
    w.add_layer_norm_rms_eps(s["norm_eps"])
    w.add_vocab_size(s["vocab"])
    tok = tokenizer_fields(s["vocab"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    w.add_token_list(tok["tokens"])
    w.add_token_types(tok["types"])
    w.add_token_merges(tok["merges"])
    w.add_bos_token_id(tok["bos"])
    w.add_eos_token_id(tok["eos"])
    w.add_add_bos_token(True)
    plan = tensor_plan(s)
    for name, shape, qtype in plan:
        if qtype == 0:
            w.add_tensor_info(name, shape, np.dtype(np.float32), nbytes_of(shape, qtype))
        else:  # byte shape (rows, row bytes); the writer turns it into the element shape
            w.add_tensor_info(name, (shape[0], nbytes_of(shape, qtype) // shape[0]), np.dtype(np.uint8),
                              nbytes_of(shape, qtype), raw_dtype=gguf.GGMLQuantizationType(qtype))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    fout = w.fout[0]
    rng = np.random.default_rng(seed)
    types: Dict[str, int] = {}
    for i, (name, shape, qtype) in enumerate(plan):
        # what GGUFWriter.write_tensor_data does, one chunk at a time: align, data, pad
        w.write_padding(fout, fout.tell())
        n = 0
        for part in _chunks(rng, name, shape, qtype, s):
            part.tofile(fout)
            n += part.nbytes
        assert n == nbytes_of(shape, qtype), name
        w.write_padding(fout, n)
        tname = {0: "F32", Q4_K: "Q4_K", Q6_K: "Q6_K"}[qtype]
        types[tname] = types.get(tname, 0) + 1
        if not quiet and (i % 45 == 0 or i == len(plan) - 1):
            print(f"  wrote {i + 1}/{len(plan)} tensors, {fout.tell() / 1e9:.2f} GB", flush=True)
    w.close()
    return {"bytes": path.stat().st_size, "seconds": time.perf_counter() - t0, "types": types}


# ----------------------------------------------------------------------------- the study
def _status() -> Dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
                out[k] = int(v.split()[0]) * 1024
    return out


def study_child(path: str, n_prompts: Optional[int], T: int) -> Dict:
    """Runs in a fresh process: load, then Table 1's sink study; memory after each phase."""
    import sinklab as sl
    from sinklab.analysis.sinkset import sink_study
    from sinklab.prompts import load_passages

    t0 = time.perf_counter()
    m = sl.load(path, quiet=True)
    t_load = time.perf_counter() - t0
    after_load = _status()
    prompts = load_passages("sinks")[:n_prompts]
    t0 = time.perf_counter()
    st = sink_study(m, prompts, T=T, eps=(0.3, 0.8), bos=True, progress=False)
    t_study = time.perf_counter() - t0
    return {"model": repr(m), "threads": sl.get_num_threads(), "simd": sl.simd(), "T": T,
            "n_prompts": st.n_prompts, "sink_rate": {f"{e:g}": r for e, r in st.sink_rates.items()},
            "mean_a0": float(st.importance.mean()), "finite": bool(np.isfinite(st.importance).all()),
            "load_s": t_load, "study_s": t_study, "after_load": after_load, "after_study": _status()}


def run_study(path: Path, n_prompts: Optional[int], T: int) -> Dict:
    """study_child in a subprocess; adds its wall time and ru_maxrss (peak RSS of the child)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child-study", str(path), str(T)]
    if n_prompts:
        cmd += ["--prompts", str(n_prompts)]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"study failed ({' '.join(cmd)}):\n{r.stderr[-3000:]}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["wall_s"] = wall
    out["peak_rss"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # kB on Linux
    out["command"] = " ".join(cmd)
    return out


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="/tmp/llama8b-synth-q4_k_m.gguf")
    ap.add_argument("--study", action="store_true", help="run the Table 1 sink study on the file")
    ap.add_argument("--prompts", type=int, default=None, help="study: first N passages (default all 144)")
    ap.add_argument("--T", type=int, default=64)
    ap.add_argument("--overwrite", action="store_true", help="write even if --out exists")
    ap.add_argument("--delete", action="store_true", help="delete the file at the end")
    ap.add_argument("--smoke", action="store_true", help="a tiny model of the same layout (4 layers, d 256)")
    ap.add_argument("--json", default=None, help="write every number here")
    ap.add_argument("--child-study", nargs=2, metavar=("PATH", "T"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child_study:
        print(json.dumps(study_child(a.child_study[0], a.prompts, int(a.child_study[1]))))
        return 0
    s = SMOKE if a.smoke else LLAMA31_8B
    out = Path("/tmp/llama-synth-smoke.gguf" if a.smoke and a.out == ap.get_default("out") else a.out)
    result: Dict = {"shape": s, "path": str(out)}
    if a.overwrite or not out.exists():
        need = sum(nbytes_of(sh, q) for _, sh, q in tensor_plan(s))
        free = os.statvfs(out.parent).f_bavail * os.statvfs(out.parent).f_frsize
        if need > free - (1 << 30):
            raise SystemExit(f"{out.parent} has {free / 1e9:.1f} GB free; the file needs {need / 1e9:.1f} GB")
        print(f"writing {out} ({need / 1e9:.2f} GB of tensor data)", flush=True)
        result["write"] = write(out, s)
        print(f"wrote {result['write']['bytes'] / 1e9:.3f} GB in {result['write']['seconds']:.0f} s, "
              f"tensors by type {result['write']['types']}", flush=True)
    result["file_bytes"] = out.stat().st_size
    try:
        if a.study or a.smoke:
            st = run_study(out, a.prompts, a.T)
            result["study"] = st
            print(f"\n$ {st['command']}")
            print(f"{st['model']}\n{st['n_prompts']} prompts, T={st['T']}, threads {st['threads']}, simd {st['simd']}: "
                  f"sink rate eps=0.3 {100 * st['sink_rate']['0.3']:.2f}%, eps=0.8 {100 * st['sink_rate']['0.8']:.2f}% "
                  f"(random weights), mean a_0 {st['mean_a0']:.4f}, all finite: {st['finite']}")
            gb = lambda n: f"{n / 1e9:.2f} GB"  # noqa: E731
            al, af = st["after_load"], st["after_study"]
            print(f"file {gb(result['file_bytes'])}; after load RSS {gb(al['VmRSS'])} (anon {gb(al['RssAnon'])}, "
                  f"file-backed {gb(al['RssFile'])}), load peak {gb(al['VmHWM'])}; after the study RSS "
                  f"{gb(af['VmRSS'])} (anon {gb(af['RssAnon'])}, file-backed {gb(af['RssFile'])})")
            verdict = "OK" if st["peak_rss"] < BUDGET else "OVER"
            print(f"PEAK RSS {gb(st['peak_rss'])} (budget {gb(BUDGET)}: {verdict}); "
                  f"wall {st['wall_s']:.0f} s (load {st['load_s']:.0f} s, study {st['study_s']:.0f} s)")
    finally:
        if a.delete or a.smoke:
            out.unlink()
            print(f"deleted {out}")
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
