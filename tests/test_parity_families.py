"""sinklab's forward vs Hugging Face transformers (fp32, eager attention) on tiny random models
of every supported family (reference_models.FAMILY_SPECS): LLaMA, Mistral (sliding window),
Qwen2 (QKV biases), Qwen3 (QK-norm), Gemma (GeGLU, 1+w norms, sqrt(d) embedding scale),
Gemma 2 (soft-caps, alternating windows, query_pre_attn_scalar, post-norms), Gemma 3 (QK-norm,
layer_types, local/global rope bases), GPT-2 (Conv1D, learned positions, LayerNorm biases)
and BERT (post-LN bidirectional encoder, token types, no head), each from a safetensors folder
and, where llama.cpp has the family, from GGUF files written as its converter writes them.

Bound, per tensor (logits; each layer's resid; each layer's attn, q, k, v, z):
    max|sinklab - reference| <= 1e-4 * max|reference|
plus the same argmax token at every position (near-ties within the bound reported only),
exact zeros where the mask (causal and sliding window) removes a key, a ragged batch equal to
single runs, and the streaming stats against float64 NumPy on the reference attention.
Test lengths exceed every sliding window.
"""
import json

import numpy as np
import pytest

from tests.support import reference_models as rm

torch = rm.require("torch")
transformers = rm.require("transformers")
gguf = rm.require("gguf")

import sinklab as sl  # noqa: E402

SPECS = rm.FAMILY_SPECS
ST_CASES = [(n, "st") for n in SPECS]
GGUF_CASES = [(n, "gguf") for n, s in SPECS.items() if s.gguf_arch]
QUANT_CASES = [("qwen2", "gguf-Q8_0"), ("gemma2", "gguf-F16"), ("gemma3_gguf", "gguf-Q8_0"),
               ("gpt2", "gguf-Q8_0")]
ALL_CASES = ST_CASES + GGUF_CASES + QUANT_CASES


@pytest.fixture(scope="module", autouse=True)
def _torch_one_thread():
    with rm.torch_single_thread():
        yield


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return rm.FamilyModels(tmp_path_factory.mktemp("family_models"))


@pytest.fixture(scope="module")
def log(request):
    lg = rm.ErrorLog("families")
    rm.report_fixture(request, lg, per_case=True)
    return lg


def _ids(name, T=None, seed=0, batch=None):
    s = SPECS[name]
    return rm.random_ids(s.hf["vocab_size"], T or s.T, seed=31 * (T or s.T) + seed + s.seed,
                         batch=batch)


def _facts(store, name, fmt="st"):
    return rm.config_facts(store.hf(name, fmt).config)


def _capture(name):
    return ("attn", "resid", "logits") if SPECS[name].has_logits else ("attn", "resid")


def allowed_keys(T, window, causal=True):
    """(T, T) bool: query i may attend key j (HF semantics: i - window < j <= i)."""
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    if not causal:
        return np.ones((T, T), bool)
    ok = j <= i
    if window:
        ok &= j > i - window
    return ok


def check_mask(case, attn, windows, causal):
    """Exact zeros on every masked (query, key) pair, rows summing to 1."""
    a = np.asarray(attn)
    T = a.shape[-1]
    for l, w in enumerate(windows):
        masked = ~allowed_keys(T, w, causal)
        assert not np.any(a[..., l, :, :, :][..., masked]), \
            f"{case} attn[{l}]: non-zero attention on masked keys (window {w}, causal {causal})"
    s = a.sum(axis=-1, dtype=np.float64)
    assert np.max(np.abs(s - 1.0)) <= 1e-5, f"{case}: attention rows do not sum to 1"


def compare_run(log, case, tr, ref, windows, causal, names=("logits", "resid", "attn")):
    """Per tensor: logits whole, every other capture layer by layer (axis -4 for the per-layer
    captures, -3 for resid)."""
    for name in names:
        got = getattr(tr, name)
        if name not in ref:
            continue
        assert got is not None, f"{case}: capture {name} is None"
        got = np.asarray(got)
        want = ref[name]
        assert got.shape == want.shape, f"{case} {name}: shape {got.shape} != reference {want.shape}"
        if name == "logits":
            log.compare(case, name, got, want)
            continue
        axis = -3 if name == "resid" else -4
        for l in range(got.shape[axis]):
            log.compare(case, f"{name}[{l}]", np.take(got, l, axis=axis), np.take(want, l, axis=axis))
    if "attn" in names:
        check_mask(case, tr.attn, windows, causal)


def check_top1(log, case, got_logits, ref_logits):
    """Same argmax at every position except near-ties within the logits bound (reported)."""
    got_l, ref_l = np.asarray(got_logits, np.float64), np.asarray(ref_logits, np.float64)
    tol = rm.RTOL * np.max(np.abs(ref_l))
    a_got, a_ref = got_l.argmax(-1), ref_l.argmax(-1)
    bad = []
    for t in np.nonzero(a_got != a_ref)[0]:
        gap = ref_l[t, a_ref[t]] - ref_l[t, a_got[t]]
        msg = (f"{case} position {t}: sinklab argmax {a_got[t]}, reference {a_ref[t]}, "
               f"reference gap {gap:.2e} (bound {tol:.2e})")
        (log.notes if gap <= tol else bad).append(msg)
    assert not bad, "top-1 token differs:\n" + "\n".join(bad)


# ============================================================================ reference self-checks

def test_reference_windows_and_hooks(store):
    """The reference's attention has exactly HF's masks (i - window < j <= i; every key for
    BERT), its hooks read the stream HF's hidden_states give (resid[L] before the final norm),
    and the recorded attention equals output_attentions."""
    for name, s in SPECS.items():
        hf = store.hf(name)
        f = rm.config_facts(hf.config)
        ids = _ids(name)
        T = len(ids)
        assert T > max(f["windows"]), f"{name}: T={T} does not exceed the windows {f['windows']}"
        ref = rm.family_forward(hf, ids)
        for l, w in enumerate(f["windows"]):
            ok = allowed_keys(T, w, s.causal)
            a = ref["attn"][l]
            assert np.all(a[:, ~ok] == 0) and np.all(a[:, ok] > 0), f"{name} layer {l} window {w}"
        kw = dict(input_ids=torch.as_tensor(ids)[None], output_hidden_states=True,
                  output_attentions=True)
        with torch.no_grad():
            out = hf(**kw)
        hs = [h[0].numpy() for h in out.hidden_states]
        L = f["n_layers"]
        for l in range(L):
            np.testing.assert_array_equal(ref["resid"][l], hs[l], err_msg=f"{name} resid[{l}]")
        final = getattr(hf.base_model, "norm", None) or getattr(hf.base_model, "ln_f", None)
        last = torch.as_tensor(ref["resid"][L])[None]
        with torch.no_grad():
            want_last = (final(last) if final is not None else last)[0].numpy()
        np.testing.assert_array_equal(want_last, hs[L], err_msg=f"{name} resid[{L}]")
        np.testing.assert_array_equal(torch.stack(out.attentions, 1)[0].numpy(), ref["attn"])


@pytest.mark.parametrize("name", list(SPECS))
def test_reference_folder_is_the_reference(store, name):
    """transformers reading the safetensors folder (config.json in the 5.x or the Hub's legacy
    layout) builds the reference model: same config facts, same forward."""
    s = SPECS[name]
    path = store.path(name, "st")
    cls = getattr(transformers, rm.FAMILY_CLASSES[s.family][1])
    transformers.logging.set_verbosity_error()
    m = cls.from_pretrained(str(path), dtype=torch.float32, attn_implementation="eager")
    m.eval()
    ref = store.hf(name)
    assert rm.config_facts(m.config) == rm.config_facts(ref.config)
    if s.legacy_config:
        cfg = json.loads((path / "config.json").read_text())
        assert "rope_parameters" not in cfg and "torch_dtype" in cfg
    ids = _ids(name, seed=9)
    a, b = rm.family_forward(m, ids), rm.family_forward(ref, ids)
    for k in b:
        np.testing.assert_array_equal(a[k], b[k], err_msg=f"{name} {k}")


FEATURE_TOGGLES = [
    ("mistral", {"sliding_window": None}, "sliding window"),
    ("gemma2", {"attn_logit_softcapping": None}, "attention soft-cap"),
    ("gemma2", {"final_logit_softcapping": None}, "final soft-cap"),
    ("gemma2", {"query_pre_attn_scalar": 16}, "query_pre_attn_scalar"),
    ("gemma2", {"sliding_window": 4096}, "sliding window"),
    ("gemma3", {"query_pre_attn_scalar": 24}, "query_pre_attn_scalar"),
    ("gemma3", {"sliding_window": 4096}, "sliding window"),
    ("gemma3", {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                    "sliding_attention": {"rope_type": "default", "rope_theta": 1e6}}},
     "local rope base"),
    ("gemma3_gguf", {"sliding_window": 4096}, "sliding window"),
]


@pytest.mark.parametrize("name,override,what", FEATURE_TOGGLES,
                         ids=[f"{n}-{w.replace(' ', '_')}" for n, _, w in FEATURE_TOGGLES])
def test_reference_features_matter(store, name, override, what):
    """Each family feature changes the tiny model's output by far more than the parity bound,
    so a loader or kernel that ignores it fails the parity tests."""
    import dataclasses
    s = SPECS[name]
    other = dataclasses.replace(s, hf=dict(s.hf, **override))
    a = store.hf(name)
    b = rm.make_family_model(other)
    for (k, p), (k2, p2) in zip(a.state_dict().items(), b.state_dict().items()):
        assert k == k2 and torch.equal(p, p2), "the toggled model must have the same weights"
    ids = _ids(name)
    ra, rb = rm.family_forward(a, ids), rm.family_forward(b, ids)
    err, scale = rm.max_err(rb["logits"], ra["logits"])
    assert err > 100 * rm.RTOL * scale, f"{name}: {what} changes logits by only {err:.2e} (max {scale:.2e})"


@pytest.mark.parametrize("name", [n for n, s in SPECS.items() if s.gguf_arch])
def test_reference_gguf_roundtrip_transformers(store, name):
    """transformers' own GGUF loader reads back exactly the reference weights from the files
    write_family_gguf writes (Gemma norms: 1 + w as stored), and the metadata holds the
    config's numbers under llama.cpp's key names."""
    s = SPECS[name]
    transformers.logging.set_verbosity_error()
    for fmt in ("gguf", "gguf-Q8_0"):
        path = store.path(name, fmt)
        kw = {}
        if s.gguf_arch in ("qwen3", "gpt2"):
            # transformers' GGUF config maps lack qwen3's attention.key_length (head_dim 24
            # here) and read gpt2's context_length into n_ctx, not n_positions: give the
            # config, the weights still come from the file
            kw["config"] = rm.family_config(s, gguf=True)
        m = transformers.AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32, attn_implementation="eager", **kw)
        want = store.hf(name, fmt).state_dict()
        got = m.state_dict()
        assert sorted(got) == sorted(want)
        gemma = s.family in rm.GEMMA_FAMILIES
        bad = []
        for k in want:
            a, b = want[k], got[k]
            if gemma and k.endswith("norm.weight"):
                a, b = 1 + a, 1 + b       # the effective multiplier HF computes in float32
            if a.shape != b.shape or not torch.equal(a, b):
                bad.append(k)
        assert not bad, f"{name}/{fmt}: weights differ after the transformers GGUF round trip: {bad[:5]}"
    # metadata
    cfg = store.hf(name, "gguf").config
    f = rm.config_facts(cfg)
    r = gguf.GGUFReader(str(store.path(name, "gguf")))
    arch = s.gguf_arch

    def val(key):
        fld = r.fields[key]
        return fld.parts[fld.data[0]][0] if len(fld.data) == 1 else [fld.parts[i][0] for i in fld.data]

    assert bytes(r.fields["general.architecture"].parts[-1]).decode() == arch
    assert val(f"{arch}.block_count") == f["n_layers"]
    assert val(f"{arch}.embedding_length") == f["d_model"]
    assert val(f"{arch}.attention.head_count") == f["n_heads"]
    if arch == "gpt2":
        assert val("gpt2.feed_forward_length") == 4 * f["d_model"]
        assert val("gpt2.attention.layer_norm_epsilon") == pytest.approx(cfg.layer_norm_epsilon)
        assert val("gpt2.context_length") == cfg.n_positions
        return
    assert val(f"{arch}.attention.head_count_kv") == f["n_kv_heads"]
    assert val(f"{arch}.feed_forward_length") == cfg.intermediate_size
    if arch.startswith("gemma"):
        assert val(f"{arch}.attention.key_length") == f["head_dim"]
        assert val(f"{arch}.attention.sliding_window") == cfg.sliding_window
    if arch == "gemma2":
        assert val("gemma2.attn_logit_softcapping") == pytest.approx(cfg.attn_logit_softcapping)
        assert val("gemma2.final_logit_softcapping") == pytest.approx(cfg.final_logit_softcapping)
        # llama.cpp: windows on even layers, scale 1/sqrt(head_dim) -- what the reference uses
        assert f["windows"] == [cfg.sliding_window if l % 2 == 0 else 0 for l in range(f["n_layers"])]
        assert cfg.query_pre_attn_scalar == f["head_dim"]
    if arch == "gemma3":
        # llama.cpp: every 6th layer global, local rope base 10000, scale 1/sqrt(head_dim)
        assert f["windows"] == [0 if l % 6 == 5 else cfg.sliding_window for l in range(f["n_layers"])]
        assert cfg.rope_parameters["sliding_attention"]["rope_theta"] == 10000.0
        assert val("gemma3.rope.freq_base") == cfg.rope_parameters["full_attention"]["rope_theta"]
        assert cfg.query_pre_attn_scalar == f["head_dim"]


# ============================================================================ parity

@pytest.mark.parametrize("name,fmt", ALL_CASES, ids=[f"{n}-{f}" for n, f in ALL_CASES])
def test_parity(store, log, name, fmt):
    s = SPECS[name]
    hf = store.hf(name, fmt)
    f = rm.config_facts(hf.config)
    model = store.sl(name, fmt)
    ids = _ids(name)
    case = f"{name}/{fmt}/T={len(ids)}"
    tr = model.run(ids, capture=_capture(name), progress=False)
    ref = rm.family_forward(hf, ids)
    compare_run(log, case, tr, ref, f["windows"], s.causal, names=_capture(name))
    if s.has_logits:
        check_top1(log, case, tr.logits, ref["logits"])


@pytest.mark.parametrize("name", list(SPECS))
def test_config(store, name):
    """The loaded configuration states the file's shapes."""
    f = _facts(store, name)
    c = store.sl(name, "st").config
    assert (c.n_layers, c.n_heads, c.n_kv_heads, c.d_model, c.head_dim, c.vocab_size) == \
        (f["n_layers"], f["n_heads"], f["n_kv_heads"], f["d_model"], f["head_dim"], f["vocab_size"])


@pytest.mark.parametrize("name,fmt", ST_CASES + GGUF_CASES, ids=[f"{n}-{f}" for n, f in ST_CASES + GGUF_CASES])
def test_captures_qkvz(store, log, name, fmt):
    """q and k after QK-norm and RoPE (rotate-half layout, also from GGUF), v per kv head, z
    (each head's attention output): shapes and values against the tensors HF's eager attention
    receives and returns."""
    hf = store.hf(name, fmt)
    f = rm.config_facts(hf.config)
    L, H, G, T, hd = f["n_layers"], f["n_heads"], f["n_kv_heads"], SPECS[name].T, f["head_dim"]
    ids = _ids(name, seed=1)
    tr = store.sl(name, fmt).run(ids, capture=("q", "k", "v", "z"), progress=False)
    shapes = {"q": (L, H, T, hd), "k": (L, G, T, hd), "v": (L, G, T, hd), "z": (L, H, T, hd)}
    for k, shp in shapes.items():
        assert np.shape(getattr(tr, k)) == shp, f"{name}/{fmt} {k}: {np.shape(getattr(tr, k))} != {shp}"
    ref = rm.family_forward(hf, ids)
    compare_run(log, f"{name}/{fmt}/qkvz", tr, ref, f["windows"], SPECS[name].causal,
                names=("q", "k", "v", "z"))


@pytest.mark.parametrize("name,fmt", [(n, "st") for n in SPECS]
                         + [("gemma3_gguf", "gguf"), ("qwen2", "gguf")])
def test_batch_ragged(store, log, name, fmt):
    """A (2, T) batch with lengths = (T, T - 7): row b equals the single run of its first
    lengths[b] ids (to 1e-6 of its max), is zero past its length, and matches the reference."""
    s = SPECS[name]
    hf = store.hf(name, fmt)
    f = rm.config_facts(hf.config)
    model = store.sl(name, fmt)
    T = s.T
    lengths = np.array([T, T - 7])
    ids = _ids(name, seed=2, batch=2)
    ids[1, lengths[1]:] = 0
    cap = _capture(name)
    tr = model.run(ids, capture=cap, lengths=lengths, progress=False)
    L, H = f["n_layers"], f["n_heads"]
    assert np.shape(tr.attn) == (2, L, H, T, T)
    assert np.shape(tr.resid) == (2, L + 1, T, f["d_model"])
    for b in range(2):
        n = int(lengths[b])
        single = model.run(ids[b, :n], capture=cap, progress=False)
        for k in cap:
            got = np.asarray(getattr(tr, k))[b]
            one = np.asarray(getattr(single, k))
            if k == "attn":
                got_b, pad = got[..., :n, :n], [got[..., n:, :], got[..., :, n:]]
            else:
                got_b, pad = got[..., :n, :], [got[..., n:, :]]
            rm.assert_close(f"{name}/{fmt} batch row {b} vs single {k}", got_b, one, rtol=1e-6)
            assert all(not np.any(p) for p in pad), f"{name}/{fmt} row {b} {k}: non-zero padding"
        ref = rm.family_forward(hf, ids[b, :n])
        compare_run(log, f"{name}/{fmt}/batch row {b} T={n}", single, ref, f["windows"], s.causal,
                    names=cap)


@pytest.mark.parametrize("name", list(SPECS))
def test_stats(store, name):
    """capture="stats" against float64 NumPy on the reference attention; a bidirectional
    encoder's first-token importance is the mean over every query."""
    s = SPECS[name]
    hf = store.hf(name)
    ids = _ids(name, seed=3)
    tr = store.sl(name, "st").run(ids, capture=("stats",), progress=False)
    want = rm.attention_stats64(rm.family_forward(hf, ids)["attn"], causal=s.causal)
    assert tr.attn is None
    for k, w in want.items():
        got = getattr(tr.stats, k)
        assert np.shape(got) == w.shape, f"{name} stats.{k}: {np.shape(got)} != {w.shape}"
        np.testing.assert_allclose(got, w, atol=1e-5, rtol=0, err_msg=f"{name} stats.{k}")
    if not s.causal:
        # the causal formula would differ: the test distinguishes the two definitions
        causal = rm.attention_stats64(rm.family_forward(hf, ids)["attn"], causal=True)["importance"]
        assert np.max(np.abs(causal - want["importance"])) > 1e-3


# ============================================================================ errors

def test_unsupported_architecture_safetensors(tmp_path):
    sf = rm.require("safetensors.numpy")
    d = tmp_path / "mamba"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "model_type": "mamba", "architectures": ["MambaForCausalLM"], "hidden_size": 64,
        "num_hidden_layers": 2, "vocab_size": 320, "state_size": 16}))
    sf.save_file({"backbone.embeddings.weight": np.zeros((320, 64), np.float32)},
                 str(d / "model.safetensors"))
    rm.write_hf_tokenizer(d, 320)
    with pytest.raises(ValueError) as e:
        sl.load(str(d), quiet=True)
    msg = str(e.value)
    assert "mamba" in msg, msg
    for fam in ("llama", "qwen2", "gemma", "gpt2", "bert"):
        assert fam in msg.lower(), f"the error does not list {fam!r} as supported: {msg}"


def test_unsupported_architecture_gguf(tmp_path):
    path = tmp_path / "mamba.gguf"
    w = gguf.GGUFWriter(str(path), "mamba")
    w.add_name("tiny-mamba")
    w.add_block_count(2)
    w.add_embedding_length(64)
    w.add_context_length(256)
    tokens, types, merges = rm.tiny_vocab(320)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_tensor("token_embd.weight", np.zeros((320, 64), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError) as e:
        sl.load(str(path), quiet=True)
    msg = str(e.value)
    assert "mamba" in msg, msg
    for fam in ("llama", "qwen2", "gemma"):
        assert fam in msg.lower(), f"the error does not list {fam!r} as supported: {msg}"
