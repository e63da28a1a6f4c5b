"""The runtime of the C core, sinklab's one door to it outside the model and the trainer: OpenMP
threads (:func:`set_num_threads`, :func:`get_num_threads`, :func:`threads`), SIGTERM handled as
Ctrl-C (:func:`sigterm_as_interrupt`), the SIMD kernel
family (:func:`simd`), how the extension was built (:func:`build_info`) and the quantized
block decoder (:func:`quant_block_size`, :func:`dequantize`).

Importing this module loads ``_core`` (and libgomp with it), after setting libgomp's spin count,
and applies ``SINKLAB_NUM_THREADS``; ``import sinklab`` imports it first.
"""
from __future__ import annotations

import contextlib
import os
import platform
import signal
import threading
import warnings
from typing import Any, Dict, Iterator, Tuple

import numpy as np

__version__ = "0.1.0"

# How long an OpenMP thread spins before it sleeps while waiting for work. Spinning long takes a
# shared core from other processes, and a team whose thread shares a core with another process
# then stalls at every join; not spinning at all leaves the worker asleep when the next product
# starts, and waking a virtual CPU can take longer than a whole small product. Measured with one
# of two cores busy (benchmarks/RESULTS.md, "Under contention"), 2 threads over 1 thread at
# T = 512: libgomp's default 300000 spins 1.41x, 30000 1.53x, 3000 1.04x, 0 (passive) 0.97x but
# then often no 2-thread speed-up even on an idle machine (1.18 s against 1.25 s on one thread).
# libgomp reads this when it is loaded, i.e. at the import of _core below (sinklab/__init__
# imports this module first, before any other module can load _core); a choice the user made
# (GOMP_SPINCOUNT or OMP_WAIT_POLICY) is kept.
if "GOMP_SPINCOUNT" not in os.environ and "OMP_WAIT_POLICY" not in os.environ:
    os.environ["GOMP_SPINCOUNT"] = "3000"

from . import _core  # noqa: E402


def set_num_threads(n: int) -> None:
    """Sets the number of OpenMP threads (``n >= 1``) every later C-core call uses.

    The setting is process-wide: it applies to calls from every Python thread, not only the
    one that set it (each call reads it once, when it starts), except a thread inside
    :func:`threads`, whose own count wins. Results are bitwise identical for any ``n``. The
    environment variable ``SINKLAB_NUM_THREADS`` sets it at import; without it the default is
    OpenMP's (``OMP_NUM_THREADS`` or the core count).
    """
    _core.set_num_threads(int(n))


def get_num_threads() -> int:
    """The thread count a C-core call started now from this Python thread uses: the count of
    an enclosing :func:`threads` block, else the process-wide :func:`set_num_threads` one."""
    return _core.get_num_threads()


@contextlib.contextmanager
def threads(n: int) -> Iterator[None]:
    """Per-call thread count: C-core calls this Python thread starts inside the block use ``n``
    OpenMP threads, whatever other threads use at the same time::

        with sl.threads(1):
            model.run(ids)          # one core, while another thread runs with the default

    The count belongs to the OS thread (blocks nest, the previous count comes back on exit);
    calls started by other Python threads keep theirs. Results are bitwise the same for any count.
    """
    n = int(n)
    if n < 1:
        raise ValueError(f"number of threads must be >= 1, got {n}")
    previous = _core.set_thread_num_threads(n)
    try:
        yield
    finally:
        _core.set_thread_num_threads(previous)


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, a batch scheduler's time limit or ``scancel``) raised the way Ctrl-C is,
    inside :func:`sigterm_as_interrupt`: whatever checkpoints, records or cleans up on
    KeyboardInterrupt does so for it too. The CLI exits 143 (128 + SIGTERM)."""


def _raise_terminated(sig: int, frame: Any) -> None:
    raise Terminated("terminated (SIGTERM)")


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block SIGTERM raises :class:`Terminated` (a KeyboardInterrupt) instead of ending
    the process at once, so ``finally`` blocks run: a campaign records its finished runs, a run
    removes its half-written checkpoint. A long C-core call stops for it as for Ctrl-C (between
    layers, within a second). The previous handler comes back after the block. Main thread only
    (Python runs signal handlers there); elsewhere the block runs unchanged."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    prev = signal.signal(signal.SIGTERM, _raise_terminated)
    guarded = _core.guard_sigterm(True)
    try:
        yield
    finally:
        _core.guard_sigterm(guarded)
        signal.signal(signal.SIGTERM, prev)


def simd() -> str:
    """The kernel family in use: ``"avx512"``, ``"avx2"`` or ``"generic"`` (portable C).

    Chosen at run time, the best the CPU has (AVX-512 F/BW/VL/DQ, then AVX2+FMA); the
    environment variable ``SINKLAB_SIMD=generic|avx2|avx512`` read at import forces a lower
    level (a level the CPU lacks falls back to the best it has).
    """
    return _core.simd()


# _OPENMP dates of the OpenMP specifications (the compiler's macro, see build_info)
_OPENMP_VERSIONS = {200505: "2.5", 200805: "3.0", 201107: "3.1", 201307: "4.0", 201511: "4.5",
                    201811: "5.0", 202011: "5.1", 202111: "5.2", 202411: "6.0"}


def cpu_name() -> str:
    """The CPU model (``/proc/cpuinfo``'s "model name", e.g. ``"AMD EPYC"``), else what the
    platform module knows: what a benchmark or a training record says it ran on."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def build_info() -> Dict[str, Any]:
    """How this sinklab was built and what it runs with: the facts to quote in a bug report.

    Compile-time facts come from the C extension itself (the compiler's own macros, the flags
    setup.py passed in), not from guesses about the current machine. Keys:

    - ``version``: the sinklab version.
    - ``compiler``: ``"<family> <version>"`` (e.g. ``"gcc 12.2.0"``, ``"clang 14.0.6"``), from
      ``__clang__``/``__GNUC__``; ``compiler_family``, ``compiler_version``, ``compiler_banner``
      (``__VERSION__``) and ``cc`` (the command setuptools ran, ``CC`` when set).
    - ``cflags``: the compile flags used (Python's own plus sinklab's; never ``-march=native``).
    - ``openmp``: whether the kernels are OpenMP-parallel; ``openmp_date`` (the ``_OPENMP``
      macro, e.g. 201511) and ``openmp_version`` (``"4.5"``), both None without OpenMP;
      ``openmp_request``: ``SINKLAB_OPENMP`` at build time (``auto``, ``0`` or ``1``).
    - ``threads``: the threads a C-core call uses now (:func:`get_num_threads`);
      ``max_threads``: ``omp_get_max_threads()`` (1 without OpenMP); ``num_procs``:
      ``omp_get_num_procs()`` (None without OpenMP).
    - ``simd``: the kernel family in use (:func:`simd`); ``simd_best``: the best this CPU
      supports; ``cpu_features``: the x86 features behind that choice (avx, avx2, fma,
      avx512f/bw/vl/dq -> bool; empty on other CPUs), and those of the low-precision kernels,
      read from CPUID and XCR0: avx512_bf16 (what ``precision="bf16"`` runs on; without it the
      portable emulation gives the same bits), avx512_vnni, amx_bf16, amx_int8 (no AMX kernel
      exists yet).
    - ``blas``: ``"none"``: products run on sinklab's own SGEMM kernels, no BLAS is linked.
    - ``numpy_build`` / ``numpy_runtime``: the NumPy version compiled against / imported now;
      ``numpy_build_abi``, ``numpy_target_api`` (the oldest NumPy C API the build supports),
      ``numpy_runtime_abi``, ``numpy_runtime_api``: the C ABI/API version numbers.
    - ``platform``, ``machine``, ``python``: where it runs now.
    """
    c = _core.build_info()
    date = c["openmp_date"]
    return {
        "version": __version__,
        "compiler": f"{c['compiler_family']} {c['compiler_version']}",
        "compiler_family": c["compiler_family"],
        "compiler_version": c["compiler_version"],
        "compiler_banner": c["compiler_banner"],
        "cc": c["cc"],
        "cflags": c["cflags"],
        "openmp": bool(c["openmp"]),
        "openmp_date": date,
        "openmp_version": None if date is None else _OPENMP_VERSIONS.get(date, str(date)),
        "openmp_request": c["openmp_request"],
        "threads": get_num_threads(),
        "max_threads": c["omp_max_threads"],
        "num_procs": c["omp_num_procs"],
        "simd": c["simd"],
        "simd_best": c["simd_best"],
        "cpu_features": dict(c["cpu_features"]),
        "blas": "none",
        "numpy_build": c["numpy_build"],
        "numpy_build_abi": c["numpy_build_abi"],
        "numpy_target_api": c["numpy_target_api"],
        "numpy_runtime": np.__version__,
        "numpy_runtime_abi": c["numpy_runtime_abi"],
        "numpy_runtime_api": c["numpy_runtime_api"],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": platform.python_version(),
    }


def quant_block_size(type_id: int) -> Tuple[int, int]:
    """(elements, bytes) of one block of ggml type ``type_id`` (F32: (1, 4)), as the C core's
    block decoder (csrc/quant.h) lays it out; ValueError for a type the core does not decode."""
    return tuple(int(x) for x in _core.quant_block_size(int(type_id)))  # type: ignore[return-value]


def dequantize(type_id: int, data: np.ndarray, n: int) -> np.ndarray:
    """The first ``n`` values of ``data`` (1-D C-contiguous uint8, whole blocks of ggml type
    ``type_id``) decoded to a new 1-D float32 array of ``n`` values by the C core's block
    decoder, the one its matrix products use; the core checks the sizes before allocating."""
    return _core.dequantize(int(type_id), data, int(n))


def tensor_schema() -> Tuple[Tuple[str, str, str, Tuple[str, ...], bool, str], ...]:
    """The C core's tensor schema (csrc/model.h's X-macro tables): one ``(scope, key, kind,
    shape, required, role)`` row per tensor, scope ``"global"`` or ``"layer"``, shape as
    dimension names; the one list of weights and gradients the core parses."""
    return tuple(_core.tensor_schema())


# Told once, when sinklab is imported (this module is imported only then).
if not _core.has_openmp:
    warnings.warn("sinklab was built without OpenMP ("
                  + ("SINKLAB_OPENMP=0" if _core.build_info()["openmp_request"] == "0" else "the compiler had none")
                  + "): kernels run on one thread; see sinklab.build_info()")
if os.environ.get("SINKLAB_SIMD", "auto") not in ("auto", "generic", "avx2", "avx512"):
    warnings.warn(f"SINKLAB_SIMD={os.environ['SINKLAB_SIMD']!r} is not one of auto, generic, avx2, avx512: "
                  f"using {_core.simd()}")
if os.environ.get("SINKLAB_NUM_THREADS"):
    set_num_threads(int(os.environ["SINKLAB_NUM_THREADS"]))
