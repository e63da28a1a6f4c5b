#!/usr/bin/env python
"""Prompt processing (prefill): sinklab fp32 vs llama.cpp (llama-cpp-python), same GGUF, same threads.

What is timed, per prompt length T and thread count n (the prompt is one batch for both):
  sinklab      sl.set_num_threads(n); model.run(ids, capture="logits", logits_from=-1)
               (the SmolLM2-135M-Instruct Q4_1 GGUF, dequantised to fp32 at load)
  llama-q4_1   Llama(Q4_1 file, n_threads=n_threads_batch=n, n_ctx=n_batch=n_ubatch=T,
               logits_all=False, flash_attn=True); reset() then eval(ids): the KV cache is cleared
               before each run, the logits of the last position only are computed. Flash attention
               is on by default (--flash-attn off turns it off): it was llama.cpp's faster setting
               here, and llama.cpp's own default (flash_attn auto) enables it where the backend
               supports it, while llama-cpp-python's default is off. The KV cache is llama.cpp's default, F16.
  llama-f32    the same on an F32 GGUF made from the Q4_1 file (every tensor dequantised with
               gguf.quants.dequantize and written as F32, all metadata kept), cached next to the
               Q4_1 file in $SINKLAB_HOME/models as SmolLM2-135M-Instruct.F32-from-Q4_1.gguf and
               created by this script when missing
  llama-f32-kv32  the F32 file with an F32 KV cache and without flash attention: llama.cpp's
               all-fp32 configuration (its CPU flash attention rounds to F16 even with an F32
               cache), the one whose logits sinklab should match to ~1e-4; --no-kv32 skips it
The ids are real text (BOS + shipped Jane Austen passages, tokenized by sinklab), the same ids for
every contender. All contenders live in ONE process and are timed alternately (the order rotates
every repeat) after one warm-up call each; both libraries release the GIL and run OpenMP. Reported:
the median and minimum wall time, tokens/s, and the speed-up t_llama / t_sinklab (> 1: sinklab
is faster) against the issue's goals (>= 3x llama.cpp Q4_1, >= 1.5x llama.cpp F32).

Correctness is printed next to the timings: the last-position logits max |diff| between sinklab
and llama.cpp on the F32 file (the same fp32 weights; llama.cpp stores K and V in an F16 cache by
default and its flash attention rounds to F16, so it is close to but not exactly fp32; with
--kv32, the default, the all-fp32 configuration is compared too), and against
llama.cpp on the Q4_1 file (llama.cpp quantises the activations to Q8 blocks for Q4_1 dot
products, so that one is not fp32-exact at all). The F32 file is checked too: sinklab loaded from
it must give the logits of sinklab loaded from the Q4_1 file.

Usage:
  python benchmarks/bench_llamacpp.py [--quick] [--low] [--seq 128,512,2048] [--threads 1,2]
                                      [--repeats 5] [--repeats-long 3] [--flash-attn on|off]
                                      [--no-kv32] [--json OUT.json]
  --quick = --seq 128 --threads 1 --repeats 3.
Needs llama-cpp-python built on this machine (benchmarks/requirements-llamacpp.txt) and the model
fetched by sinklab (sl.load("smollm2-135m-instruct") fetches it into the sinklab cache).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List

import numpy as np
from machine import cpu_name

# run from a checkout without installing: the package sits one folder up
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

MODEL_NAME = "smollm2-135m-instruct"
F32_SUFFIX = ".F32-from-Q4_1.gguf"
GOALS = {"llama-q4_1": 3.0, "llama-f32": 1.5, "llama-f32-kv32": 1.5}  # issue 9: sinklab speed-up


# ------------------------------------------------------------------------------- the machine

def lscpu_model_flags() -> Dict[str, str]:
    """lscpu's "Model name" and "Flags" lines (empty strings when lscpu is missing)."""
    out = {"model": cpu_name(), "flags": ""}
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return out
    for line in text.splitlines():
        key, _, val = line.partition(":")
        if key.strip() == "Model name":
            out["model"] = val.strip()
        elif key.strip() == "Flags":
            out["flags"] = val.strip()
    return out


def simd_flags(flags: str) -> str:
    """The SIMD subset of the CPU flags (avx*, fma, f16c, amx*): what matters for these kernels."""
    keep = [f for f in flags.split() if f.startswith(("avx", "amx")) or f in ("fma", "f16c", "sse4_2")]
    return " ".join(keep)


def load_avg() -> str:
    """The 1/5/15-minute load averages, as `uptime` prints them."""
    return "%.2f, %.2f, %.2f" % os.getloadavg()


# ----------------------------------------------------------------------------- the F32 GGUF

def f32_path_for(q4_path: Path) -> Path:
    """Where the F32 copy of a Q4_1 GGUF lives: next to it, with a stable name."""
    name = q4_path.name
    stem = name[: -len(".Q4_1.gguf")] if name.endswith(".Q4_1.gguf") else name[: -len(".gguf")]
    return q4_path.with_name(stem + F32_SUFFIX)


def convert_to_f32(src: Path, dst: Path) -> None:
    """Writes ``dst``: every tensor of ``src`` dequantised to F32, every metadata field kept.

    Only ``general.file_type`` changes (to ALL_F32) so that llama.cpp describes the file
    correctly. Tensors are dequantised one at a time with gguf's reference dequantiser (streamed,
    never the whole model in memory) and written to ``dst + ".part"``, which is renamed into
    place only when complete, so an interrupted run never leaves a truncated file at ``dst``.
    """
    import gguf

    reader = gguf.GGUFReader(str(src))
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    part = dst.with_name(dst.name + ".part")
    writer = gguf.GGUFWriter(str(part), arch)
    align = reader.get_field(gguf.Keys.General.ALIGNMENT)
    if align is not None:  # keep the source's tensor alignment, not only its key
        writer.data_alignment = int(align.contents())
    for field in reader.fields.values():
        # the writer adds the architecture itself; GGUF.* are the reader's header pseudo-fields
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        if field.name == gguf.Keys.General.FILE_TYPE:
            writer.add_file_type(gguf.LlamaFileType.ALL_F32)
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub)
    if reader.get_field(gguf.Keys.General.FILE_TYPE) is None:
        writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    for t in reader.tensors:
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))  # ggml ne -> numpy (row-major) order
        writer.add_tensor_info(t.name, shape, np.dtype(np.float32), int(np.prod(shape)) * 4,
                               raw_dtype=gguf.GGMLQuantizationType.F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in reader.tensors:
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))
        w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False).reshape(shape)
        writer.write_tensor_data(np.ascontiguousarray(w))
    writer.close()
    os.replace(part, dst)


def ensure_q8_0(f32_path: Path) -> Path:
    """A Q8_0 GGUF next to the F32 one, made by llama.cpp's own quantizer (llama_model_quantize)
    when missing: the file llama.cpp's Q8_0 rows and sinklab's int8-on-Q8_0 rows both read."""
    import llama_cpp

    dst = f32_path.with_name(f32_path.name.replace(F32_SUFFIX, ".Q8_0-from-F32.gguf"))
    if dst.exists() and dst.stat().st_mtime >= f32_path.stat().st_mtime:
        return dst
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0
    tmp = dst.with_suffix(".tmp")
    rc = llama_cpp.llama_model_quantize(str(f32_path).encode(), str(tmp).encode(), params)
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize failed ({rc}) on {f32_path}")
    os.replace(tmp, dst)
    return dst


def ensure_f32(q4_path: Path) -> Path:
    """The F32 copy of ``q4_path``, created first when missing (or older than the Q4_1 file)."""
    dst = f32_path_for(q4_path)
    if not dst.exists() or dst.stat().st_mtime < q4_path.stat().st_mtime:
        print(f"writing {dst} (F32 copy of {q4_path.name}) ...", flush=True)
        t0 = time.perf_counter()
        convert_to_f32(q4_path, dst)
        print(f"  done in {time.perf_counter() - t0:.1f} s, {dst.stat().st_size / 2**20:.0f} MiB", flush=True)
    return dst


# ------------------------------------------------------------------------------- contenders

def text_ids(model, T: int) -> np.ndarray:
    """(T,) int64: BOS + the shipped passages joined by spaces, tokenized by sinklab, cut at T."""
    from sinklab.prompts import load_passages

    passages, ids = load_passages("all"), None
    for k in range(1, len(passages) + 1):
        ids = model.tokenize(" ".join(passages[:k]), bos=True)
        if len(ids) >= T:
            return np.ascontiguousarray(ids[:T], dtype=np.int64)
    raise ValueError(f"the shipped passages give only {len(ids)} tokens, fewer than T={T}")


class LlamaRunner:
    """One llama.cpp context whose single batch holds the whole prompt of T tokens."""

    def __init__(self, path: Path, T: int, threads: int, kv_f32: bool = False, flash_attn: bool = False):
        import llama_cpp

        kw = dict(model_path=str(path), n_ctx=T, n_batch=T, n_ubatch=T, n_threads=threads,
                  n_threads_batch=threads, logits_all=False, flash_attn=flash_attn, verbose=False, seed=0)
        if kv_f32:
            kw.update(type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32)
        self.llm = llama_cpp.Llama(**kw)
        self.n_vocab = self.llm.n_vocab()

    def __call__(self, ids: List[int]) -> np.ndarray:
        """Prefill of ``ids`` from an empty KV cache; returns the last position's logits (V,)."""
        import llama_cpp

        self.llm.reset()  # n_tokens = 0: eval() then drops every cached position before decoding
        self.llm.eval(ids)
        # with logits_all=False only the last position has logits, and eval() no longer copies
        # them into llm.scores: read them from the context (index -1 = last output row)
        ptr = llama_cpp.llama_get_logits_ith(self.llm.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).astype(np.float32)

    def close(self) -> None:
        self.llm.close()


def sinklab_runner(sl, model, threads: int, precision: str = "fp32") -> Callable[[np.ndarray], np.ndarray]:
    """A call that sets sinklab's thread count and returns the last position's logits (V,)."""
    def run(ids: np.ndarray) -> np.ndarray:
        sl.set_num_threads(threads)
        tr = model.run(ids, capture="logits", logits_from=-1, progress=False, precision=precision)
        return np.asarray(tr.logits).reshape(-1)
    return run


def time_alternating(runners: Dict[str, Callable], args: Dict[str, object], repeats: int):
    """Wall times (s) per contender: one warm-up each, then ``repeats`` rounds whose order rotates
    (so no contender always runs right after the same other one). Returns (times, last outputs)."""
    names = list(runners)
    outs = {n: runners[n](args[n]) for n in names}  # warm-up: first-touch of buffers, thread pools
    times: Dict[str, List[float]] = {n: [] for n in names}
    for r in range(repeats):
        k = r % len(names)
        for n in names[k:] + names[:k]:
            t0 = time.perf_counter()
            outs[n] = runners[n](args[n])
            times[n].append(time.perf_counter() - t0)
    return times, outs


# ------------------------------------------------------------------------------------- main

def versions(sl) -> Dict[str, str]:
    import llama_cpp
    from importlib.metadata import version

    return {"python": platform.python_version(), "numpy": np.__version__, "sinklab": sl.__version__,
            "sinklab_simd": sl.simd(), "llama_cpp_python": llama_cpp.__version__,
            "gguf": version("gguf")}


def llama_system_info() -> str:
    import llama_cpp

    info = llama_cpp.llama_print_system_info()
    return info.decode() if isinstance(info, bytes) else str(info)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="the Q4_1 GGUF (default: fetch smollm2-135m-instruct)")
    ap.add_argument("--seq", default="128,512,2048")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--repeats-long", type=int, default=3, help="repeats for T >= 2048")
    ap.add_argument("--flash-attn", choices=["on", "off"], default="on",
                    help="llama.cpp flash attention for llama-q4_1 and llama-f32 (default on)")
    ap.add_argument("--no-kv32", dest="kv32", action="store_false",
                    help="skip llama-f32-kv32 (F32 file, F32 KV cache, no flash attention)")
    ap.add_argument("--quick", action="store_true", help="T=128, 1 thread, 3 repeats: a fast check")
    ap.add_argument("--low", action="store_true",
                    help="also sinklab bf16 and int8 (on the Q4_1 file) and a Q8_0 pair: llama.cpp and sinklab int8 "
                         "on a Q8_0 GGUF that llama.cpp's own quantizer makes from the F32 file")
    ap.add_argument("--json", default=None, help="write every measurement here")
    a = ap.parse_args()
    if a.quick:
        a.seq, a.threads, a.repeats = "128", "1", min(a.repeats, 3)
    seqs = [int(s) for s in a.seq.split(",") if s]
    threads = [int(s) for s in a.threads.split(",") if s]

    try:
        import llama_cpp  # noqa: F401  (fail early, before the F32 conversion, when it is missing)
    except ImportError:
        print("llama-cpp-python is not installed: pip install -r benchmarks/requirements-llamacpp.txt "
              "(it builds llama.cpp from source on this machine)", file=sys.stderr)
        return 2
    import sinklab as sl
    from sinklab.io import registry

    q4 = Path(a.model) if a.model else registry.fetch(MODEL_NAME)
    f32 = ensure_f32(q4)

    cpu = lscpu_model_flags()
    info = {"argv": sys.argv[1:], "flash_attn": a.flash_attn, "cpu": cpu["model"],
            "simd_flags": simd_flags(cpu["flags"]), "load_start": load_avg(),
            "cores": os.cpu_count(), "versions": versions(sl), "llama_system_info": llama_system_info(),
            "q4_1_file": str(q4), "f32_file": str(f32)}
    print(f"CPU: {info['cpu']} ({info['cores']} logical cores)")
    print(f"SIMD flags: {info['simd_flags']}")
    print(f"versions: {json.dumps(info['versions'])}")
    print(f"llama.cpp system info: {info['llama_system_info']}")
    print(f"Q4_1 file: {q4}\nF32 file:  {f32}")
    print(f"load average at start: {info['load_start']}", flush=True)

    model = sl.load(str(q4), quiet=True)
    if a.low:
        q8 = ensure_q8_0(f32)
        model_q8 = sl.load(str(q8), quiet=True)
        print(f"Q8_0 file: {q8}")
    results = []

    # the F32 file holds the same weights: sinklab must give the same logits from either file
    ids = text_ids(model, min(seqs))
    ref = sinklab_runner(sl, model, threads[0])(ids)
    m32 = sl.load(str(f32), quiet=True)
    same_w = sorted(m32.weights) == sorted(model.weights) and all(
        np.array_equal(np.asarray(m32.weights[k]), np.asarray(model.weights[k])) for k in model.weights)
    d = float(np.max(np.abs(sinklab_runner(sl, m32, threads[0])(ids) - ref)))
    del m32
    print(f"F32 file check: sinklab's fp32 weights from the two files bitwise equal: {same_w}; "
          f"last logits max|diff| = {d:.3g} (T={len(ids)})", flush=True)
    info["f32_file_weights_equal"], info["f32_file_logits_max_abs_diff"] = same_w, d

    for T in seqs:
        ids = text_ids(model, T)
        id_list = [int(x) for x in ids]
        reps = a.repeats_long if T >= 2048 else a.repeats
        for n in threads:
            runners: Dict[str, Callable] = {"sinklab": sinklab_runner(sl, model, n)}
            if a.low:
                runners["sinklab-bf16"] = sinklab_runner(sl, model, n, "bf16")
                runners["sinklab-int8"] = sinklab_runner(sl, model, n, "int8")
                runners["sinklab-int8-q8_0"] = sinklab_runner(sl, model_q8, n, "int8")
            fa = a.flash_attn == "on"
            llamas = {"llama-q4_1": LlamaRunner(q4, T, n, flash_attn=fa),
                      "llama-f32": LlamaRunner(f32, T, n, flash_attn=fa)}
            if a.low:
                llamas["llama-q8_0"] = LlamaRunner(q8, T, n, flash_attn=fa)
            if a.kv32:
                llamas["llama-f32-kv32"] = LlamaRunner(f32, T, n, kv_f32=True, flash_attn=False)
            runners.update(llamas)
            inputs = {k: (ids if k.startswith("sinklab") else id_list) for k in runners}
            load_before = load_avg()
            times, outs = time_alternating(runners, inputs, reps)
            for L in llamas.values():
                L.close()
            t_sl = statistics.median(times["sinklab"])
            row = {"T": T, "threads": n, "repeats": reps, "load_before": load_before,
                   "load_after": load_avg(),
                   "median_s": {k: statistics.median(v) for k, v in times.items()},
                   "min_s": {k: min(v) for k, v in times.items()}, "times_s": times}
            print(f"\nT={T} threads={n} repeats={reps} (load {load_before} -> {row['load_after']})")
            print(f"  {'contender':16s} {'median s':>9s} {'min s':>8s} {'tok/s':>8s} {'speed-up':>9s}  goal")
            for k in runners:
                med = row["median_s"][k]
                line = f"  {k:16s} {med:9.4f} {row['min_s'][k]:8.4f} {T / med:8.0f}"
                if k in llamas:
                    su = med / t_sl
                    row.setdefault("speedup", {})[k] = su
                    goal = GOALS.get(k)
                    line += f" {su:8.2f}x" + (f"  >= {goal}x {'met' if su >= goal else 'NOT met'}" if goal else "")
                print(line)
            if a.low:   # issue 24: sinklab int8 >= 1.0x llama.cpp on the same quantized file
                pairs = {"int8 vs llama-q4_1": ("sinklab-int8", "llama-q4_1"),
                         "int8 vs llama-q8_0": ("sinklab-int8-q8_0", "llama-q8_0"),
                         "bf16 vs llama-f32": ("sinklab-bf16", "llama-f32")}
                for label, (mine, theirs) in pairs.items():
                    su = row["median_s"][theirs] / row["median_s"][mine]
                    row.setdefault("speedup_low", {})[label] = su
                    print(f"  sinklab {label}: {su:.2f}x (t_llama / t_sinklab)")
            for k in list(llamas) + [k for k in runners if k.startswith("sinklab-")]:
                dk = float(np.max(np.abs(outs[k] - outs["sinklab"])))
                row.setdefault("logits_max_abs_diff_vs_sinklab", {})[k] = dk
                lo, hi = float(outs["sinklab"].min()), float(outs["sinklab"].max())
                print(f"  last logits max|diff| sinklab vs {k}: {dk:.3g} (logits range {lo:.1f} .. {hi:.1f})")
            results.append(row)
            sys.stdout.flush()

    info["load_end"] = load_avg()
    print(f"\nload average at end: {info['load_end']}")
    print("note: llama.cpp on Q4_1 quantises activations to Q8 blocks for its dot products; llama-q4_1")
    print("      and llama-f32 keep K/V in an F16 cache (and flash attention rounds to F16), so they are not")
    print("      fp32 throughout; llama-f32-kv32 (F32 cache, no flash attention) is. sinklab runs fp32.")
    print("\nsummary: speed-up of sinklab (median t_llama / t_sinklab)")
    print(f"  {'T':>5s} {'threads':>7s} " + " ".join(f"{k:>15s}" for k in results[0]["speedup"]))
    for row in results:
        cells = " ".join(f"{v:14.2f}x" for v in row["speedup"].values())
        print(f"  {row['T']:5d} {row['threads']:7d} {cells}")
    if a.low:
        print("\nsummary: sinklab at low precision against llama.cpp on the same file (t_llama / t_sinklab)")
        print(f"  {'T':>5s} {'threads':>7s} " + " ".join(f"{k:>20s}" for k in results[0]["speedup_low"]))
        for row in results:
            print(f"  {row['T']:5d} {row['threads']:7d} " + " ".join(f"{v:19.2f}x" for v in row["speedup_low"].values()))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"info": info, "results": results}, f, indent=1)
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
