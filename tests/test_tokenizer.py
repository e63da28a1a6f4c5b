"""sinklab.tokenizer against independent references.

* The real SmolLM2-135M-Instruct GGUF (byte-level BPE, pre "smollm") against transformers' own
  GGUF tokenizer conversion (``AutoTokenizer.from_pretrained(dir, gguf_file=...)``).
* Byte-level GGUFs with SmolLM2's vocabulary under other ``tokenizer.ggml.pre`` values against
  the same transformers conversion, and ``"default"`` against llama.cpp's documented splits.
* A SentencePiece ("llama") GGUF converted, as llama.cpp's converter does, from a real
  ``sentencepiece`` BPE model trained here: against ``sentencepiece`` itself, and against
  transformers' conversion where transformers and llama.cpp agree (see test docstrings).
* ``from_hf_dir`` on the folder transformers saves.
"""
import io
import json
import os
import time
from pathlib import Path

import numpy as np
import pytest

from sinklab.tokenizer import Tokenizer, read_metadata

import gguf  # a core dependency: its absence is a failure, not a skip

from tests.support.reference_models import require

REQUIRE = os.environ.get("SINKLAB_REQUIRE_REFERENCE") == "1"


def _unavailable(reason):
    """Skip locally; fail when the reference stack is required (same rule as conftest)."""
    if REQUIRE:
        pytest.fail(f"required reference unavailable: {reason}")
    pytest.skip(reason)


def _transformers():
    try:
        import transformers  # noqa: F401
        from transformers import AutoTokenizer
    except Exception as e:  # not installed / broken install
        _unavailable(f"transformers not importable: {e}")
    return AutoTokenizer


def _hf_from_gguf(path: Path):
    AutoTokenizer = _transformers()
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def _hf_ids(hf, text):
    return list(hf(text, add_special_tokens=False)["input_ids"])


LONG = (
    "Attention sinks are a curious property of trained transformers: many heads put most of "
    "their attention on the first token of the sequence, whatever that token is. The paper "
    "'Why do LLMs attend to the first token?' argues that this is useful, because it lets a head "
    "do nothing -- a no-op -- and so limits over-mixing of information in deep models with long "
    "contexts. We measure the sink rate (the fraction of heads whose attention on token 0 exceeds "
    "a threshold eps = 0.3), perturb inputs, and compute Jacobian norms across 30 layers.\n\n"
)
LONG = "".join(f"[{i}] " + LONG for i in range(12))  # ~6,000 characters

TEXTS = {
    "english": "The cat sat on the mat. Attention sinks are heads that attend to the first token.",
    "accents": "Café, naïve, résumé, façade — déjà vu. Straße, Ærøskøbing, ñandú, İstanbul.",
    "cjk": "注意力汇聚现象 日本語のテキストです。 한국어 문장입니다.",
    "emoji": "Sinks 🙂👍🏽 and flags 🇫🇷, a ZWJ sequence 👩‍💻 and ☃.",
    "combining": "e\u0301 versus \u00e9, A\u030a versus \u00c5",
    "space_runs": "a  b   c    d     e      f",
    "lead_trail_spaces": "   indented and trailing   ",
    "tabs": "col1\tcol2\t\tcol3\t \tend\t",
    "newlines": "line one\nline two\n\nline four\r\nwindows\r\n\r\nend\n",
    "digits": "1234567890 3.14159265358979 1,000,000 2024-11-29 007 x42y",
    "code": (
        "def softmax(x, axis=-1):\n"
        "    m = x.max(axis=axis, keepdims=True)\n"
        "    e = np.exp(x - m)\n"
        "    return e / e.sum(axis=axis, keepdims=True)\n"
        "\n"
        "class Sink:\n"
        "\tpass  # tab-indented\n"
    ),
    "contractions": "I'm sure you're right, they'll see it's fine; WE'VE DONE IT, hasn't he?",
    "special": "<|im_start|>user\nhi<|im_end|>",
    "chat": (
        "<|im_start|>system\nYou are a helpful AI assistant.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    ),
    "adjacent_specials": "<|endoftext|><|im_start|><|im_end|>text<|endoftext|>",
    "empty": "",
    "single_space": " ",
    "single_newline": "\n",
    "long": LONG,
}


# ---------------------------------------------------------------------------------------------
# SmolLM2 (real GGUF)
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smol_tok(smollm2_gguf):
    return Tokenizer.from_gguf(smollm2_gguf)


@pytest.fixture(scope="module")
def smol_hf(smollm2_gguf):
    return _hf_from_gguf(Path(smollm2_gguf))


@pytest.mark.parametrize("name", list(TEXTS))
def test_smollm2_ids_match_transformers(name, smol_tok, smol_hf):
    text = TEXTS[name]
    ids = smol_tok.encode(text)
    assert isinstance(ids, np.ndarray) and ids.dtype == np.int64 and ids.ndim == 1
    ref = _hf_ids(smol_hf, text)
    assert ids.tolist() == ref
    with_bos = smol_tok.encode(text, bos=True)
    assert with_bos.dtype == np.int64 and with_bos.tolist() == [smol_tok.bos_token_id] + ref
    assert smol_tok.decode(ids) == text
    assert smol_tok.decode(with_bos) == smol_hf.decode([smol_tok.bos_token_id] + ref)


def test_smollm2_properties(smol_tok, smol_hf):
    assert smol_tok.vocab_size == len(smol_tok) == 49152
    assert smol_tok.bos_token_id == smol_hf.bos_token_id == 1
    assert smol_tok.eos_token_id == smol_hf.eos_token_id == 2
    assert smol_tok.add_bos_default is False  # tokenizer.ggml.add_bos_token = false in this file
    # control tokens are single ids, matched anywhere in the text
    for tid, text in [(0, "<|endoftext|>"), (1, "<|im_start|>"), (2, "<|im_end|>")]:
        assert smol_tok.encode(text).tolist() == [tid]
        assert smol_tok.decode([tid]) == text
    assert smol_tok.encode("x<|im_start|>y").tolist()[1] == 1
    # SmolLM2 splits digits one by one
    digits = smol_tok.encode("31415926")
    assert len(digits) == 8 and smol_tok.decode(digits) == "31415926"
    # bos=None follows the model's default (False here)
    assert smol_tok.encode("hi", bos=None).tolist() == smol_tok.encode("hi").tolist()
    assert smol_tok.encode("").shape == (0,) and smol_tok.encode("").dtype == np.int64
    assert smol_tok.decode([]) == "" and smol_tok.decode(np.zeros(0, dtype=np.int64)) == ""


def test_smollm2_decode_inputs_and_errors(smol_tok):
    ids = smol_tok.encode("The cat sat.")
    text = smol_tok.decode(ids)
    assert smol_tok.decode(ids.tolist()) == text
    assert smol_tok.decode(ids.astype(np.int32)) == text
    assert smol_tok.decode(tuple(int(i) for i in ids)) == text
    assert smol_tok.decode(int(ids[0])) == smol_tok.decode(ids[:1])
    with pytest.raises(ValueError):
        smol_tok.decode([0, smol_tok.vocab_size])
    with pytest.raises(ValueError):
        smol_tok.decode([-1])
    with pytest.raises(ValueError):
        smol_tok.decode(np.zeros((2, 2), dtype=np.int64))
    with pytest.raises(ValueError):
        smol_tok.decode([0.5])
    with pytest.raises(TypeError):
        smol_tok.encode(b"bytes")


def test_smollm2_from_reader_equals_from_path(smollm2_gguf, smol_tok):
    reader = gguf.GGUFReader(str(smollm2_gguf))
    meta = read_metadata(reader)
    # every tokenizer key of the file, checked against gguf's own typed accessor (independent of
    # sinklab's field decoding): string arrays element by element, numeric arrays by value
    want = {k for k in reader.fields if k.startswith("tokenizer.")} | {"general.architecture"}
    assert meta.keys() == want
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
        f = reader.fields[key]
        assert meta[key] == [f.contents(i) for i in range(len(f.data))], key
    types = reader.fields["tokenizer.ggml.token_type"]
    np.testing.assert_array_equal(meta["tokenizer.ggml.token_type"], np.asarray(types.contents()))
    assert meta["tokenizer.ggml.bos_token_id"] == reader.fields["tokenizer.ggml.bos_token_id"].contents()
    assert meta["tokenizer.ggml.model"] == "gpt2" and meta["general.architecture"] == "llama"
    assert read_metadata(smollm2_gguf).keys() == meta.keys()
    tok = Tokenizer.from_gguf(reader)
    assert (tok.vocab_size, tok.bos_token_id, tok.eos_token_id, tok.add_bos_default) == (
        smol_tok.vocab_size, smol_tok.bos_token_id, smol_tok.eos_token_id, smol_tok.add_bos_default)
    for text in TEXTS.values():
        assert tok.encode(text).tolist() == smol_tok.encode(text).tolist()


@pytest.mark.timing
def test_smollm2_build_is_fast(smollm2_gguf):
    # sinklab.load builds the tokenizer from the GGUFReader it already holds for the weights (the
    # one GGUF read path); that build is what must stay fast. A bare path adds GGUFReader's own
    # parse of the file (seconds), which is gguf's cost, not the tokenizer's.
    reader = gguf.GGUFReader(str(smollm2_gguf))
    Tokenizer.from_gguf(reader)  # warm the page cache
    t0 = time.perf_counter()
    Tokenizer.from_gguf(reader)
    elapsed = time.perf_counter() - t0
    print(f"Tokenizer.from_gguf(SmolLM2 GGUFReader): {elapsed * 1e3:.0f} ms")
    assert elapsed < 2.0


def test_hf_dir_matches(smol_tok, smol_hf, tmp_path):
    smol_hf.save_pretrained(str(tmp_path))
    assert (tmp_path / "tokenizer.json").is_file()
    tok = Tokenizer.from_hf_dir(tmp_path)
    assert tok.vocab_size == smol_tok.vocab_size
    assert (tok.bos_token_id, tok.eos_token_id, tok.add_bos_default) == (1, 2, False)
    for text in TEXTS.values():
        ids = tok.encode(text).tolist()
        assert ids == _hf_ids(smol_hf, text) == smol_tok.encode(text).tolist()
        assert tok.decode(ids) == text
        assert tok.encode(text, bos=True).tolist() == [1] + ids
    # a path straight to tokenizer.json works too
    assert Tokenizer.from_hf_dir(tmp_path / "tokenizer.json").encode("hi").tolist() == tok.encode("hi").tolist()
    with pytest.raises(FileNotFoundError):
        Tokenizer.from_hf_dir(tmp_path / "nope")


def test_hf_dir_bos_from_post_processor_and_no_truncation(tmp_path):
    """A folder without add_bos_token: BOS default read off the post-processor; the file's
    truncation setting and post-processor never touch encode(); ids from the other json files."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import models, pre_tokenizers, processors

    vocab = {"<bos>": 0, "<eos>": 1, "[UNK]": 2, "a": 3, "b": 4}
    backend = Backend(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 0)])
    backend.enable_truncation(max_length=2)
    backend.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "special_tokens_map.json").write_text(json.dumps({"bos_token": {"content": "<bos>"}}))
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": [1, 4]}))
    tok = Tokenizer.from_hf_dir(tmp_path)
    assert (tok.bos_token_id, tok.eos_token_id, tok.add_bos_default, tok.vocab_size) == (0, 1, True, 5)
    assert tok.encode("a b a b a").tolist() == [3, 4, 3, 4, 3]
    assert tok.encode("a b", bos=None).tolist() == [0, 3, 4]
    # add_bos_token in tokenizer_config.json wins over the post-processor
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"add_bos_token": False, "eos_token": "b"}))
    tok = Tokenizer.from_hf_dir(tmp_path)
    assert (tok.bos_token_id, tok.eos_token_id, tok.add_bos_default) == (0, 4, False)


# ---------------------------------------------------------------------------------------------
# Byte-level GGUFs with other pre-tokenizers
# ---------------------------------------------------------------------------------------------


def _write_gguf(path, *, model, tokens, types=None, scores=None, merges=None, pre=None, bos=None,
                eos=None, unk=None, add_bos=None, add_space_prefix=None, arch="llama", big_endian=False):
    endian = gguf.GGUFEndian.BIG if big_endian else gguf.GGUFEndian.LITTLE
    w = gguf.GGUFWriter(str(path), arch=arch, endianess=endian)
    w.add_tokenizer_model(model)
    if pre is not None:
        w.add_tokenizer_pre(pre)
    w.add_token_list(list(tokens))
    if types is not None:
        w.add_token_types([int(t) for t in types])
    if scores is not None:
        w.add_token_scores([float(s) for s in scores])
    if merges is not None:
        w.add_token_merges(list(merges))
    if bos is not None:
        w.add_bos_token_id(bos)
    if eos is not None:
        w.add_eos_token_id(eos)
    if unk is not None:
        w.add_unk_token_id(unk)
    if add_bos is not None:
        w.add_add_bos_token(add_bos)
    if add_space_prefix is not None:
        w.add_add_space_prefix(add_space_prefix)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


@pytest.fixture(scope="module")
def smol_meta(smollm2_gguf):
    return read_metadata(smollm2_gguf)


@pytest.mark.parametrize("pre", ["gpt-2", "llama-bpe", "qwen2", "tekken", "gpt-4o"])
def test_bpe_pre_variants_match_transformers(pre, smol_meta, tmp_path):
    """Same vocabulary and merges, split by another model family's regex: sinklab and
    transformers (which maps these `pre` values to the same regexes) must agree."""
    path = _write_gguf(tmp_path / f"{pre}.gguf", model="gpt2", pre=pre, tokens=smol_meta["tokenizer.ggml.tokens"],
                       types=smol_meta["tokenizer.ggml.token_type"], merges=smol_meta["tokenizer.ggml.merges"],
                       bos=1, eos=2, add_bos=False)
    tok = Tokenizer.from_gguf(path)
    hf = _hf_from_gguf(path)
    for name, text in TEXTS.items():
        ids = tok.encode(text).tolist()
        assert ids == _hf_ids(hf, text), (pre, name)
        assert tok.decode(ids) == text, (pre, name)


def _tiny_byte_level_vocab():
    from tests.support.reference_models import bytes_to_unicode

    alphabet = list(bytes_to_unicode().values())
    merges = ["H e", "He l", "Hel l", "Hell o", "Ġ w", "Ġw o", "Ġwo r", "Ġwor l", "Ġworl d", "1 2", "12 3"]
    tokens = alphabet + [m.replace(" ", "") for m in merges] + ["<|end|>", "<think>"]
    types = [1] * (len(tokens) - 2) + [3, 4]
    return tokens, types, merges


def test_every_supported_pre_builds_and_round_trips(tmp_path):
    from sinklab.tokenizer.bpe import _BPE_PRE

    tokens, types, merges = _tiny_byte_level_vocab()
    for pre in sorted(_BPE_PRE):
        path = _write_gguf(tmp_path / "p.gguf", model="gpt2", pre=pre, tokens=tokens, types=types, merges=merges)
        tok = Tokenizer.from_gguf(path)
        for text in TEXTS.values():
            assert tok.decode(tok.encode(text)) == text, pre


def test_metadata_reader_big_endian_and_reader_input(tmp_path):
    """read_metadata (through gguf.GGUFReader) gives back exactly what was written, in native
    byte order, from little- and big-endian files alike."""
    tokens, types, merges = _tiny_byte_level_vocab()
    scores = np.linspace(-1.0, 0.0, len(tokens))
    kw = dict(model="gpt2", pre="qwen2", tokens=tokens, types=types, merges=merges, scores=scores, bos=3,
              eos=4, add_bos=True)
    little = _write_gguf(tmp_path / "le.gguf", **kw)
    big = _write_gguf(tmp_path / "be.gguf", big_endian=True, **kw)
    for path in (little, big):
        for meta in (read_metadata(path), read_metadata(gguf.GGUFReader(str(path)))):
            assert meta["tokenizer.ggml.model"] == "gpt2" and meta["tokenizer.ggml.pre"] == "qwen2"
            assert meta["tokenizer.ggml.tokens"] == tokens and meta["tokenizer.ggml.merges"] == merges
            for key, want in (("tokenizer.ggml.token_type", types), ("tokenizer.ggml.scores", scores)):
                got = meta[key]
                assert isinstance(got, np.ndarray) and got.dtype.isnative, key
                np.testing.assert_array_equal(got, np.asarray(want, got.dtype), err_msg=key)
            assert (meta["tokenizer.ggml.bos_token_id"], meta["tokenizer.ggml.eos_token_id"]) == (3, 4)
            assert meta["tokenizer.ggml.add_bos_token"] is True
    text = "Hello world, 12345!<|end|>"
    ids = Tokenizer.from_gguf(little).encode(text).tolist()
    assert Tokenizer.from_gguf(big).encode(text).tolist() == ids
    assert Tokenizer.from_gguf(gguf.GGUFReader(str(big))).encode(text).tolist() == ids
    truncated = tmp_path / "cut.gguf"
    truncated.write_bytes(little.read_bytes()[:200])
    with pytest.raises(ValueError, match="truncated"):
        Tokenizer.from_gguf(truncated)


def test_default_pre_follows_llamacpp(tmp_path):
    """`pre == "default"` (and a missing `pre`) is llama.cpp's LLAMA_VOCAB_PRE_TYPE_DEFAULT:
    punctuation runs isolated, then GPT-2, then digit runs, then digit triples. transformers
    uses plain GPT-2 here, so the expected pieces are spelled out by hand."""
    tokens, types, merges = _tiny_byte_level_vocab()
    for pre in ("default", None):
        path = _write_gguf(tmp_path / f"d{pre}.gguf", model="gpt2", pre=pre, tokens=tokens, types=types,
                           merges=merges)
        tok = Tokenizer.from_gguf(path)
        pieces = [p for p, _ in tok.backend.pre_tokenizer.pre_tokenize_str("Hello, world!!! 12345")]
        assert pieces == ["Hello", ",", "Ġworld", "!!!", "Ġ", "123", "45"]
        ids = tok.encode("Hello world 12345")
        assert [tok.id_to_token(i) for i in ids] == ["Hello", "Ġworld", "Ġ", "123", "4", "5"]
        assert tok.decode(ids) == "Hello world 12345"
        assert tok.bos_token_id is None and tok.add_bos_default is False
        with pytest.raises(ValueError, match="no BOS"):
            tok.encode("x", bos=True)


def test_added_tokens_and_unknown_configs_rejected(tmp_path):
    tokens, types, merges = _tiny_byte_level_vocab()
    path = _write_gguf(tmp_path / "t.gguf", model="gpt2", pre="gpt-2", tokens=tokens, types=types, merges=merges,
                       bos=len(tokens) - 2, add_bos=True)
    tok = Tokenizer.from_gguf(path)
    assert tok.vocab_size == len(tokens)
    end, think = len(tokens) - 2, len(tokens) - 1
    ids = tok.encode("Hello<think>12<|end|>")
    assert ids.tolist() == [tokens.index("Hello"), think, tokens.index("12"), end]
    assert tok.decode(ids) == "Hello<think>12<|end|>"
    assert tok.add_bos_default is True and tok.encode("x", bos=None).tolist()[0] == end

    bad_pre = _write_gguf(tmp_path / "p.gguf", model="gpt2", pre="no-such-pre", tokens=tokens, merges=merges)
    with pytest.raises(ValueError, match="no-such-pre"):
        Tokenizer.from_gguf(bad_pre)
    bad_model = _write_gguf(tmp_path / "m.gguf", model="bert", tokens=tokens)
    with pytest.raises(ValueError, match="bert"):
        Tokenizer.from_gguf(bad_model)
    not_gguf = tmp_path / "x.gguf"
    not_gguf.write_bytes(b"not a gguf file at all, just bytes")
    with pytest.raises(ValueError):
        Tokenizer.from_gguf(not_gguf)


# ---------------------------------------------------------------------------------------------
# SentencePiece ("llama") GGUF
# ---------------------------------------------------------------------------------------------

SP_CORPUS = """The quick brown fox jumps over the lazy dog.
Attention sinks appear when heads put most of their weight on the first token.
def forward(self, x):
    return self.proj(x) + x
Numbers like 12345 and 3.14159 are split into digits.
Café, naïve, résumé, and façade carry accents.
    Indented lines keep  double  spaces and tabs\there.
""".splitlines()

SP_TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "the theory of attention sinks",
    "Café naïve façade résumé",
    "unknown characters ☃ 🙂 漢字 use byte fallback",
    "a  b   c\td\n\ne",
    "def forward(self, x):\n    return x",
    "12345 3.14",
    "THE QUICK",
    "",
]
# llama.cpp and sentencepiece prepend "▁" to text that already starts with a space; the
# Metaspace pre-tokenizer transformers builds does not, so these are checked against
# sentencepiece only.
SP_TEXTS_LEADING = [" leading space", "  two leading", " ", "\n", "trailing  "]


@pytest.fixture(scope="module")
def sp_model(tmp_path_factory):
    spm = require("sentencepiece")
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(SP_CORPUS * 50), model_writer=buf, model_type="bpe", vocab_size=420,
        byte_fallback=True, normalization_rule_name="identity", remove_extra_whitespaces=False,
        add_dummy_prefix=True, allow_whitespace_only_pieces=True, split_digits=True, character_coverage=1.0,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2,
    )
    sp = spm.SentencePieceProcessor(model_proto=buf.getvalue())
    n = sp.get_piece_size()
    # token types as llama.cpp's convert_hf_to_gguf.py assigns them
    types = [2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 5 if sp.is_unused(i)
             else 6 if sp.is_byte(i) else 1 for i in range(n)]
    path = _write_gguf(tmp_path_factory.mktemp("sp") / "sp.gguf", model="llama",
                       tokens=[sp.id_to_piece(i) for i in range(n)], scores=[sp.get_score(i) for i in range(n)],
                       types=types, bos=1, eos=2, unk=0)
    return sp, path


def test_sentencepiece_gguf_matches_sentencepiece(sp_model):
    sp, path = sp_model
    tok = Tokenizer.from_gguf(path)
    assert tok.vocab_size == sp.get_piece_size()
    assert (tok.bos_token_id, tok.eos_token_id, tok.add_bos_default) == (1, 2, True)
    for text in SP_TEXTS + SP_TEXTS_LEADING:
        ids = tok.encode(text).tolist()
        assert ids == list(sp.encode(text)), text
        assert tok.decode(ids) == sp.decode(ids) == text, text
        assert tok.encode(text, bos=True).tolist() == [1] + ids
    # byte fallback really happened for the snowman
    snow = tok.encode("☃").tolist()
    assert [tok.id_to_token(i) for i in snow][-3:] == ["<0xE2>", "<0x98>", "<0x83>"]


def test_sentencepiece_gguf_matches_transformers(sp_model):
    _, path = sp_model
    tok = Tokenizer.from_gguf(path)
    hf = _hf_from_gguf(path)
    for text in SP_TEXTS:
        ids = tok.encode(text).tolist()
        assert ids == _hf_ids(hf, text), text
        assert hf.decode(ids) == tok.decode(ids)


def _tiny_spm(tmp_path, add_space_prefix=None):
    tokens, scores, types = ["<unk>", "<s>", "</s>"], [0.0, 0.0, 0.0], [2, 3, 3]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    scores += [0.0] * 256
    types += [6] * 256
    pieces = ["▁", "t", "h", "e", "i", "▁t", "he", "▁the", "hi", "▁hi", "th", "the"]
    tokens += pieces
    scores += [-1.0 - k for k in range(len(pieces))]
    types += [1] * len(pieces)
    tokens += ["<|user|>"]
    scores += [0.0]
    types += [4]
    return _write_gguf(tmp_path / f"spm{add_space_prefix}.gguf", model="llama", tokens=tokens, scores=scores,
                       types=types, bos=1, eos=2, unk=0, add_space_prefix=add_space_prefix), tokens


def test_sentencepiece_special_tokens_and_space_prefix(tmp_path):
    """llama.cpp semantics: control / user-defined tokens are single ids, and every stretch of
    text after one starts a new "word" with its own "▁" prefix (transformers' conversion adds
    the prefix only at the very start; llama.cpp, and transformers' legacy Llama tokenizer,
    add it after each special token)."""
    path, tokens = _tiny_spm(tmp_path)
    tok = Tokenizer.from_gguf(path)
    tid = {t: i for i, t in enumerate(tokens)}
    assert tok.encode("the").tolist() == [tid["▁the"]]
    assert tok.encode("<s>the</s>").tolist() == [1, tid["▁the"], 2]
    assert tok.encode("<|user|>hi").tolist() == [tid["<|user|>"], tid["▁hi"]]
    assert tok.encode(" the").tolist() == [tid["▁"], tid["▁the"]]
    assert tok.decode(tok.encode(" the")) == " the"
    assert tok.decode([1, tid["▁the"]]) == "<s> the"  # the prefix shows after a special token

    path, tokens = _tiny_spm(tmp_path, add_space_prefix=False)
    tok = Tokenizer.from_gguf(path)
    assert tok.encode("the").tolist() == [tid["the"]]
    assert tok.encode("hi the").tolist() == [tid["hi"], tid["▁the"]]
    assert tok.decode(tok.encode("hi the")) == "hi the"
    assert tok.decode(tok.encode(" the")) == " the"


# ---------------------------------------------------------------------------------------------
# The registered real models: Gemma 3 (SentencePiece-style, 262k vocabulary, byte fallback),
# Qwen2.5 (byte-level BPE, pre "qwen2"), all-MiniLM-L6-v2 (BERT WordPiece, tokenizer.json).
# transformers' GGUF conversion of a 262k vocabulary takes ~20 s and GGUFReader's parse of the
# file about as long: each is built once per module.
# ---------------------------------------------------------------------------------------------


REAL_TEXTS = {
    k: TEXTS[k]
    for k in ("english", "accents", "cjk", "emoji", "combining", "space_runs", "lead_trail_spaces", "tabs",
              "newlines", "digits", "code", "contractions", "empty", "single_space", "single_newline", "long")
}
GEMMA_TEXTS = {
    **REAL_TEXTS,
    "turns": "<start_of_turn>user\nWhy do sinks form?<end_of_turn>\n<start_of_turn>model\nBecause",
    "bos_written": "<bos>text after a written bos<eos>",
    "code_indent": "if x:\n        return {'a': [1, 2]}  # eight spaces\n\t\tpass",
}
QWEN_TEXTS = {
    **REAL_TEXTS,
    "chat": ("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud.<|im_end|>\n"
             "<|im_start|>user\nWrite a sort.<|im_end|>\n<|im_start|>assistant\n"),
    "fim": "<|fim_prefix|>def add(a, b):\n<|fim_suffix|>\n    return c<|fim_middle|>",
    "adjacent_specials": "<|endoftext|><|im_start|><|im_end|>text<|endoftext|>",
    "numbers": "x = 1234567 + 0.000123 - 9e-10; y=[10,200,3000]",
}


@pytest.fixture(scope="module")
def gemma_meta(gemma3_path):
    return read_metadata(gemma3_path)


@pytest.fixture(scope="module")
def gemma_tok(gemma_meta):
    return Tokenizer._from_gguf_metadata(gemma_meta, "gemma-3-270m")


@pytest.fixture(scope="module")
def gemma_hf(gemma3_path):
    return _hf_from_gguf(Path(gemma3_path))


@pytest.mark.slow  # transformers' tokenizer from a 262k-token GGUF (tens of seconds)
@pytest.mark.parametrize("name", list(GEMMA_TEXTS))
def test_gemma3_ids_match_transformers(name, gemma_tok, gemma_hf):
    text = GEMMA_TEXTS[name]
    ref = _hf_ids(gemma_hf, text)
    assert gemma_tok.encode(text).tolist() == ref
    assert gemma_tok.encode(text, bos=True).tolist() == [2] + ref
    assert gemma_tok.encode(text, bos=None).tolist() == gemma_hf(text)["input_ids"]  # both add <bos>
    assert gemma_tok.decode(ref) == gemma_hf.decode(ref)


def _pb_varint(n):
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _pb_len(field, payload):
    return _pb_varint(field << 3 | 2) + _pb_varint(len(payload)) + payload


def _pb_int(field, value):
    return _pb_varint(field << 3) + _pb_varint(value)


def _sentencepiece_from_gguf(meta, *, unk, bos, eos, pad):
    """A ``sentencepiece`` BPE model (ModelProto, written field by field from
    sentencepiece_model.proto) with the GGUF's pieces, scores and types: the tokenizer the GGUF
    was converted from, as far as llama.cpp's converter keeps it. The converter writes spaces
    for the ``▁`` of user-defined pieces (Gemma's whitespace runs); they are turned back."""
    import struct

    out = bytearray()
    for piece, score, ty in zip(meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.scores"],
                                meta["tokenizer.ggml.token_type"]):
        if ty == 4:
            piece = piece.replace(" ", "\u2581")
        out += _pb_len(1, _pb_len(1, piece.encode()) + _pb_varint(2 << 3 | 5) + struct.pack("<f", score)
                       + _pb_int(3, int(ty)))
    # TrainerSpec: model_type BPE, byte_fallback, special ids
    out += _pb_len(2, _pb_int(3, 2) + _pb_int(35, 1) + _pb_int(40, unk) + _pb_int(41, bos) + _pb_int(42, eos)
                   + _pb_int(43, pad))
    # NormalizerSpec: identity, add_dummy_prefix as the GGUF says, keep whitespace, escape it as ▁
    prefix = int(bool(meta.get("tokenizer.ggml.add_space_prefix", True)))
    out += _pb_len(3, _pb_len(1, b"identity") + _pb_int(3, prefix) + _pb_int(4, 0) + _pb_int(5, 1))
    return bytes(out)


def test_gemma3_ids_match_sentencepiece(gemma_meta, gemma_tok):
    """Against sentencepiece itself, including the whitespace runs longer than Gemma's longest
    run token (31 spaces): sentencepiece and llama.cpp match the longest run first (40 spaces ->
    31 + 9), while transformers' GGUF conversion turns the runs into BPE merges of equal score
    and gives 16 + 24; there sinklab follows sentencepiece."""
    spm = require("sentencepiece")
    sp = spm.SentencePieceProcessor(model_proto=_sentencepiece_from_gguf(gemma_meta, unk=3, bos=2, eos=1, pad=0))
    assert sp.get_piece_size() == gemma_tok.vocab_size == 262144
    texts = {k: v for k, v in GEMMA_TEXTS.items() if "<" not in v}  # sentencepiece never matches control tokens
    texts.update({f"run{n}": "x" + " " * n + "y" for n in (31, 32, 40, 63, 70)})
    texts["runs_around"] = " " * 40 + "word" + " " * 33
    for name, text in texts.items():
        ids = gemma_tok.encode(text).tolist()
        assert ids == list(sp.encode(text)), name
        assert gemma_tok.decode(ids) == sp.decode(ids) == text, name
    assert gemma_tok.encode(" " * 40).tolist() == [167, 145]  # '▁' * 31, '▁' * 9


def test_gemma3_properties(gemma_tok):
    tok = gemma_tok
    assert (tok.vocab_size, tok.bos_token_id, tok.eos_token_id, tok.add_bos_default) == (262144, 2, 1, True)
    for text, tid in [("<bos>", 2), ("<eos>", 1), ("<start_of_turn>", 105), ("<end_of_turn>", 106)]:
        assert tok.encode(text).tolist() == [tid] and tok.decode([tid]) == text
    # no "▁" prefix: add_space_prefix is false in this file, also after a control token
    assert tok.id_to_token(int(tok.encode("hello")[0])) == "hello"
    assert tok.encode("<start_of_turn>user").tolist() == [105, tok.token_to_id("user")]
    # byte fallback for a character outside the vocabulary (the first such CJK extension-B one)
    c = next(chr(cp) for cp in range(0x20000, 0x2A6E0) if tok.token_to_id(chr(cp)) is None)
    ids = tok.encode(c).tolist()
    assert [tok.id_to_token(i) for i in ids] == [f"<0x{b:02X}>" for b in c.encode("utf-8")]
    assert tok.decode(ids) == c


@pytest.fixture(scope="module")
def qwen_tok(qwen05_path):
    return Tokenizer.from_gguf(qwen05_path)


@pytest.fixture(scope="module")
def qwen_hf(qwen05_path):
    return _hf_from_gguf(Path(qwen05_path))


@pytest.mark.slow  # transformers' tokenizer from a 151k-token GGUF (tens of seconds)
@pytest.mark.parametrize("name", list(QWEN_TEXTS))
def test_qwen2_ids_match_transformers(name, qwen_tok, qwen_hf):
    text = QWEN_TEXTS[name]
    ref = _hf_ids(qwen_hf, text)
    assert qwen_tok.encode(text).tolist() == ref
    assert qwen_tok.encode(text, bos=True).tolist() == [151643] + ref
    assert qwen_tok.encode(text, bos=None).tolist() == qwen_hf(text)["input_ids"] == ref  # no BOS by default
    assert qwen_tok.decode(ref) == text


def test_qwen2_properties(qwen_tok):
    tok = qwen_tok
    assert (tok.vocab_size, tok.bos_token_id, tok.eos_token_id, tok.add_bos_default) == (
        151936, 151643, 151645, False)
    for text, tid in [("<|endoftext|>", 151643), ("<|im_start|>", 151644), ("<|im_end|>", 151645)]:
        assert tok.encode(text).tolist() == [tid]
    assert len(tok.encode("31415926")) == 8  # the qwen2 pre-tokenizer splits digits one by one
    assert [tok.id_to_token(i) for i in tok.encode("hello world")] == ["hello", "Ġworld"]


@pytest.fixture(scope="module")
def minilm(minilm_path):
    d = minilm_path
    AutoTokenizer = _transformers()
    return Tokenizer.from_hf_dir(d), AutoTokenizer.from_pretrained(str(d))


@pytest.mark.parametrize("name", list(REAL_TEXTS) + ["special"])
def test_bert_ids_match_transformers(name, minilm):
    """BERT through tokenizer.json: bos=True means [CLS] first (its fixed first token); the
    [SEP] transformers appends is not added, and the file's truncation at 128 never applies."""
    tok, hf = minilm
    text = TEXTS[name]
    ref = _hf_ids(hf, text)
    assert tok.encode(text).tolist() == ref
    assert tok.encode(text, bos=True).tolist() == [hf.cls_token_id] + ref == hf(text)["input_ids"][:-1]
    assert tok.encode(text, bos=None).tolist() == [hf.cls_token_id] + ref


def test_bert_properties(minilm):
    tok, hf = minilm
    assert (tok.vocab_size, tok.bos_token_id, tok.eos_token_id, tok.add_bos_default) == (30522, 101, 102, True)
    assert (hf.cls_token_id, hf.sep_token_id, hf.bos_token_id) == (101, 102, None)
    assert tok.encode("Attention SINKS").tolist() == tok.encode("attention sinks").tolist()  # uncased
    assert len(tok.encode(TEXTS["long"])) > 1000  # tokenizer.json truncates at 128; encode() does not
    assert tok.decode(tok.encode("attention sinks", bos=True)) == "[CLS] attention sinks"
