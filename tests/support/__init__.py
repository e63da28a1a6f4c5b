"""Shared test support: the independent references (tiny HF models, the HF reference of a real
GGUF cached on disk), the registered real models loaded once per session, and the
"skip locally, fail in CI" rule. Imported as ``tests.support`` (pyproject's pytest
``pythonpath`` puts the repository root on sys.path); nothing here imports a test module."""
