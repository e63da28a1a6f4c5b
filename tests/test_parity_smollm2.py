"""sinklab vs Hugging Face transformers on the real SmolLM2-135M-Instruct GGUF (Q4_1 weights,
Q8_0 embeddings): the whole path, from the file to logits, residual stream and attention.

Reference: transformers' own GGUF loader (dequantizes to fp32 in numpy, un-permutes Q/K) and its
fp32 eager forward on CPU. Prompts are tokenized with transformers' tokenizer built from the
same GGUF, so the forward parity does not depend on sinklab's tokenizer (a separate test
compares the two tokenizers).

Bound per tensor (logits; each layer's resid; each layer's attn):
    max|sinklab - reference| <= 1e-4 * max|reference|
and the same argmax token at every position, except where the reference's top-2 logits are
within that same bound of each other (a near-tie: an argmax flip there is inside the verified
error bound, so it is reported, not failed).

The measured errors are printed at the end of the module and, when SINKLAB_PARITY_REPORT names
a file, stored there as JSON under "smollm2".
"""
import numpy as np
import pytest

from tests.support import reference_models as rm

torch = rm.require("torch")
transformers = rm.require("transformers")
rm.require("gguf")

import sinklab as sl  # noqa: E402

CAPTURE = ("attn", "resid", "logits")
BOS = 1

PROMPTS = {
    "short": "The capital of France is Paris, and the capital of Germany is",
    "chat": ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
             "Hugging Face<|im_end|>\n<|im_start|>user\nWhy do language models put so much "
             "attention on the first token?<|im_end|>\n<|im_start|>assistant\n"),
    "code": ("def softmax(x):\n    m = max(x)\n    e = [math.exp(v - m) for v in x]\n"
             "    s = sum(e)\n    return [v / s for v in e]\n\n"
             "for row in attention:\n    assert abs(sum(row) - 1.0) < 1e-6, row\n"),
    "paragraph": (
        "Attention sinks are tokens, most often the first one in a sequence, that receive a "
        "large share of the attention probability mass in many heads even though they carry "
        "little semantic content. One explanation is that a head which has nothing useful to "
        "do must still put its probability somewhere, because softmax rows sum to one; the "
        "first token, visible from every position, becomes a convenient no-op. Another view "
        "is that sinks slow down the mixing of information across positions, which protects "
        "deep models against over-smoothing and representational collapse as contexts grow "
        "longer."),
    "long_mixed": (
        "Table 3 (v2.1, 2024-05-17): 12 runs × 4 seeds; mean ± std = 0.734 ± 0.012. "
        "Naïve café owners in Zürich paid €1,299.50 for 3½ espresso machines — “a bargain”. "
        "東京の天気は晴れです。 Emoji: 😀🚀. See https://example.org/a?b=c&d=e. "
        "THE QUICK BROWN FOX jumps over the lazy dog. "
        "0x1F, 3.14159e-10, -42. Tabs\tand\tnewlines\n\n"
        "mixed    with    runs of spaces; colons: and dashes - like these."),
    "repetitive": " ".join(["the cat sat on the mat."] * 8),
}


@pytest.fixture(scope="module")
def smol(smollm2_reference, smollm2_model):
    """(HF reference model, HF tokenizer, sinklab model): the session's (conftest.py)."""
    ref, tok = smollm2_reference
    return ref, tok, smollm2_model


@pytest.fixture(scope="module")
def log(request):
    lg = rm.ErrorLog("smollm2")
    rm.report_fixture(request, lg, per_case=True)
    return lg


def _hf_ids(tok, text, bos):
    ids = tok(text, add_special_tokens=False)["input_ids"]
    return np.asarray(([BOS] if bos else []) + list(ids), dtype=np.int64)


def test_prompt_lengths(smol):
    _, tok, _ = smol
    lens = {k: len(_hf_ids(tok, v, False)) for k, v in PROMPTS.items()}
    assert all(10 <= n <= 200 for n in lens.values()), lens
    assert len(lens) >= 5


def test_config(smol):
    ref, _, model = smol
    c, h = model.config, ref.config
    assert c.arch == "llama"
    assert (c.n_layers, c.n_heads, c.n_kv_heads, c.d_model, c.head_dim, c.d_ff, c.vocab_size) == \
        (30, 9, 3, 576, 64, 1536, 49152)
    assert (c.n_layers, c.n_heads, c.n_kv_heads, c.d_model, c.d_ff, c.vocab_size) == \
        (h.num_hidden_layers, h.num_attention_heads, h.num_key_value_heads, h.hidden_size,
         h.intermediate_size, h.vocab_size)
    assert c.context_length == 8192
    assert c.rope_theta == pytest.approx(100000.0)
    assert c.norm_eps == pytest.approx(1e-5, rel=1e-6)
    assert c.tied_embeddings
    assert c.bos_token_id == BOS
    assert not c.rope_scaling


@pytest.mark.parametrize("bos", [True, False], ids=["bos", "nobos"])
@pytest.mark.parametrize("prompt", list(PROMPTS))
def test_parity(smol, log, prompt, bos):
    ref_model, tok, model = smol
    ids = _hf_ids(tok, PROMPTS[prompt], bos)
    case = f"{prompt}/{'bos' if bos else 'nobos'}/T={len(ids)}"
    tr = model.run(ids, capture=CAPTURE)
    ref = rm.hf_forward(ref_model, ids)
    log.compare_trace(case, tr, ref)

    # same top-1 token at every position, near-ties (within the logits bound) reported only
    got_l, ref_l = np.asarray(tr.logits, dtype=np.float64), ref["logits"].astype(np.float64)
    tol = rm.RTOL * np.max(np.abs(ref_l))
    a_got, a_ref = got_l.argmax(-1), ref_l.argmax(-1)
    bad = []
    for t in np.nonzero(a_got != a_ref)[0]:
        gap = ref_l[t, a_ref[t]] - ref_l[t, a_got[t]]
        msg = (f"{case} position {t}: sinklab argmax {a_got[t]}, reference {a_ref[t]}, "
               f"reference gap {gap:.2e} (bound {tol:.2e})")
        (log.notes if gap <= tol else bad).append(msg)
    assert not bad, "top-1 token differs:\n" + "\n".join(bad)


def test_batch(smol, log):
    """Two prompts of equal length as one (2, T) batch."""
    ref_model, tok, model = smol
    a = _hf_ids(tok, PROMPTS["paragraph"], True)
    b = _hf_ids(tok, PROMPTS["long_mixed"], True)
    T = min(len(a), len(b), 64)
    ids = np.stack([a[:T], b[:T]])
    tr = model.run(ids, capture=CAPTURE)
    ref = rm.hf_forward(ref_model, ids)
    log.compare_trace(f"batch2x{T}", tr, ref)


def test_layers_subset(smol, log):
    ref_model, tok, model = smol
    ids = _hf_ids(tok, PROMPTS["chat"], True)
    layers = [0, 14, 29]
    tr = model.run(ids, capture=CAPTURE, layers=layers)
    assert list(tr.layers) == layers
    ref = rm.hf_forward(ref_model, ids)
    log.compare_trace(f"layers={layers}", tr, ref, layers=layers)


@pytest.mark.parametrize("prompt", list(PROMPTS))
def test_tokenizer_matches_hf(smol, prompt):
    _, tok, model = smol
    text = PROMPTS[prompt]
    want = _hf_ids(tok, text, False)
    got = np.asarray(model.tokenize(text, bos=False))
    assert got.dtype == np.int64 and got.ndim == 1
    np.testing.assert_array_equal(got, want)
    got_bos = np.asarray(model.tokenize(text, bos=True))
    np.testing.assert_array_equal(got_bos, np.concatenate([[BOS], want]))
