"""Tokenizers for the models sinklab runs, built on Hugging Face ``tokenizers`` from local files.

Two sources, no network and no pickle:

* a GGUF file: the vocabulary, merges, scores, token types and special ids stored as
  ``tokenizer.ggml.*`` metadata, interpreted the way llama.cpp (``src/llama-vocab.cpp``) does;
* a Hugging Face folder: ``tokenizer.json`` plus, when present, ``tokenizer_config.json``,
  ``special_tokens_map.json`` and ``config.json`` for the BOS/EOS ids and the BOS default.

::

    tok = Tokenizer.from_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")
    ids = tok.encode("<|im_start|>user\\nhi<|im_end|>")   # np.ndarray, int64, shape (T,)
    tok.decode(ids)                                       # the same text back

Supported GGUF tokenizers (``tokenizer.ggml.model``):

``"gpt2"``
    Byte-level BPE with the file's merges. The text is split before BPE by the regexes llama.cpp
    uses for ``tokenizer.ggml.pre`` (see ``_BPE_PRE``); an unknown ``pre`` raises ``ValueError``
    (llama.cpp would fall back to ``"default"`` with a warning). A file without the key is read as
    ``"default"``, as llama.cpp does.
``"llama"``
    SentencePiece-style BPE: spaces become ``▁``, a ``▁`` is prepended to the text when
    ``tokenizer.ggml.add_space_prefix`` is true (the default), pairs merge best-score first
    (merges are rebuilt from ``tokenizer.ggml.scores`` when the file has none), and characters
    outside the vocabulary fall back to ``<0xNN>`` byte tokens.

In both, tokens of type 3 (control, e.g. ``<|im_start|>``) are registered as special added tokens
and tokens of type 4 (user-defined, e.g. ``<think>``) as non-special added tokens, so either is
always matched whole in the input text: this is llama.cpp with ``parse_special=True`` and
transformers' GGUF conversion.

SentencePiece vocabularies follow llama.cpp (and ``sentencepiece`` itself) rather than
``transformers``' GGUF conversion where the two differ: text starting with a space gets its own
extra ``▁`` (``" the"`` -> ``▁▁the``), and text right after a special token gets a ``▁`` prefix
too (``"<s>the"`` -> ``<s> ▁the``). ``transformers`` (a ``Metaspace`` pre-tokenizer with
``prepend_scheme="first"``) does neither; everywhere else the ids are the same.

User-defined tokens are matched longest first, as llama.cpp and ``sentencepiece`` do: Gemma 3's
whitespace-run tokens (up to 31 spaces) split 40 spaces into 31 + 9, where ``transformers``'
GGUF conversion, which turns the runs into BPE merges of equal score, gives 16 + 24. Checked
against ``sentencepiece`` itself on Gemma 3's vocabulary (``tests/test_tokenizer.py``).

A Hugging Face folder with no BOS but a ``[CLS]`` (BERT) uses ``[CLS]`` as its BOS: ``bos=True``
puts it first; the trailing ``[SEP]`` is never added (see :meth:`Tokenizer.from_hf_dir`).

Other deliberate choices: tokens of type 2 (``<unk>``) are not matched in the text (llama.cpp
matches them, transformers does not); ``decode`` writes special tokens out and never applies
llama.cpp's ``clean_spaces`` clean-up, so ``decode(encode(s)) == s`` for any text with
byte-level BPE, and for SentencePiece text without special tokens (after one, the ``▁`` prefix
decodes to a space).

Layout: :mod:`.core` (the :class:`Tokenizer` class and Hugging Face folders), :mod:`.gguf_meta`
(the ``tokenizer.*`` metadata, read with :mod:`sinklab.io.gguf_reader` like the weights), :mod:`.bpe`
(byte-level BPE and llama.cpp's pre-tokenizer regexes), :mod:`.spm` (SentencePiece-style BPE).
"""
from .core import Tokenizer
from .gguf_meta import read_metadata

__all__ = ["Tokenizer", "read_metadata"]
