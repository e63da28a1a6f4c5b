"""The registered real models, each loaded once per test session (several test files use the
same ones; loading Qwen2.5 or Gemma 3 costs seconds). The 1.5B model only with
SINKLAB_LARGE_TESTS=1; a model that cannot be fetched skips locally and fails in CI."""
import functools
import os

import pytest

from conftest import unavailable

LARGE = os.environ.get("SINKLAB_LARGE_TESTS") == "1"
LARGE_MODELS = ("qwen2.5-coder-1.5b-instruct",)


def registered_names():
    """Every registered name, the large ones marked to skip unless SINKLAB_LARGE_TESTS=1."""
    from sinklab.io.registry import MODELS

    return [pytest.param(n, marks=pytest.mark.skipif(n in LARGE_MODELS and not LARGE,
                                                     reason="large model: set SINKLAB_LARGE_TESTS=1"))
            for n in MODELS]


@functools.lru_cache(maxsize=None)
def _load(name: str):
    from sinklab.model import load   # not sinklab.load, which a test may patch to come here

    return load(name, quiet=True)


def real_model(name: str):
    """The registered model ``name``, fetched (verified) and loaded once per session."""
    from sinklab.io import registry

    try:
        registry.fetch(name, quiet=True)
    except Exception as e:  # offline, no index, checksum mismatch
        unavailable(f"{name} could not be fetched: {e}")
    return _load(name)
