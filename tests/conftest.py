"""Shared fixtures. In CI (SINKLAB_REQUIRE_REFERENCE=1) a missing real model or reference stack
is a failure, never a skip: those tests are the ones that prove the numbers.

Real models and their references are session fixtures, loaded once for every module that uses
them (tests/support/model_cache.py); the Hugging Face references of GGUF files are dequantized
once and kept on disk across sessions, keyed by the file's sha256
(tests/support/reference_models.py). A sinklab Model holds no run state, so sharing one across
modules changes nothing a test sees.

Tiers (markers registered in pyproject.toml): ``slow`` (end-to-end subprocesses, notebooks, full
reports), ``real`` (needs a registered real model), ``cdriver`` (compiles and runs a C driver
from csrc/), ``large`` (a download over 1 GB), ``timing`` (asserts a wall-clock bound: run alone
after the rest). ``python -m pytest -n 2 --dist loadfile -m "not slow and not timing"`` is the
quick run for contributors; plain ``python -m pytest`` runs everything in one process.
"""
import signal
from pathlib import Path
from typing import Callable

import pytest

from tests.support.model_cache import model_at, real_model, real_path
from tests.support.required import REQUIRE, unavailable  # noqa: F401  (re-exported for tests)

SMOLLM2 = "smollm2-135m-instruct"
GEMMA3 = "gemma-3-270m"
QWEN05 = "qwen2.5-coder-0.5b-instruct"
QWEN15 = "qwen2.5-coder-1.5b-instruct"
MINILM = "all-minilm-l6-v2"

# A shell that starts the suite in the background without job control (`.ci/run &`, nohup) leaves
# SIGINT ignored, and an ignored signal stays ignored in every child: the Ctrl-C tests would then
# see no interrupt at all. A handled signal is reset to the default on exec, so children start as
# from a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def threads_restored():
    """Puts back the process's thread count after a test that sets it."""
    import sinklab as sl

    n = sl.get_num_threads()
    yield
    sl.set_num_threads(n)


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """Path to SmolLM2-135M-Instruct.Q4_1.gguf, fetched into the sinklab cache on first use."""
    from sinklab.io import registry

    try:
        return registry.fetch(SMOLLM2)
    except Exception as e:  # offline, no index, checksum mismatch
        unavailable(f"SmolLM2 GGUF could not be fetched: {e}")


@pytest.fixture(scope="session")
def smollm2_model(smollm2_gguf):
    """The sinklab model of SmolLM2-135M-Instruct (Q4_1), loaded from its path (as the tests'
    ``sinklab.load(smollm2_gguf)`` did) once per session."""
    return model_at(smollm2_gguf)


@pytest.fixture(scope="session")
def smollm2_reference(smollm2_gguf):
    """(HF fp32 eager model, HF tokenizer) of the SmolLM2 GGUF: the model dequantized by
    transformers' GGUF loader (on-disk cache), the tokenizer built by transformers from the file."""
    from tests.support import reference_models as rm

    return rm.hf_gguf_reference(str(smollm2_gguf))


@pytest.fixture(scope="session")
def real_models() -> Callable:
    """``real_models(name)``: the sinklab model of any registered name, loaded by that name
    once per session (its ``name`` is the registered one)."""
    return real_model


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    """Path to the registered Gemma 3 270M GGUF (Q4_K_M)."""
    return real_path(GEMMA3)


@pytest.fixture(scope="session")
def gemma3_model(gemma3_path):
    """The sinklab model of Gemma 3 270M, loaded from its path once per session."""
    return model_at(gemma3_path)


@pytest.fixture(scope="session")
def qwen05_path() -> Path:
    """Path to the registered Qwen2.5-Coder-0.5B-Instruct GGUF (Q4_K_M)."""
    return real_path(QWEN05)


@pytest.fixture(scope="session")
def qwen05_model(qwen05_path):
    """The sinklab model of Qwen2.5-Coder-0.5B-Instruct, loaded from its path once per session."""
    return model_at(qwen05_path)


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    """Path to the registered all-MiniLM-L6-v2 folder (safetensors fp32, BERT)."""
    return real_path(MINILM)


@pytest.fixture(scope="session")
def minilm_model(minilm_path):
    """The sinklab model of all-MiniLM-L6-v2, loaded from its folder once per session."""
    return model_at(minilm_path)


@pytest.fixture(scope="session")
def hf_gguf_reference() -> Callable:
    """``hf_gguf_reference(path)``: a new HF fp32 eager model of a GGUF file, read from the
    on-disk reference cache (dequantized by transformers on first use, keyed by the file's
    sha256). A factory, not a held object: Gemma 3 and Qwen2.5 in fp32 take 1-2 GB each, so the
    tests that compare with them hold the model only while they run (class-scoped fixtures)."""
    from tests.support import reference_models as rm

    return lambda path: rm.hf_gguf_model(str(path))


@pytest.fixture(scope="session")
def training_corpus():
    """The public-domain training corpus (sinklab.train.corpus), fetched and prepared on first use."""
    from sinklab.train import corpus as C

    try:
        return C.prepare_corpus(quiet=True)
    except C.CorpusFetchError as e:
        unavailable(f"the training corpus could not be fetched: {e}")


# a test that asks for any of these (directly or through another fixture) needs a real model
REAL_FIXTURES = frozenset({
    "smollm2_gguf", "smollm2_model", "smollm2_reference", "real_models", "gemma3_path", "gemma3_model",
    "qwen05_path", "qwen05_model", "minilm_path", "minilm_model", "hf_gguf_reference",
})


# the longest files (the quick report alone takes about 5 min): started first, so that under
# ``-n 2 --dist loadfile`` no worker is left with one of them at the end while the other idles
LONGEST_FIRST = ("test_reproduce.py", "test_notebooks.py", "test_parity_real.py", "test_sweep.py")


def pytest_configure(config):
    """Keeps the order below under xdist: its loadfile scheduler otherwise re-sorts the files by
    their number of tests (``--loadscope-reorder``, on by default since xdist 3.6), which started
    the 4-test quick report last, leaving one worker running it alone for minutes."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    """Marks ``real`` every test whose fixtures reach a real model (tests that fetch one by name
    in their body carry the mark themselves), and orders the files longest first: the files of
    LONGEST_FIRST, then those holding a ``slow`` test, then the rest, each file's tests kept
    together and in their order (module fixtures are set up once)."""
    for item in items:
        if REAL_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.real)
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}

    def rank(item):
        name = item.path.name
        if name in LONGEST_FIRST:
            return LONGEST_FIRST.index(name)
        return len(LONGEST_FIRST) + (0 if item.path in slow_files else 1)

    items.sort(key=rank)  # stable: within a file, the collection order
