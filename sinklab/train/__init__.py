"""Training small LLaMA-style models from scratch (the paper's §5 pre-training experiments in
miniature): the C engine (:mod:`.engine`), the public-domain corpus and its BPE tokenizer
(:mod:`.corpus`), and the paper's packing strategies (:mod:`.packing`)."""
from .corpus import Corpus, prepare_corpus
from .engine import AdamW, Trainer, llama_config, lr_schedule, param_layout
from .packing import Packer, batch_size_for, tokens_per_step

__all__ = ["AdamW", "Corpus", "Packer", "Trainer", "batch_size_for", "llama_config", "lr_schedule",
           "param_layout", "prepare_corpus", "tokens_per_step"]
