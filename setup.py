"""Builds sinklab._core, the C extension, from csrc/*.c with OpenMP where the compiler has it.

The compiler is the one setuptools picks: ``CC`` when set (``CC=clang pip install .``), else
the one Python was built with. gcc and clang are supported and build warning-free under
-Wall -Wextra.

``SINKLAB_OPENMP`` (read at build time): ``auto`` (default) uses OpenMP when a test program
compiles and links with ``-fopenmp``; ``0`` builds without it; ``1`` requires it and fails the
build when the compiler has none. Without OpenMP the kernels run on one thread, the build
prints one line and ``import sinklab`` warns once.

Never -march=native: the kernels for AVX2+FMA and AVX-512 carry their own target attributes
and are picked at run time, so one build runs on any x86-64 machine (and elsewhere through the
portable path). -ffp-contract=off: clang would otherwise fuse a*b+c into an FMA in the portable
C code of functions compiled for an FMA target, and its results would drift from gcc's (gcc
already does not fuse under -std=c11).

``SINKLAB_SANITIZE`` (read at build time; unset or empty: the normal build above, flags
unchanged): a comma-separated list of ``address`` and ``undefined`` builds the extension under
AddressSanitizer and/or UndefinedBehaviorSanitizer for testing the C core:
``SINKLAB_SANITIZE=address,undefined pip install -e .`` compiles with ``-fsanitize=address,undefined
-fno-sanitize-recover=undefined -fno-omit-frame-pointer -g -O1`` (in place of -O3) and links the
sanitizer runtimes. Python itself is not instrumented, so an ASan extension needs the runtime
preloaded and CPython's deliberate leaks ignored::

    LD_PRELOAD=$(gcc -print-file-name=libasan.so) ASAN_OPTIONS=detect_leaks=0 \
    UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 python -m pytest tests/test_sgemm.py

(.ci/sanitize does this in a fresh venv). build_info()'s cflags name the sanitizer flags.

``SINKLAB_BUILD_JOBS`` (read at build time): how many C files compile at once, by default the
CPUs the build may use.
"""
import glob
import os
import shutil
import subprocess
import tempfile

import numpy
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

BASE_FLAGS = ["-std=c11", "-O3", "-Wall", "-Wextra", "-fno-strict-aliasing", "-ffp-contract=off"]
# NumPy 2 headers, targeting the 1.23 ABI: one build runs on NumPy 1.23+ and 2.x.
BASE_MACROS = [("NPY_NO_DEPRECATED_API", "NPY_1_23_API_VERSION"),
               ("NPY_TARGET_VERSION", "NPY_1_23_API_VERSION")]


def _openmp_request() -> str:
    value = os.environ.get("SINKLAB_OPENMP", "auto").strip().lower() or "auto"
    if value not in ("0", "1", "auto"):
        raise SystemExit(f"error: SINKLAB_OPENMP={os.environ['SINKLAB_OPENMP']!r} must be 0, 1 or auto")
    return value


SANITIZERS = ("address", "undefined")


def _sanitize_request() -> list:
    """The sanitizers SINKLAB_SANITIZE asks for, in SANITIZERS order; [] for a normal build."""
    raw = os.environ.get("SINKLAB_SANITIZE", "").strip().lower()
    names = [n.strip() for n in raw.split(",") if n.strip()]
    bad = [n for n in names if n not in SANITIZERS]
    if bad:
        raise SystemExit(f"error: SINKLAB_SANITIZE={os.environ['SINKLAB_SANITIZE']!r}: unknown "
                         f"sanitizer {bad[0]!r}; use a comma-separated list of {', '.join(SANITIZERS)}")
    return [n for n in SANITIZERS if n in names]


def _sanitize_flags(flags: list, sanitizers: list):
    """(compile flags, link flags) for a sanitizer build: -O1 in place of -O3 (usable stack
    traces at bearable speed), debug info, frame pointers; UBSan errors abort instead of
    printing and continuing, so that no report can go unnoticed in a passing test run."""
    fs = "-fsanitize=" + ",".join(sanitizers)
    extra = [fs, "-fno-omit-frame-pointer", "-g"]
    if "undefined" in sanitizers:
        extra.append("-fno-sanitize-recover=undefined")
    return [("-O1" if f == "-O3" else f) for f in flags] + extra, [fs]


def _try_compile(compiler, src: str, flags, link: bool = False) -> str:
    """'' when src compiles (and, with link, links into a shared object) with flags added to the
    very commands the extension is built with (CC, CFLAGS, LDSHARED, LDFLAGS included); else
    the compiler's first error line."""
    tmp = tempfile.mkdtemp()
    try:
        c, o, so = (os.path.join(tmp, n) for n in ("t.c", "t.o", "t.so"))
        with open(c, "w") as f:
            f.write(src)
        cmds = [list(compiler.compiler_so) + list(flags) + ["-c", c, "-o", o]]
        if link:
            cmds.append(list(compiler.linker_so) + [o] + list(flags) + ["-o", so])
        for cmd in cmds:
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                lines = (r.stderr + r.stdout).strip().splitlines()
                msg = next((ln.strip() for ln in lines if "error" in ln), f"exit status {r.returncode}")
                return msg.replace(c, os.path.basename(c)).replace(o, os.path.basename(o))
        return ""
    except OSError as e:
        return str(e)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _openmp_probe(compiler) -> str:
    """'' when a program using omp.h compiles and links with -fopenmp, else why not. Linking
    pulls in the OpenMP runtime library, which a compiler may lack even with omp.h."""
    return _try_compile(compiler, "#include <omp.h>\nint sl_probe(void){return omp_get_max_threads();}\n",
                        ["-fopenmp"], link=True)


def _knows_warning(compiler, name: str) -> bool:
    """Whether the compiler has the warning -W<name> (gcc rejects an unknown -Wname, though it
    would accept -Wno-name silently)."""
    return not _try_compile(compiler, "int sl_probe;\n", ["-Werror", f"-W{name}"])


def _c_string(s: str) -> str:
    """s as a C string literal for a -D define (passed as one argument, no shell)."""
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _build_jobs() -> int:
    """How many C files compile at once: SINKLAB_BUILD_JOBS, else the CPUs this process may use."""
    env = os.environ.get("SINKLAB_BUILD_JOBS", "").strip()
    if env:
        if not env.isdigit() or int(env) < 1:
            raise SystemExit(f"error: SINKLAB_BUILD_JOBS must be a positive integer, got {env!r}")
        return int(env)
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


def _compile_in_parallel(compiler, jobs: int) -> None:
    """Makes compiler.compile build its objects ``jobs`` at a time. distutils compiles one file
    after another; the core's 17 files are independent, so on 2 cores the build takes about half
    the time. The objects, flags and commands are those of the serial build."""
    if jobs < 2:
        return
    from concurrent.futures import ThreadPoolExecutor

    def compile(sources, output_dir=None, macros=None, include_dirs=None, debug=0, extra_preargs=None,
                extra_postargs=None, depends=None):
        macros, objects, extra_postargs, pp_opts, build = compiler._setup_compile(
            output_dir, macros, include_dirs, sources, depends, extra_postargs)
        cc_args = compiler._get_cc_args(pp_opts, debug, extra_preargs)

        def one(obj):
            src, ext = build[obj]
            compiler._compile(obj, src, ext, cc_args, extra_postargs, pp_opts)

        with ThreadPoolExecutor(jobs) as pool:
            list(pool.map(one, [o for o in objects if o in build]))   # list(): a failure raises here
        return objects

    compiler.compile = compile


class BuildExt(build_ext):
    def build_extensions(self):
        cc = list(getattr(self.compiler, "compiler_so", None) or ["cc"])
        # the command words before the first flag: "clang", or "ccache gcc"
        n_cmd = next((i for i, w in enumerate(cc) if w.startswith("-")), len(cc))
        cc_name = " ".join(os.path.basename(w) for w in cc[:n_cmd]) or "cc"
        request = _openmp_request()
        omp, reason = False, "SINKLAB_OPENMP=0"
        if request != "0":
            err = _openmp_probe(self.compiler)
            omp, reason = not err, f"{cc_name} has no usable OpenMP: {err}"
            if request == "1" and not omp:
                raise SystemExit(f"error: SINKLAB_OPENMP=1 but {reason}")
        # Without OpenMP the pragmas are ignored on purpose: gcc's -Wall would flag each one.
        flags = BASE_FLAGS + (["-fopenmp"] if omp else ["-Wno-unknown-pragmas"])
        # clang with OpenMP notes each `omp parallel for simd` loop it could not vectorise
        # (-Wpass-failed; clang 14 "could not determine number of loop iterations" of the two in
        # train.c): a missed optimisation, not a defect; those loops run scalar, same results.
        if omp and _knows_warning(self.compiler, "pass-failed"):
            flags.append("-Wno-pass-failed")
        link_flags = ["-fopenmp"] if omp else []
        sanitizers = _sanitize_request()
        if sanitizers:
            flags, san_link = _sanitize_flags(flags, sanitizers)
            link_flags = link_flags + san_link
            print(f"sinklab: building with -fsanitize={','.join(sanitizers)} (SINKLAB_SANITIZE)",
                  flush=True)
        build_info = [("SL_HAVE_OPENMP", "1" if omp else "0"),
                      ("SL_BUILD_CC", _c_string(cc_name)),
                      ("SL_BUILD_CFLAGS", _c_string(" ".join(cc[n_cmd:] + flags))),
                      ("SL_BUILD_NUMPY", _c_string(numpy.__version__)),
                      ("SL_BUILD_OPENMP_REQUEST", _c_string(request))]
        for ext in self.extensions:
            ext.extra_compile_args = flags
            ext.extra_link_args = link_flags
            ext.define_macros = BASE_MACROS + build_info
        if not omp:
            print(f"sinklab: building without OpenMP ({reason}); the kernels will run on one thread",
                  flush=True)
        _compile_in_parallel(self.compiler, _build_jobs())
        super().build_extensions()


setup(
    ext_modules=[
        Extension(
            "sinklab._core",
            sources=sorted(glob.glob("csrc/*.c")),
            depends=sorted(glob.glob("csrc/*.h")),
            include_dirs=[numpy.get_include(), "csrc"],
            define_macros=list(BASE_MACROS),
        )
    ],
    cmdclass={"build_ext": BuildExt},
)
