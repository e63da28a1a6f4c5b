"""Model families: the canonical configuration (:class:`config.ModelConfig`), RoPE frequencies
(:mod:`rope`), and one module per family that maps Hugging Face and GGUF tensor names onto the
canonical schema the C core reads (:mod:`llama`). To add a family, add a module like
``llama.py`` and teach the loaders in :mod:`sinklab.io` to pick it by architecture name."""
