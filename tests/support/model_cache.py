"""The registered real models, each fetched (verified) and loaded once per test session: several
test files use the same ones, and loading Qwen2.5 or Gemma 3 costs seconds. The 1.5B model only
with SINKLAB_LARGE_TESTS=1; a model that cannot be fetched skips locally and fails in CI."""
import functools
import os
from pathlib import Path

import pytest

from tests.support.required import unavailable

LARGE = os.environ.get("SINKLAB_LARGE_TESTS") == "1"
LARGE_MODELS = ("qwen2.5-coder-1.5b-instruct",)


def registered_names():
    """Every registered name, the large ones marked to skip unless SINKLAB_LARGE_TESTS=1."""
    from sinklab.io.registry import MODELS

    return [pytest.param(n, marks=pytest.mark.skipif(n in LARGE_MODELS and not LARGE,
                                                     reason="large model: set SINKLAB_LARGE_TESTS=1"))
            for n in MODELS]


@functools.lru_cache(maxsize=None)
def _fetch(name: str) -> Path:
    from sinklab.io import registry

    return registry.fetch(name, quiet=True)


def real_path(name: str) -> Path:
    """Path of the registered model ``name`` (a file, or a folder for a Hugging Face model),
    fetched and verified once per session."""
    try:
        return _fetch(name)
    except Exception as e:  # offline, no index, checksum mismatch
        unavailable(f"{name} could not be fetched: {e}")


@functools.lru_cache(maxsize=None)
def _load(name: str):
    from sinklab.model import load   # not sinklab.load, which a test may patch to come here

    return load(name, quiet=True)


def real_model(name: str):
    """The registered model ``name``, fetched (verified) and loaded once per session. Shared by
    every test that asks: tests must not change it (a sinklab Model holds no run state)."""
    real_path(name)
    return _load(name)


@functools.lru_cache(maxsize=None)
def _load_file(path: str):
    from sinklab.model import load

    return load(path, quiet=True)


def model_at(path):
    """The sinklab model of the file or folder ``path``, loaded once per session (its ``name``
    is the file's, as ``sinklab.load(path)`` gives; ``real_model`` gives the registered name)."""
    return _load_file(str(path))
