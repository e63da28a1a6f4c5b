"""sl.build_info() against independent readings: the compiler's own predefined macros (asked of
the compiler binary the build ran), /proc/cpuinfo, the dynamic linker, NumPy itself; and the
build-time switch SINKLAB_OPENMP of setup.py."""
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

import sinklab as sl
from sinklab import _core

ROOT = Path(__file__).resolve().parent.parent

KEYS = {
    "version": str, "compiler": str, "compiler_family": str, "compiler_version": str,
    "compiler_banner": str, "cc": str, "cflags": str, "openmp": bool, "openmp_request": str,
    "threads": int, "max_threads": int, "simd": str, "simd_best": str, "cpu_features": dict,
    "blas": str, "numpy_build": str, "numpy_build_abi": int, "numpy_target_api": int,
    "numpy_runtime": str, "numpy_runtime_abi": int, "numpy_runtime_api": int,
    "platform": str, "machine": str, "python": str,
}
OPTIONAL = {"openmp_date": int, "num_procs": int, "openmp_version": str}  # None without OpenMP


@pytest.fixture(scope="module")
def info():
    return sl.build_info()


def compiler_macros(cc: str, openmp: bool) -> dict:
    """The predefined macros of the compiler command `cc` (with -fopenmp when asked), or skip."""
    exe = cc.split()[-1]
    if shutil.which(exe) is None:
        pytest.skip(f"the compiler the extension was built with ({cc}) is not on PATH here")
    cmd = cc.split() + (["-fopenmp"] if openmp else []) + ["-dM", "-E", "-x", "c", os.devnull]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return dict(m.groups() for m in re.finditer(r"^#define (\w+) ?(.*)$", out, re.M))


def test_keys_and_types(info):
    assert set(info) == set(KEYS) | set(OPTIONAL)
    for key, typ in KEYS.items():
        assert isinstance(info[key], typ), (key, info[key])
    for key, typ in OPTIONAL.items():
        assert (info[key] is None) == (not info["openmp"]) and (info[key] is None or isinstance(info[key], typ)), \
            (key, info[key])
    assert "build_info" in sl.__all__ and sl.build_info.__doc__
    assert info["version"] == sl.__version__
    assert info["compiler"] == f"{info['compiler_family']} {info['compiler_version']}"
    assert info["blas"] == "none"
    assert info["simd"] == sl.simd() and info["threads"] == sl.get_num_threads()
    assert (info["platform"], info["machine"], info["python"]) == (
        platform.platform(), platform.machine(), platform.python_version())


def test_compiler_is_the_one_that_built_it(info):
    """Family, version and __VERSION__ banner agree with what the build's compiler command
    itself predefines (so they come from its macros, not from a guess about this machine)."""
    macros = compiler_macros(info["cc"], openmp=False)
    if "__clang__" in macros:
        family = "clang"
        version = ".".join(macros[f"__clang_{k}__"] for k in ("major", "minor", "patchlevel"))
    else:
        assert "__GNUC__" in macros, macros.get("__VERSION__")
        family = "gcc"
        version = ".".join(macros[f"__GNUC{k}__"] for k in ("", "_MINOR", "_PATCHLEVEL"))
    assert info["compiler_family"] in (family, f"apple-{family}")
    assert info["compiler_version"] == version
    assert f'"{info["compiler_banner"]}"' == macros["__VERSION__"]
    if "CC" not in os.environ:
        # built by the default compiler: it is the compiler `cc --version` names, Python's own CC
        import sysconfig
        default = (sysconfig.get_config_var("CC") or "cc").split()[0]
        if os.path.basename(default) == info["cc"].split()[-1]:
            banner = subprocess.run([default, "--version"], capture_output=True, text=True).stdout
            assert version in banner.splitlines()[0], banner


def test_openmp(info):
    assert info["openmp"] == bool(_core.has_openmp)
    assert info["max_threads"] >= 1 and info["threads"] >= 1
    assert ("-fopenmp" in info["cflags"].split()) == info["openmp"]
    if info["compiler_family"] == "gcc" and info["openmp_request"] == "auto":
        assert info["openmp"], "gcc has OpenMP (libgomp): the build should have used it"
    if not info["openmp"]:
        assert info["openmp_date"] is None and info["openmp_version"] is None
        assert info["max_threads"] == 1 and info["threads"] == 1
        return
    assert info["num_procs"] >= 1
    # the OpenMP version is the compiler's _OPENMP, as the compiler itself defines it
    assert str(info["openmp_date"]) == compiler_macros(info["cc"], openmp=True)["_OPENMP"]
    assert info["openmp_version"] == {201511: "4.5", 201811: "5.0"}.get(info["openmp_date"], info["openmp_version"])


def test_flags(info):
    flags = info["cflags"].split()
    for flag in ("-Wall", "-Wextra", "-ffp-contract=off", "-std=c11"):
        assert flag in flags
    assert not any(f.startswith("-march=native") or f.startswith("-mtune=native") for f in flags)


@pytest.mark.skipif(not sys.platform.startswith("linux") or platform.machine() not in ("x86_64", "AMD64"),
                    reason="reads /proc/cpuinfo of an x86-64 Linux machine")
def test_simd_matches_proc_cpuinfo(info):
    flags = set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    assert flags, "no flags line in /proc/cpuinfo"
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
        best = "avx512"
    elif {"avx2", "fma"} <= flags:
        best = "avx2"
    else:
        best = "generic"
    assert info["simd_best"] == best
    assert info["cpu_features"] == {f: f in flags for f in
                                    ("avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq",
                                     "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8")}


def test_numpy(info):
    assert info["numpy_runtime"] == np.__version__
    from numpy._core import _multiarray_umath  # NumPy >= 2 (the extension is built against 2.x)

    assert info["numpy_runtime_abi"] == _multiarray_umath._get_ndarray_c_version()
    assert info["numpy_build_abi"] == 0x02000000 and info["numpy_build"].split(".")[0] == "2"
    assert info["numpy_target_api"] == 0x10  # NPY_1_23_API_VERSION: setup.py's NPY_TARGET_VERSION
    assert info["numpy_runtime_api"] >= info["numpy_target_api"]


@pytest.mark.skipif(shutil.which("ldd") is None, reason="needs ldd")
def test_no_blas_is_linked():
    out = subprocess.run(["ldd", _core.__file__], capture_output=True, text=True).stdout
    assert out and not re.search(r"blas|lapack|mkl|accelerate", out, re.I), out


def run_setup(env_extra):
    """setup.py build_ext into a temporary folder; returns (returncode, output)."""
    tmp = tempfile.mkdtemp()
    try:
        env = dict(os.environ, **env_extra)
        r = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "-b", tmp, "-t", tmp],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        return r.returncode, r.stdout + r.stderr
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.skipif(not (ROOT / "setup.py").is_file(), reason="needs the source tree")
def test_sinklab_openmp_switch_fails_loudly():
    rc, out = run_setup({"SINKLAB_OPENMP": "yes"})
    assert rc != 0 and "SINKLAB_OPENMP='yes' must be 0, 1 or auto" in out
    # a compiler with no OpenMP (here: one that compiles nothing) and SINKLAB_OPENMP=1
    rc, out = run_setup({"SINKLAB_OPENMP": "1", "CC": "false"})
    assert rc != 0 and "SINKLAB_OPENMP=1 but false has no usable OpenMP" in out
