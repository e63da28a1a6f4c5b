"""Coverage-guided fuzzing (atheris, libFuzzer) of sinklab's parsers and of the C core behind
them: every input must end in a documented exception, never a crash, another exception type, a
hang or a huge allocation.

    python benchmarks/fuzz_atheris.py --parser all --runs 100000 --out /tmp/fz-atheris
    python benchmarks/fuzz_atheris.py --parser hfconfig --runs 2000 --max-seconds 5
    python benchmarks/fuzz_atheris.py --parser core --runs 100000 --out /tmp/fz-core
    LD_PRELOAD=$(gcc -print-file-name=libasan.so) ASAN_OPTIONS=detect_leaks=0 \\
        python benchmarks/fuzz_atheris.py --parser core --replay /tmp/fz-core/corpus-core  # ASan build

Parsers: those of ``tests/support/fuzz_parsers.py`` (CLI: ``benchmarks/fuzz_parsers.py``), with its targets and its documented
exceptions (:data:`fuzz_parsers.DOCUMENTED`, one place): ``gguf``, ``safetensors``,
``tokenizer``, ``checkpoint`` (the folder packed as one input: :func:`pack_files`), ``hfconfig``
(config.json of a Hugging Face folder next to a tiny LLaMA's model.safetensors: ``sinklab.load``
and a 4-token forward; ValueError or KeyError) and ``core`` (a GGUF of a whole tiny LLaMA with
F32/F16/Q8_0/Q4_0/Q4_1/Q6_K tensors: ``sinklab.load`` and a 4-token forward in the C core;
ValueError). Seeds: fuzz_parsers' seed files, the tiny model GGUF, and the cached SmolLM2 GGUF
shrunk to a few kB (:func:`real_gguf_seeds`).

Each parser runs in a child process: atheris instruments every ``sinklab`` module's bytecode
(branch coverage feeds libFuzzer), the corpus starts from the seeds, and half the mutations are
libFuzzer's byte mutations, half structure-aware (:func:`structured_mutation`: JSON edits of
config.json, the safetensors header and trainer_state.json; interesting integers in binary
files). An input running over ``--timeout`` seconds is a hang; the address space is capped
``--mem-limit-gb`` above the start, so a huge allocation fails as MemoryError, a finding. An
undocumented exception stops the child with a ``crash-*`` reproducer (and its traceback in
``.txt``) in ``--out``. The parent then replays the final corpus under a line tracer for line
coverage of the parser's modules (:data:`fuzz_parsers.MODULES`) and prints a Markdown table
(inputs, exceptions by type, crashes, hangs, libFuzzer's edge coverage, line coverage, corpus
size, wall time).

Under ASan built by gcc (``LD_PRELOAD=libasan.so``) atheris gets no coverage (libasan, not
libFuzzer, provides the coverage symbols), so ``.ci/sanitize --fuzz N`` runs fuzz_parsers.py's
structure-aware mutation fuzzer there, and ``--replay CORPUS`` reruns a normal build's
coverage-guided corpus under ASan.
"""
from __future__ import annotations

import argparse
import collections
import ctypes
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any, Dict, List, Optional, Sequence, Tuple

# the repository root: run as a script (benchmarks/fuzz_atheris.py, or this file re-executed
# for a --child run), tests.support must still import
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

PARSERS = ("gguf", "safetensors", "tokenizer", "checkpoint", "hfconfig", "core")


def documented(parser: str) -> Tuple[type, ...]:
    """The exception types ``parser`` documents for bad input (fuzz_parsers.DOCUMENTED, one place)."""
    from tests.support import fuzz_parsers as fz

    return fz.DOCUMENTED[parser]


def modules(parser: str) -> Tuple[str, ...]:
    from tests.support import fuzz_parsers as fz

    return fz.MODULES[parser]


# ------------------------------------------------------------------ checkpoint inputs
def pack_files(files: Dict[str, bytes], flags: int) -> bytes:
    """A checkpoint folder as one fuzzer input: a flags byte (bit 0: verify checksums, bit 1:
    re-sign the mutated state) and each file (in sorted name order) as a u32 length + bytes."""
    return bytes([flags]) + b"".join(struct.pack("<I", len(files[n])) + files[n] for n in sorted(files))


def unpack_files(data: bytes, names: Sequence[str]) -> Tuple[int, Dict[str, bytes]]:
    """The inverse of :func:`pack_files`, tolerant of any bytes: a short input truncates or
    empties the last files."""
    flags, pos, out = (data[0] if data else 0), 1, {}
    for n in sorted(names):
        (k,) = struct.unpack("<I", data[pos:pos + 4].ljust(4, b"\0"))
        out[n] = data[pos + 4:pos + 4 + k]
        pos += 4 + k
    return flags, out


# ------------------------------------------------------------------ targets
class AtherisTarget:
    """One parser under coverage-guided fuzz: ``seeds()`` (bytes) and ``run(data)``: by default
    fuzz_parsers' target of the same name on the input bytes."""

    def __init__(self, parser: str, workdir: str) -> None:
        from tests.support import fuzz_parsers as fz

        self.parser, self.workdir = parser, workdir
        self.inner = fz.TARGETS[parser](workdir)

    def seeds(self) -> List[bytes]:
        from tests.support import fuzz_parsers as fz

        if self.parser == "safetensors":
            return [fz.safetensors_seed()]
        if self.parser == "hfconfig":
            return fz.hf_config_seeds()
        if self.parser == "core":
            return [fz.tiny_model_gguf()[0]]
        out = [d for d, _ in fz.gguf_seeds()] + real_gguf_seeds()
        if self.parser == "gguf":
            out.append(fz.tiny_model_gguf()[0])
        return out

    def run(self, data: bytes) -> None:
        self.inner.run("bytes", data)


def real_gguf_seeds(keep: int = 300) -> List[bytes]:
    """The cached SmolLM2 GGUF, shrunk to a seed of a few kB: its real metadata (key names,
    types, the tokenizer) with every array cut to its first ``keep`` entries, and its tensor
    table cut to the tensors of at most 4 kB (the norms), with their real bytes. Empty when the
    file is not cached."""
    import numpy as np
    from tests.support import fuzz_parsers as fz

    path = os.path.expanduser("~/.cache/sinklab/models/SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.isfile(path):
        return []
    from sinklab.io.gguf_reader import GGUFFile

    f = GGUFFile(path)
    kv = []
    for key, v in f.fields.items():
        if isinstance(v, (np.ndarray, list)):
            v = v[:keep]
        t, v = fz._gguf_typed(v)
        if t is not None:
            kv.append((key, t, v))
    tensors = [(t.name, tuple(t.shape), int(t.type), np.asarray(t.data).tobytes())
               for t in f.tensors if np.asarray(t.data).nbytes <= 4096][:8]
    return [fz.gguf_bytes(kv, tensors)[0]]


def structured_mutation(parser: str, data: bytes, rng: Any) -> bytes:
    """A mutation of ``data`` that knows its format (fuzz_parsers' mutators): config.json and
    the safetensors header are parsed and edited as JSON (wrong types, huge sizes, NaN, deleted
    and duplicated keys), a checkpoint's trainer_state.json too (re-signed half the time), and
    binary inputs get interesting integers, truncations, chunk copies. Inputs that no longer
    parse get byte mutations."""
    from tests.support import fuzz_parsers as fz

    if parser == "hfconfig":
        try:
            return fz.mutate_config(rng, json.loads(data))
        except (ValueError, RecursionError):
            return fz.mutate_bytes(rng, data)
    if parser == "safetensors" and len(data) >= 8:
        (n,) = struct.unpack("<Q", data[:8])
        try:
            header = json.dumps(fz.mutate_json_obj(rng, json.loads(data[8:8 + n]))).encode()
            return struct.pack("<Q", len(header)) + header + data[8 + n:]
        except (ValueError, RecursionError, TypeError):
            pass
    if parser == "checkpoint" and data:
        from sinklab.train.checkpoint import STATE_FILE

        names = CHECKPOINT_FILES
        flags, files = unpack_files(data, names)
        try:
            files[STATE_FILE] = json.dumps(fz.mutate_json_obj(rng, json.loads(files[STATE_FILE]))).encode()
        except (ValueError, RecursionError, TypeError):
            name = rng.choice(sorted(files))
            files[name] = fz.mutate_bytes(rng, files[name])
        return pack_files(files, flags | (2 if rng.random() < 0.5 else 0))
    return fz.mutate_bytes(rng, data, [(0, 8)] if parser == "safetensors" else ())


CHECKPOINT_FILES: List[str] = []  # the seed checkpoint's file names (set when its target is made)


class CheckpointAtherisTarget(AtherisTarget):
    """A checkpoint folder packed as one input (:func:`pack_files`); with flag bit 1 the state's
    file sizes, sha256 and own digest are recomputed after mutation, so the fuzzer reaches
    the parser behind the checksums."""

    def __init__(self, parser: str, workdir: str) -> None:
        super().__init__(parser, workdir)
        self.files = self.inner.files
        CHECKPOINT_FILES[:] = sorted(self.files)

    def seeds(self) -> List[bytes]:
        return [pack_files(self.files, f) for f in (0, 1, 2, 3)]

    def _resign(self, files: Dict[str, bytes]) -> Dict[str, bytes]:
        from sinklab.train.checkpoint import STATE_FILE, _json_bytes, _state_digest

        try:
            state = json.loads(files[STATE_FILE])
            if isinstance(state, dict) and isinstance(state.get("files"), dict):
                for name, data in files.items():
                    if name != STATE_FILE:
                        state["files"][name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
            if isinstance(state, dict):
                state["state_sha256"] = _state_digest(state)
            files[STATE_FILE] = _json_bytes(state)
        except (ValueError, TypeError, RecursionError, AttributeError):  # harness side: keep the bytes
            pass
        return files

    def run(self, data: bytes) -> None:
        flags, files = unpack_files(data, list(self.files))
        if flags & 2:
            files = self._resign(files)
        self.inner.run("verify" if flags & 1 else "noverify", files)


def make_target(parser: str, workdir: str) -> AtherisTarget:
    return CheckpointAtherisTarget(parser, workdir) if parser == "checkpoint" else AtherisTarget(parser, workdir)


# ------------------------------------------------------------------ the child: one libFuzzer run
def child(parser: str, corpus: str, stats_path: str, libfuzzer_args: List[str], mem_limit_gb: float,
          inject: Optional[str]) -> None:
    """Runs libFuzzer over ``corpus`` (never returns: libFuzzer exits). Exception counts go to
    ``stats_path`` as JSON when libFuzzer exits (a C ``atexit`` hook: Python's own does not run)."""
    import atheris

    with atheris.instrument_imports(include=["sinklab"]):
        import sinklab  # noqa: F401
        import sinklab.io.gguf_loader, sinklab.io.gguf_reader, sinklab.io.hf_loader  # noqa: E401,F401
        import sinklab.tokenizer, sinklab.train.checkpoint, sinklab.families  # noqa: E401,F401
        for m in modules(parser):
            __import__(m)
    from tests.support import fuzz_parsers as fz

    work = tempfile.mkdtemp(prefix=f"sinklab-atheris-{parser}-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    target = make_target(parser, work)
    ok = documented(parser)
    if inject:  # the CI's proof that a run can fail: the parser raises an undocumented type
        exc = {"KeyError": KeyError, "TypeError": TypeError, "IndexError": IndexError}[inject]
        real = target.run

        def run(data: bytes) -> None:
            real(data)
            raise exc("injected")
        target.run = run  # type: ignore[method-assign]
    stats: Dict[str, Any] = {"inputs": 0, "accepted": 0, "exceptions": collections.Counter()}

    def dump() -> None:
        with open(stats_path + ".tmp", "w") as f:
            json.dump({**stats, "exceptions": dict(stats["exceptions"])}, f)
        os.replace(stats_path + ".tmp", stats_path)
        shutil.rmtree(work, ignore_errors=True)

    hook = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda _: dump())
    ctypes.CDLL(None).__cxa_atexit(hook, None, None)  # glibc's atexit itself is not exported
    child.hook = hook  # type: ignore[attr-defined]  # kept alive until exit

    def one_input(data: bytes) -> None:
        stats["inputs"] += 1
        try:
            target.run(data)
            stats["accepted"] += 1
        except ok as e:
            stats["exceptions"][type(e).__name__] += 1
        except BaseException as e:
            stats["exceptions"][type(e).__name__] += 1
            stats["traceback"] = traceback.format_exc()  # libFuzzer's own report may not show it
            dump()
            raise

    import random

    def mutator(data: bytes, max_size: int, seed: int) -> bytes:
        """Half libFuzzer's own byte mutations, half :func:`structured_mutation`."""
        rng = random.Random(seed)
        if rng.random() < 0.5:
            return atheris.Mutate(data, max_size)
        return structured_mutation(parser, data, rng)[:max_size]

    if mem_limit_gb > 0:
        fz._cap_memory(mem_limit_gb)
    atheris.Setup([sys.argv[0], *libfuzzer_args, corpus], one_input, custom_mutator=mutator)
    atheris.Fuzz()


# ------------------------------------------------------------------ the parent
def _under_asan() -> bool:
    return "asan" in os.environ.get("LD_PRELOAD", "")


def campaign(parser: str, runs: int, out: str, timeout: float = 5.0, max_seconds: Optional[float] = None,
             mem_limit_gb: float = 4.0, max_len: Optional[int] = None, seed: int = 0, coverage: bool = True,
             inject: Optional[str] = None) -> Dict[str, Any]:
    """One libFuzzer run of ``runs`` inputs (or ``max_seconds``) on ``parser`` in a child process.

    Returns {"parser", "inputs", "accepted", "exceptions" ({type: count}), "crashes" ([paths]),
    "hangs" ([paths]), "ooms" ([paths]), "rc", "edges" (libFuzzer's "cov"), "features",
    "corpus" (final corpus size), "line_coverage" ((hit, lines) over :data:`MODULES` replaying
    the corpus), "seconds", "log" (libFuzzer's tail)}.
    """
    os.makedirs(out, exist_ok=True)
    corpus = os.path.join(out, f"corpus-{parser}")
    if os.path.isdir(corpus):
        shutil.rmtree(corpus)
    os.makedirs(corpus)
    work = tempfile.mkdtemp(prefix="sinklab-atheris-seeds-")
    try:
        seeds = make_target(parser, work).seeds()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for s in seeds:
        with open(os.path.join(corpus, "seed-" + hashlib.sha1(s).hexdigest()), "wb") as f:
            f.write(s)
    if max_len is None:  # room to grow, but not so much that each input gets slow
        max_len = max(4096, 2 * max(len(s) for s in seeds))
    dict_path = os.path.join(out, f"dict-{parser}.txt")
    with open(dict_path, "w") as f:
        f.write("\n".join(json.dumps(w) for w in sorted(dictionary(seeds))) + "\n")
    stats_path = os.path.join(out, f"stats-{parser}.json")
    if os.path.exists(stats_path):
        os.remove(stats_path)
    asan = _under_asan()
    lf = [f"-runs={runs}", f"-timeout={int(max(1, round(timeout)))}", f"-seed={seed + 1}", f"-max_len={max_len}",
          f"-artifact_prefix={os.path.join(out, parser + '-')}", "-print_final_stats=1", "-close_fd_mask=1",
          f"-dict={dict_path}", "-rss_limit_mb=8192", "-malloc_limit_mb=4096" if asan else "-malloc_limit_mb=0"]
    if max_seconds:
        lf.append(f"-max_total_time={int(max_seconds)}")
    cmd = [sys.executable, os.path.abspath(__file__), "--child", parser, corpus, stats_path,
           "--mem-limit-gb", str(0 if asan else mem_limit_gb)] + (["--inject", inject] if inject else []) + \
          ["--"] + lf
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    t0 = time.perf_counter()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    seconds = time.perf_counter() - t0
    log = p.stdout.decode("utf-8", "replace")
    with open(os.path.join(out, f"log-{parser}.txt"), "w") as f:
        f.write(log)
    stats = {"inputs": 0, "accepted": 0, "exceptions": {}}
    if os.path.exists(stats_path):
        with open(stats_path) as f:
            stats = json.load(f)
    arts = sorted(os.listdir(out))
    res: Dict[str, Any] = {
        "parser": parser, "rc": p.returncode, "seconds": seconds, **stats,
        "crashes": [os.path.join(out, a) for a in arts if a.startswith(parser + "-crash-") and not a.endswith(".txt")],
        "hangs": [os.path.join(out, a) for a in arts if a.startswith(parser + "-timeout-")],
        "ooms": [os.path.join(out, a) for a in arts if a.startswith(parser + "-oom-")],
        "sanitizer_reports": len(re.findall(r"ERROR: AddressSanitizer|runtime error:|SUMMARY: \w+Sanitizer", log)),
        "log": log[-4000:], "corpus": len(os.listdir(corpus)), "edges": None, "features": None,
        "line_coverage": None}
    if res["crashes"] and stats.get("traceback"):  # next to the reproducer, as fuzz_parsers.py saves them
        with open(res["crashes"][-1] + ".txt", "w") as f:
            f.write(stats["traceback"])
    m = re.findall(r"cov: (\d+) ft: (\d+)", log)
    if m:
        res["edges"], res["features"] = int(m[-1][0]), int(m[-1][1])
    m = re.search(r"stat::number_of_executed_units: (\d+)", log)
    if m:
        res["executed"] = int(m.group(1))
    if coverage:
        res["line_coverage"] = replay_coverage(parser, corpus)
    return res


def replay(parser: str, corpus: str, timeout: float = 5.0) -> Dict[str, Any]:
    """Runs every file of a corpus (a folder of inputs, such as a campaign's final corpus) through
    ``parser`` once, in this process: how a normal build's coverage-guided corpus is rerun under
    ASan, where atheris gets no coverage (gcc's libasan provides the coverage symbols).

    Returns {"parser", "inputs", "accepted", "exceptions", "undocumented" ([(file, type, message)]),
    "hangs" ([file]), "slowest" (seconds)}."""
    import signal

    from tests.support import fuzz_parsers as fz

    work = tempfile.mkdtemp(prefix=f"sinklab-replay-{parser}-")
    target, ok = make_target(parser, work), documented(parser)
    res: Dict[str, Any] = {"parser": parser, "inputs": 0, "accepted": 0, "exceptions": collections.Counter(),
                           "undocumented": [], "hangs": [], "slowest": 0.0}
    old = signal.signal(signal.SIGALRM, fz._alarm)
    try:
        for name in sorted(os.listdir(corpus)):
            with open(os.path.join(corpus, name), "rb") as f:
                data = f.read()
            t0 = time.perf_counter()
            signal.setitimer(signal.ITIMER_REAL, timeout)
            try:
                target.run(data)
                res["accepted"] += 1
            except fz.Hang:
                res["hangs"].append(name)
            except ok as e:
                res["exceptions"][type(e).__name__] += 1
            except Exception as e:  # everything else is a finding
                res["exceptions"][type(e).__name__] += 1
                res["undocumented"].append((name, type(e).__name__, str(e)[:200]))
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            res["slowest"] = max(res["slowest"], time.perf_counter() - t0)
            res["inputs"] += 1
    finally:
        signal.signal(signal.SIGALRM, old)
        shutil.rmtree(work, ignore_errors=True)
    return res


def dictionary(seeds: Sequence[bytes]) -> set:
    """libFuzzer dictionary words: the JSON keys and string values of the seeds that are JSON
    (config.json, a safetensors header, trainer_state.json) with their quotes, and JSON's
    hostile literals."""
    words = {'NaN', 'Infinity', '-Infinity', '1e999', '-1', 'null', 'true', '[]', '{}', '4294967296'}

    def walk(v: Any) -> None:
        if isinstance(v, dict):
            for k, x in v.items():
                words.add(json.dumps(k))
                walk(x)
        elif isinstance(v, list):
            for x in v[:16]:
                walk(x)
        elif isinstance(v, str) and len(v) < 40:
            words.add(json.dumps(v))

    dec = json.JSONDecoder()
    for s in seeds:
        text, pos = s.decode("latin-1"), 0
        while 0 <= pos < len(text):  # every JSON object embedded in the seed (headers, packed files)
            pos = text.find("{", pos)
            if pos < 0:
                break
            try:
                v, end = dec.raw_decode(text, pos)
                walk(v)
                pos = end
            except (ValueError, RecursionError):
                pos += 1
    return {w for w in words if w.isascii() and "\\" not in w}


def replay_coverage(parser: str, corpus: str) -> Tuple[int, int]:
    """(lines hit, lines) of :data:`MODULES` ``[parser]`` when the corpus is replayed under a
    line tracer (in a child process: a replayed input may need a fresh interpreter's state)."""
    code = ("import sys, os, json; sys.path.insert(0, %r); from tests.support import fuzz_atheris as fa, fuzz_parsers as fz\n"
            "import tempfile\n"
            "w = tempfile.mkdtemp(); t = fa.make_target(%r, w); cov = fz.LineCoverage(fa.modules(%r))\n"
            "for n in sorted(os.listdir(%r)):\n"
            "    data = open(os.path.join(%r, n), 'rb').read()\n"
            "    with cov:\n"
            "        try: t.run(data)\n"
            "        except Exception: pass\n"
            "print(json.dumps(cov.summary()))\n") % (ROOT, parser, parser, corpus, corpus)
    p = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        return tuple(json.loads(p.stdout.decode().strip().splitlines()[-1]))  # type: ignore[return-value]
    except (ValueError, IndexError):
        return (0, 0)


def markdown(results: Sequence[Dict[str, Any]], argv: Sequence[str]) -> str:
    """The Markdown table for benchmarks/RESULTS.md."""
    from tests.support import fuzz_parsers as fz

    lines = [f"`python benchmarks/fuzz_atheris.py {' '.join(argv)}`", "",
             "| parser | inputs | parsed OK | exceptions by type | crashes | hangs (> 5 s) | OOM | sanitizer reports | "
             "edges (libFuzzer cov) | line coverage (corpus replay) | corpus | wall |",
             "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        exc = fz.exceptions_cell(r["exceptions"])
        lc = r["line_coverage"]
        cov = "-" if not lc else f"{lc[0]}/{lc[1]} ({100 * lc[0] / max(lc[1], 1):.0f}%)"
        lines.append(f"| {r['parser']} | {r.get('executed', r['inputs']):,} | {r['accepted']:,} | {exc} | "
                     f"{len(r['crashes'])} | {len(r['hangs'])} | {len(r['ooms'])} | {r['sanitizer_reports']} | "
                     f"{r['edges'] or '-'} | {cov} | {r['corpus']} | {r['seconds']:.0f} s |")
    return "\n".join(lines)


def failed(r: Dict[str, Any]) -> bool:
    """A finding: a crash, hang, OOM or sanitizer report, or libFuzzer stopping early."""
    return bool(r["crashes"] or r["hangs"] or r["ooms"] or r["sanitizer_reports"] or r["rc"] != 0)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--child":
        i = argv.index("--")
        p = argparse.ArgumentParser()
        p.add_argument("parser")
        p.add_argument("corpus")
        p.add_argument("stats")
        p.add_argument("--mem-limit-gb", type=float, default=0)
        p.add_argument("--inject", default=None)
        a = p.parse_args(argv[1:i])
        child(a.parser, a.corpus, a.stats, argv[i + 1:], a.mem_limit_gb, a.inject)
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--parser", choices=PARSERS + ("all",), default="all",
                   help="all: the five parsers (core runs only when asked: it belongs under ASan)")
    p.add_argument("--runs", type=int, default=100_000, help="inputs per parser")
    p.add_argument("--max-seconds", type=float, default=None, help="stop each parser after this long")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds after which an input is a hang")
    p.add_argument("--mem-limit-gb", type=float, default=4.0, help="address space allowed above the start")
    p.add_argument("--max-len", type=int, default=None,
                   help="largest input libFuzzer makes (bytes; default twice the largest seed)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="corpus, logs and crash reproducers (default: a temp folder)")
    p.add_argument("--no-coverage", action="store_true", help="skip the corpus replay for line coverage")
    p.add_argument("--inject", choices=("KeyError", "TypeError", "IndexError"), default=None,
                   help="make the parser raise this after every input (shows the run fails)")
    p.add_argument("--replay", metavar="CORPUS", default=None,
                   help="run each file of CORPUS through --parser once (no fuzzing; e.g. under ASan)")
    a = p.parse_args(argv)
    if a.replay:
        if a.parser == "all":
            p.error("--replay needs one --parser")
        r = replay(a.parser, a.replay, a.timeout)
        exc = ", ".join(f"{k} {v}" for k, v in r["exceptions"].most_common()) or "-"
        print(f"replay {a.parser}: {r['inputs']} inputs, {r['accepted']} parsed OK, exceptions: {exc}, "
              f"undocumented {len(r['undocumented'])}, hangs {len(r['hangs'])}, slowest {r['slowest'] * 1e3:.0f} ms")
        for u in r["undocumented"][:20]:
            print("UNDOCUMENTED", *u)
        return 1 if r["undocumented"] or r["hangs"] else 0
    out = a.out or tempfile.mkdtemp(prefix="sinklab-atheris-")
    results = []
    for parser in (PARSERS[:-1] if a.parser == "all" else (a.parser,)):
        r = campaign(parser, a.runs, out, a.timeout, a.max_seconds, a.mem_limit_gb, a.max_len, a.seed,
                     not a.no_coverage, a.inject)
        results.append(r)
        print(markdown([r], argv).splitlines()[-1], file=sys.stderr, flush=True)
        if failed(r):
            print(f"FINDING {parser} (rc {r['rc']}): crashes {r['crashes']} hangs {r['hangs']} ooms {r['ooms']}\n"
                  f"{r['log'][-3000:]}", file=sys.stderr)
    print(markdown(results, argv))
    print(f"(corpus, logs, reproducers: {out})")
    return 1 if any(failed(r) for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
