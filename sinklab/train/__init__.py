"""Training small LLaMA-style models from scratch (the paper's §5 pre-training experiments in
miniature): the C engine (:mod:`.engine`), the corpus and its packing (:mod:`.corpus`,
:mod:`.packing`)."""
from .engine import AdamW, Trainer, llama_config, lr_schedule, param_layout

__all__ = ["AdamW", "Trainer", "llama_config", "lr_schedule", "param_layout"]
