"""Command line of the fuzz harness tests/support/fuzz_atheris.py (its docstring says what it does and
how to run it); the harness lives in tests/support/ because tests/test_fuzz_parsers.py runs a
short version of it.

    python benchmarks/fuzz_atheris.py --help
"""
import os
import sys

# the repository root, so that tests.support imports from a checkout
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.support.fuzz_atheris import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
