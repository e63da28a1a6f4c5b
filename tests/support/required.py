"""The rule for missing references: a skip locally, a failure where SINKLAB_REQUIRE_REFERENCE=1
(CI), so that a broken install cannot turn the tests that prove the numbers into silent skips."""
import os
from typing import NoReturn

import pytest

REFERENCE_ENV = "SINKLAB_REQUIRE_REFERENCE"
REQUIRE = os.environ.get(REFERENCE_ENV, "").strip() == "1"


def unavailable(reason: str) -> NoReturn:
    """Skips the calling test locally; fails it when the reference is required."""
    if REQUIRE:
        pytest.fail(f"required reference unavailable: {reason}")
    pytest.skip(reason)
