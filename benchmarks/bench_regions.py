#!/usr/bin/env python
"""Parallel regions (OpenMP fork/joins) per forward, and the forward's time, before vs after a
change to the C core: SmolLM2-135M-Instruct at fp32, bf16 and int8, several T and thread counts.

Two builds are compared: "after" is this checkout's sinklab; "before" is a copy of the package
with an older _core extension (--before DIR: DIR/sinklab/ holds the old package and .so), e.g.

    cp -r sinklab /tmp/before/ && find /tmp/before -name __pycache__ -prune -exec rm -rf {} +
    (before the change, after building it: the old .so goes with the copy)

Each build runs in its own worker subprocess, which loads the model once and then times whatever
forward the driver asks for (model.run(ids, capture=("logits",), precision=p) under
sl.threads(n); one untimed warm-up per configuration, which also packs the bf16/int8 panels).
The driver interleaves the two workers call by call (before, after, after, before, ...), so a
change of load on a shared machine hits both alike, and reports the median of --repeats calls
and the ratio before/after (> 1: the change is faster), with the minimum (robust to a burst of
other load) and the median CPU time of the process (all its threads, spinning included: on one
thread the work itself, unaffected by waiting for a shared core).

Fork/join count: a third and fourth short worker run with an LD_PRELOAD shim (compiled here with
cc) that interposes libgomp's GOMP_parallel and counts its calls during one forward: "teams" are
regions forked with more than one thread, "solo" those entered with one (an `if` clause that is
false, or one thread asked), which cost a call but no wake-up; "barriers" counts the implicit
barriers of `omp for` loops inside regions (GOMP_barrier/GOMP_loop_end on the calling thread).

Usage:
  python benchmarks/bench_regions.py --before /tmp/regions_before [--seq 64,128,512]
         [--threads 1,2] [--precision fp32,bf16,int8] [--repeats 7] [--model smollm2-135m-instruct]
"""
import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

from machine import cpu_name, lscpu_lines

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>
/* libgomp is dlopen'ed with the extension, after this preload: look it up at the first call */
static void *gomp(const char *name) {
    void *h = dlopen("libgomp.so.1", RTLD_NOW | RTLD_NOLOAD);
    void *p = h ? dlsym(h, name) : NULL;
    if (!p) { fprintf(stderr, "regions shim: no %s\n", name); abort(); }
    return p;
}
static unsigned long teams, solo, barriers;
static int on;
static int main_thread(void) { return syscall(SYS_gettid) == getpid(); }
void GOMP_parallel(void (*fn)(void *), void *data, unsigned nt, unsigned flags) {
    static void (*real)(void (*)(void *), void *, unsigned, unsigned);
    if (!real) real = (void (*)(void (*)(void *), void *, unsigned, unsigned))gomp("GOMP_parallel");
    if (on) { if (nt == 1) solo++; else teams++; }
    real(fn, data, nt, flags);
}
void GOMP_barrier(void) {
    static void (*real)(void);
    if (!real) real = (void (*)(void))gomp("GOMP_barrier");
    if (on && main_thread()) barriers++;
    real();
}
void GOMP_loop_end(void) {
    static void (*real)(void);
    if (!real) real = (void (*)(void))gomp("GOMP_loop_end");
    if (on && main_thread()) barriers++;
    real();
}
void sl_regions_count(int enable) { if (enable) teams = solo = barriers = 0; on = enable; }
void sl_regions_read(unsigned long *out) { out[0] = teams; out[1] = solo; out[2] = barriers; }
"""

# The worker: reads one JSON command per line, answers one JSON line.
WORKER = r"""
import ctypes, json, sys, time
import numpy as np
import sinklab as sl
shim = ctypes.CDLL(sys.argv[2]) if len(sys.argv) > 2 else None
m = sl.load(sys.argv[1])
print(json.dumps({"ready": sl.__file__}), flush=True)
warm = set()
for line in sys.stdin:
    c = json.loads(line)
    rng = np.random.default_rng(c["T"])
    ids = rng.integers(3, m.config.vocab_size, size=c["T"]).astype(np.int64)
    ids[0] = 1
    key = (c["precision"], c["T"], c["threads"])
    with sl.threads(c["threads"]):
        if key not in warm:
            m.run(ids, capture=("logits",), precision=c["precision"], progress=False)
            warm.add(key)
        if shim:
            shim.sl_regions_count(1)
        t0, c0 = time.perf_counter(), time.process_time()
        m.run(ids, capture=("logits",), precision=c["precision"], progress=False)
        out = {"s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0}
        if shim:
            shim.sl_regions_count(0)
            n = (ctypes.c_ulong * 3)()
            shim.sl_regions_read(n)
            out.update(teams=n[0], solo=n[1], barriers=n[2])
    print(json.dumps(out), flush=True)
"""


class Worker:
    def __init__(self, pythonpath, model, shim=None):
        env = dict(os.environ, PYTHONPATH=pythonpath)
        if shim:
            env["LD_PRELOAD"] = shim
        args = [sys.executable, "-c", WORKER, model] + ([shim] if shim else [])
        self.p = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True,
                                  cwd=pythonpath)  # "" on sys.path is the cwd: the build under test
        self.where = json.loads(self.p.stdout.readline())["ready"]

    def run(self, precision, T, threads):
        self.p.stdin.write(json.dumps({"precision": precision, "T": T, "threads": threads}) + "\n")
        self.p.stdin.flush()
        return json.loads(self.p.stdout.readline())

    def close(self):
        self.p.stdin.close()
        self.p.wait()


def build_shim(tmp):
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return None
    src, so = os.path.join(tmp, "shim.c"), os.path.join(tmp, "shim.so")
    with open(src, "w") as f:
        f.write(SHIM)
    r = subprocess.run([cc, "-O2", "-shared", "-fPIC", src, "-o", so, "-ldl"], capture_output=True, text=True)
    return so if r.returncode == 0 else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="folder holding the old sinklab/ package (with its .so)")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--seq", default="64,128,512")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--precision", default="fp32,bf16,int8")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    seqs = [int(x) for x in a.seq.split(",")]
    threads = [int(x) for x in a.threads.split(",")]
    precs = a.precision.split(",")
    builds = {"before": os.path.abspath(a.before), "after": _ROOT}

    print(f"# bench_regions  {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC  "
          f"cpu={cpu_name()}  cores={os.cpu_count()}  model={a.model}  repeats={a.repeats}")
    for line in lscpu_lines():
        print("#", line)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        shim = build_shim(tmp)
        counts = {}
        if shim:
            for name, path in builds.items():
                w = Worker(path, a.model, shim)
                for p in precs:
                    for T in seqs:
                        for n in threads:
                            counts[name, p, T, n] = w.run(p, T, n)
                w.close()
        else:
            print("# no C compiler: fork/join counts skipped")
        workers = {name: Worker(path, a.model) for name, path in builds.items()}
        for name, w in workers.items():
            print(f"# {name}: {w.where}")
        print("# regions: parallel regions forked with >1 thread (+ entered with 1) per forward; "
              "times: median of the repeats, ratio = before / after")
        print(f"{'prec':>5} {'T':>4} {'thr':>3} {'regions before':>15} {'regions after':>14} "
              f"{'before ms':>10} {'after ms':>9} {'ratio':>6} {'min ratio':>9} {'cpu ratio':>9}")
        for p in precs:
            for T in seqs:
                for n in threads:
                    t = {"before": [], "after": []}
                    cpu = {"before": [], "after": []}
                    for name in builds:  # warm-up
                        workers[name].run(p, T, n)
                    for r in range(a.repeats):
                        order = ("before", "after") if r % 2 == 0 else ("after", "before")
                        for name in order:
                            r_ = workers[name].run(p, T, n)
                            t[name].append(r_["s"])
                            cpu[name].append(r_["cpu_s"])
                    med = {k: statistics.median(v) for k, v in t.items()}
                    lo = {k: min(v) for k, v in t.items()}
                    mc = {k: statistics.median(v) for k, v in cpu.items()}
                    cb, ca = counts.get(("before", p, T, n)), counts.get(("after", p, T, n))
                    fmt = (lambda c: f"{c['teams']}+{c['solo']}" if c else "-")
                    row = {"precision": p, "T": T, "threads": n, "before_s": t["before"], "after_s": t["after"],
                           "median_before_s": med["before"], "median_after_s": med["after"],
                           "ratio": med["before"] / med["after"], "min_ratio": lo["before"] / lo["after"],
                           "cpu_before_s": cpu["before"], "cpu_after_s": cpu["after"],
                           "cpu_ratio": mc["before"] / mc["after"], "regions_before": cb, "regions_after": ca}
                    rows.append(row)
                    print(f"{p:>5} {T:>4} {n:>3} {fmt(cb):>15} {fmt(ca):>14} {1e3 * med['before']:>10.2f} "
                          f"{1e3 * med['after']:>9.2f} {row['ratio']:>6.3f} {row['min_ratio']:>9.3f} "
                          f"{row['cpu_ratio']:>9.3f}", flush=True)
        for w in workers.values():
            w.close()
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"cpu": cpu_name(), "lscpu": lscpu_lines(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
