"""Model families: the canonical configuration (:class:`config.ModelConfig`), RoPE frequencies
(:mod:`rope`), weights kept in file form (:mod:`tensors`), the canonical tensor schema
(:mod:`base`), and one module per family mapping Hugging Face and GGUF names onto it:
:mod:`llama` (LLaMA, Mistral), :mod:`qwen2` (Qwen2, Qwen3), :mod:`gemma` (Gemma 1/2/3),
:mod:`gpt2`, :mod:`bert`.

Each family module states ``NAME``, ``HF_TYPES`` (config.json ``model_type``), ``GGUF_ARCHS``
(``general.architecture``), ``config_from_hf(config_dict, path)``, ``config_from_gguf(meta)``,
``weights(cfg, src)`` and ``rope_layout(fmt)``. To add a family, add such a module and list it
in ``FAMILIES``; the loaders pick it by architecture name.
"""
from __future__ import annotations

from types import ModuleType
from typing import Tuple

from . import bert, gemma, gpt2, llama, qwen2

FAMILIES: Tuple[ModuleType, ...] = (llama, qwen2, gemma, gpt2, bert)
SUPPORTED_HF_TYPES: Tuple[str, ...] = tuple(t for f in FAMILIES for t in f.HF_TYPES)
SUPPORTED_GGUF_ARCHS: Tuple[str, ...] = tuple(a for f in FAMILIES for a in f.GGUF_ARCHS)


class UnsupportedArchitecture(ValueError):
    """A model file of an architecture no family module reads; the message names it and the
    supported list."""


def for_hf_type(model_type: str, where: str = "") -> ModuleType:
    """The family reading a Hugging Face config.json of ``model_type``; ValueError naming it
    and the supported list otherwise
    (:class:`UnsupportedArchitecture`)."""
    for f in FAMILIES:
        if model_type in f.HF_TYPES:
            return f
    raise UnsupportedArchitecture(f"unsupported architecture {model_type!r}{' in ' + where if where else ''} "
                     f"(supported: {', '.join(SUPPORTED_HF_TYPES)})")


def for_gguf_arch(arch: str) -> ModuleType:
    """The family reading a GGUF file of ``general.architecture`` ``arch``; ValueError naming
    it and the supported list otherwise
    (:class:`UnsupportedArchitecture`)."""
    for f in FAMILIES:
        if arch in f.GGUF_ARCHS:
            return f
    raise UnsupportedArchitecture(f"unsupported architecture {arch!r} (supported: {', '.join(SUPPORTED_GGUF_ARCHS)})")


def family_of(name: str) -> ModuleType:
    """The family module called ``name`` (``ModelConfig.family``)."""
    for f in FAMILIES:
        if f.NAME == name:
            return f
    raise ValueError(f"unknown model family {name!r} (known: {', '.join(f.NAME for f in FAMILIES)})")
