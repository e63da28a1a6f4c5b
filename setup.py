"""Builds sinklab._core, the C extension, from csrc/*.c with OpenMP where the compiler has it.

Never -march=native: the kernels for AVX2+FMA carry their own target attributes and are picked
at run time, so one build runs on any x86-64 machine (and elsewhere through the portable path).
"""
import glob
import os
import shutil
import subprocess
import sys
import tempfile

import numpy
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

BASE_FLAGS = ["-std=c11", "-O3", "-Wall", "-Wextra", "-fno-strict-aliasing"]


def _compiler_has_openmp(cc) -> bool:
    src = "#include <omp.h>\nint main(void){return omp_get_max_threads() > 0 ? 0 : 1;}\n"
    tmp = tempfile.mkdtemp()
    try:
        path = os.path.join(tmp, "t.c")
        with open(path, "w") as f:
            f.write(src)
        cmd = list(cc) + ["-fopenmp", path, "-o", os.path.join(tmp, "t")]
        return subprocess.run(cmd, capture_output=True).returncode == 0
    except OSError:
        return False
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class BuildExt(build_ext):
    def build_extensions(self):
        cc = getattr(self.compiler, "compiler_so", None) or ["cc"]
        omp = _compiler_has_openmp(cc[:1])
        for ext in self.extensions:
            ext.extra_compile_args = BASE_FLAGS + (["-fopenmp"] if omp else [])
            ext.extra_link_args = ["-fopenmp"] if omp else []
            ext.define_macros.append(("SL_HAVE_OPENMP", "1" if omp else "0"))
        if not omp:
            sys.stderr.write("sinklab: compiler has no OpenMP; building single-threaded\n")
        super().build_extensions()


setup(
    ext_modules=[
        Extension(
            "sinklab._core",
            sources=sorted(glob.glob("csrc/*.c")),
            include_dirs=[numpy.get_include(), "csrc"],
            # NumPy 2 headers, targeting the 1.23 ABI: one build runs on NumPy 1.23+ and 2.x.
            define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_23_API_VERSION"),
                           ("NPY_TARGET_VERSION", "NPY_1_23_API_VERSION")],
        )
    ],
    cmdclass={"build_ext": BuildExt},
)
