"""The :class:`Tokenizer` class: text <-> ids over a ``tokenizers`` backend, built from GGUF
metadata (:mod:`.gguf_meta`, :mod:`.bpe`, :mod:`.spm`) or a Hugging Face folder."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, Optional, Union

import numpy as np

from .bpe import build_gpt2
from .gguf_meta import SUPPORTED_MODELS, opt_id, read_metadata, register_added_tokens, token_list, token_types
from .spm import build_llama

# ---------------------------------------------------------------------------------------------
# Hugging Face folders
# ---------------------------------------------------------------------------------------------


def _load_json(path: Path) -> Dict[str, Any]:
    if not path.is_file():
        return {}
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    return data if isinstance(data, dict) else {}


def _token_content(value: Any) -> Optional[str]:
    """``"<s>"`` or ``{"content": "<s>", ...}`` (an AddedToken as saved) -> ``"<s>"``."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


# ---------------------------------------------------------------------------------------------
# The public class
# ---------------------------------------------------------------------------------------------


class Tokenizer:
    """Text <-> token ids for one model, backed by a ``tokenizers.Tokenizer``.

    Build it with :meth:`from_gguf` or :meth:`from_hf_dir`.

    Attributes:
        backend: the ``tokenizers.Tokenizer`` doing the work (no truncation, no padding, and
            ``encode`` never lets its post-processor add special tokens).
        bos_token_id: id of the beginning-of-sequence token, or ``None`` if the model has none.
        eos_token_id: id of the end-of-sequence token, or ``None``.
        vocab_size: number of token ids, ``0 <= id < vocab_size`` (may be smaller than the
            model's embedding matrix when that is padded).
        add_bos_default: whether the model's own runtime (llama.cpp for a GGUF, the
            ``transformers`` tokenizer for a folder) puts BOS in front of a prompt by default.
            ``encode`` only adds BOS when asked: pass ``bos=tok.add_bos_default`` (or ``None``)
            to follow the model.
        source: where the tokenizer came from (a path, or ``"<GGUFReader>"``).
    """

    def __init__(
        self,
        backend: Any,
        *,
        bos_token_id: Optional[int] = None,
        eos_token_id: Optional[int] = None,
        vocab_size: Optional[int] = None,
        add_bos_default: bool = False,
        source: str = "",
    ) -> None:
        backend.no_truncation()
        backend.no_padding()
        self.backend = backend
        self.vocab_size = int(vocab_size if vocab_size is not None else backend.get_vocab_size(with_added_tokens=True))
        self.bos_token_id = None if bos_token_id is None else int(bos_token_id)
        self.eos_token_id = None if eos_token_id is None else int(eos_token_id)
        self.add_bos_default = bool(add_bos_default)
        self.source = source

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def from_gguf(cls, reader_or_path: Any) -> "Tokenizer":
        """Build the tokenizer stored in a GGUF file's ``tokenizer.ggml.*`` metadata.

        Args:
            reader_or_path: an open :class:`~sinklab.io.gguf_reader.GGUFFile` (:func:`sinklab.load`
                passes the one it reads the weights with) or ``gguf.GGUFReader``, or a path
                (``str`` / ``os.PathLike``) to a ``.gguf`` file, opened with
                :func:`sinklab.io.gguf_loader.open_gguf`.

        Returns:
            A :class:`Tokenizer`. ``bos_token_id`` / ``eos_token_id`` come from
            ``tokenizer.ggml.bos_token_id`` / ``eos_token_id`` (``None`` when absent or out of
            range); ``add_bos_default`` from ``tokenizer.ggml.add_bos_token``, else llama.cpp's
            default for the tokenizer type (True for SentencePiece and Llama-3-style BPE).

        Raises:
            ValueError: the file is not a GGUF, carries no tokenizer, or uses a tokenizer model
                (``tokenizer.ggml.model``) or pre-tokenizer (``tokenizer.ggml.pre``) not supported
                here; the message names it.
        """
        if hasattr(reader_or_path, "fields"):
            source = str(getattr(reader_or_path, "path", "<GGUFReader>"))
        else:
            source = os.fspath(reader_or_path)
        meta = read_metadata(reader_or_path)
        return cls._from_gguf_metadata(meta, source)

    @classmethod
    def _from_gguf_metadata(cls, meta: Dict[str, Any], source: str) -> "Tokenizer":
        model = meta.get("tokenizer.ggml.model")
        if model not in SUPPORTED_MODELS:
            raise ValueError(
                f"unsupported GGUF tokenizer model tokenizer.ggml.model={model!r} in {source}; "
                f"supported: {list(SUPPORTED_MODELS)}"
            )
        tokens = token_list(meta)
        types = token_types(meta, len(tokens))
        if model == "gpt2":
            backend, add_bos = build_gpt2(meta, tokens, types)
        else:
            backend, add_bos = build_llama(meta, tokens, types)
        register_added_tokens(backend, tokens, types)
        if "tokenizer.ggml.add_bos_token" in meta:
            add_bos = bool(meta["tokenizer.ggml.add_bos_token"])
        n = len(tokens)
        return cls(
            backend,
            bos_token_id=opt_id(meta, "tokenizer.ggml.bos_token_id", n),
            eos_token_id=opt_id(meta, "tokenizer.ggml.eos_token_id", n),
            vocab_size=n,
            add_bos_default=add_bos,
            source=source,
        )

    @classmethod
    def from_hf_dir(cls, path: Union[str, os.PathLike]) -> "Tokenizer":
        """Load a Hugging Face tokenizer folder (or a ``tokenizer.json`` file path).

        ``tokenizer.json`` is required. BOS/EOS are looked up, in order, in
        ``tokenizer_config.json`` (``bos_token`` / ``eos_token``), ``special_tokens_map.json``
        and ``config.json`` (``bos_token_id`` / ``eos_token_id``; a list of EOS ids gives its
        first). ``add_bos_default`` is ``tokenizer_config.json``'s ``add_bos_token`` when set,
        else whether the file's post-processor puts BOS in front of a sequence.

        A tokenizer with no BOS but a ``cls_token`` (BERT and its kin) uses ``[CLS]`` as its
        BOS: ``encode(text, bos=True)`` is ``[CLS]`` followed by the text's ids, and
        ``add_bos_default`` is True when the post-processor puts ``[CLS]`` first (it does for
        BERT). The trailing ``[SEP]`` that ``transformers`` also adds is never added (``encode``
        adds no token but BOS), so ``encode(text, bos=True)`` is transformers' default encoding
        without its last id. ``eos_token_id`` is then ``[SEP]`` (when the folder names one).

        Raises:
            FileNotFoundError: there is no ``tokenizer.json``.
        """
        from tokenizers import Tokenizer as _Backend

        p = Path(path)
        folder, tj = (p.parent, p) if p.is_file() else (p, p / "tokenizer.json")
        if not tj.is_file():
            raise FileNotFoundError(f"no tokenizer.json in {folder}")
        backend = _Backend.from_file(str(tj))
        tcfg = _load_json(folder / "tokenizer_config.json")
        smap = _load_json(folder / "special_tokens_map.json")
        mcfg = _load_json(folder / "config.json")

        def lookup(name: str) -> Optional[int]:
            for source in (tcfg, smap):
                content = _token_content(source.get(name))
                if content is not None:
                    tid = backend.token_to_id(content)
                    if tid is not None:
                        return tid
            v = mcfg.get(f"{name}_id")
            if isinstance(v, list):
                v = v[0] if v else None
            return int(v) if isinstance(v, int) and not isinstance(v, bool) else None

        bos, eos = lookup("bos_token"), lookup("eos_token")
        if bos is None:
            # BERT-style encoders have no BOS but start every input with [CLS], the token their
            # first position always held in training: that is their fixed first token.
            bos = lookup("cls_token")
            if eos is None and bos is not None:
                eos = lookup("sep_token")  # and end it with [SEP]
        if isinstance(tcfg.get("add_bos_token"), bool):
            add_bos = tcfg["add_bos_token"]
        else:
            add_bos = False
            if bos is not None:
                with_special = backend.encode("a", add_special_tokens=True).ids
                add_bos = bool(with_special) and with_special[0] == bos and backend.encode(
                    "a", add_special_tokens=False
                ).ids[:1] != [bos]
        return cls(backend, bos_token_id=bos, eos_token_id=eos, add_bos_default=add_bos, source=str(folder))

    # -- use ----------------------------------------------------------------------------------

    def encode(self, text: str, bos: Optional[bool] = False) -> np.ndarray:
        """Token ids of ``text``.

        Args:
            text: the text; special tokens written in it (e.g. ``"<|im_start|>"``) become their
                single ids.
            bos: prepend ``bos_token_id``. ``None`` follows ``add_bos_default``. No other
                special token (EOS, template) is ever added.

        Returns:
            ``np.ndarray`` of dtype ``int64`` and shape ``(T,)`` (``T`` may be 0 for ``""``).

        Raises:
            TypeError: ``text`` is not a ``str``.
            ValueError: ``bos`` is requested but the model has no BOS token.
        """
        if not isinstance(text, str):
            raise TypeError(f"encode() takes a str, not {type(text).__name__}")
        if bos is None:
            bos = self.add_bos_default
        ids = self.backend.encode(text, add_special_tokens=False).ids
        if bos:
            if self.bos_token_id is None:
                raise ValueError(f"bos=True, but this tokenizer ({self.source}) has no BOS token")
            ids = [self.bos_token_id] + ids
        return np.asarray(ids, dtype=np.int64).reshape(-1)

    def decode(self, ids: Any) -> str:
        """Text of a sequence of token ids (any 1-D integer array-like, or a single int).

        Special tokens are written out (``"<|im_end|>"``), so ``decode(encode(s)) == s`` for
        any text with byte-level BPE vocabularies, and for SentencePiece ones when ``s`` has no
        special tokens (the word-start ``▁`` after a special token decodes to a space). Pieces
        that do not complete a UTF-8 character decode to U+FFFD.

        Raises:
            ValueError: ``ids`` is not 1-D integer data, or an id is outside ``[0, vocab_size)``.
        """
        arr = np.asarray(ids)
        if arr.ndim == 0:
            arr = arr.reshape(1)
        if arr.ndim != 1:
            raise ValueError(f"decode() takes a 1-D sequence of ids, got shape {arr.shape}")
        if arr.size == 0:
            return ""
        if not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"decode() takes integer ids, got dtype {arr.dtype}")
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi >= self.vocab_size:
            bad = lo if lo < 0 else hi
            raise ValueError(f"token id {bad} is outside [0, {self.vocab_size})")
        return self.backend.decode(arr.tolist(), skip_special_tokens=False)

    def id_to_token(self, token_id: int) -> Optional[str]:
        """The vocabulary string of one id (byte-level spelling, e.g. ``"Ġthe"``), or ``None``."""
        return self.backend.id_to_token(int(token_id))

    def token_to_id(self, token: str) -> Optional[int]:
        """The id of one vocabulary string, or ``None`` if it is not a token."""
        return self.backend.token_to_id(token)

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return (
            f"Tokenizer(vocab_size={self.vocab_size}, bos_token_id={self.bos_token_id}, "
            f"eos_token_id={self.eos_token_id}, add_bos_default={self.add_bos_default}, source={self.source!r})"
        )
