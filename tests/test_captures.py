"""The activation captures of ``Model.run`` (q, k, v, z, head_out, attn_out, mlp_out) against
Hugging Face transformers (fp32, eager attention) with forward hooks:

    q, k    q_proj / k_proj outputs, rotated with HF's own rotary embedding
            (``model.rotary_emb``) and ``apply_rotary_pos_emb``: HF's rotate-half layout
    v       v_proj output
    z       o_proj input (each head's attention output, what W_O reads)
    head_out  z_h @ o_proj.weight[:, h*hd:(h+1)*hd].T in float64 from HF's weights and z
    attn_out  o_proj output; also sum over heads of sinklab's head_out
    mlp_out   mlp output

Bound per tensor and layer, as in the parity tests: max|sinklab - reference| <= 1e-4 * max|ref|.
GGUF files store Q/K rows permuted (llama.cpp's interleaved pairs); sinklab's q/k captures come
out in HF's layout for both formats, which the GGUF cases check against the same reference.
"""
import numpy as np
import pytest

from tests.support import reference_models as rm

torch = rm.require("torch")
transformers = rm.require("transformers")
rm.require("gguf")

import sinklab as sl  # noqa: E402
from sinklab.model import ACTIVATIONS, CAPTURES  # noqa: E402

from transformers.models.llama.modeling_llama import apply_rotary_pos_emb  # noqa: E402


def hf_captures(hf, ids, head_scale=None):
    """Reference captures of one sequence (T,): dict name -> (L, ...) float64 in sinklab's
    layout. ``head_scale`` (L, H): multiplies each head's slice of the o_proj input, done by a
    forward pre-hook, the reference for ``Intervention(head_scale=...)``."""
    cfg = hf.config
    H, G = cfg.num_attention_heads, cfg.num_key_value_heads
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // H
    T = len(ids)
    got = {k: {} for k in ("q", "k", "v", "z", "attn_out", "mlp_out")}
    hooks = []

    def out_hook(name, l):
        return lambda m, a, o: got[name].__setitem__(l, o[0] if isinstance(o, tuple) else o)

    def z_hook(l):
        def f(m, a):
            x = a[0]
            if head_scale is not None:
                s = torch.from_numpy(np.repeat(np.asarray(head_scale[l], np.float32), hd))
                x = x * s
            got["z"][l] = x
            return (x,) + tuple(a[1:])
        return f

    for l, layer in enumerate(hf.model.layers):
        att = layer.self_attn
        hooks += [att.q_proj.register_forward_hook(out_hook("q", l)),
                  att.k_proj.register_forward_hook(out_hook("k", l)),
                  att.v_proj.register_forward_hook(out_hook("v", l)),
                  att.o_proj.register_forward_pre_hook(z_hook(l)),
                  att.o_proj.register_forward_hook(out_hook("attn_out", l)),
                  layer.mlp.register_forward_hook(out_hook("mlp_out", l))]
    try:
        with torch.no_grad():
            x = torch.from_numpy(np.asarray(ids, dtype=np.int64))[None]
            hf(input_ids=x, use_cache=False)
            pos = torch.arange(T)[None]
            cos, sin = hf.model.rotary_emb(got["v"][0], pos)
            for l in range(len(hf.model.layers)):
                q = got["q"][l].view(1, T, H, hd).transpose(1, 2)
                k = got["k"][l].view(1, T, G, hd).transpose(1, 2)
                got["q"][l], got["k"][l] = apply_rotary_pos_emb(q, k, cos, sin)
    finally:
        for h in hooks:
            h.remove()
    L = len(hf.model.layers)
    out = {}
    out["q"] = np.stack([got["q"][l][0].double().numpy() for l in range(L)])            # (L, H, T, hd)
    out["k"] = np.stack([got["k"][l][0].double().numpy() for l in range(L)])            # (L, G, T, hd)
    out["v"] = np.stack([got["v"][l][0].view(T, G, hd).transpose(0, 1).double().numpy() for l in range(L)])
    z = np.stack([got["z"][l][0].view(T, H, hd).transpose(0, 1).double().numpy() for l in range(L)])
    out["z"] = z                                                                          # (L, H, T, hd)
    ho = np.empty((L, H, T, cfg.hidden_size))
    for l, layer in enumerate(hf.model.layers):
        Wo = layer.self_attn.o_proj.weight.detach().double().numpy()                      # (d, H*hd)
        for h in range(H):
            ho[l, h] = z[l, h] @ Wo[:, h * hd:(h + 1) * hd].T
    out["head_out"] = ho
    out["attn_out"] = np.stack([got["attn_out"][l][0].double().numpy() for l in range(L)])
    out["mlp_out"] = np.stack([got["mlp_out"][l][0].double().numpy() for l in range(L)])
    return out


def check_captures(tr, ref, layers=None, case=""):
    """Every activation capture of trace ``tr`` (one sequence) against ``ref`` per layer, and
    the sum over heads of head_out against HF's o_proj output."""
    sel = list(range(ref["q"].shape[0])) if layers is None else list(layers)
    assert tr.layers == sel
    for name in ACTIVATIONS:
        got = getattr(tr, name)
        assert got.dtype == np.float32 and got.shape == (len(sel),) + ref[name].shape[1:], (name, got.shape)
        for slot, l in enumerate(sel):
            rm.assert_close(f"{case} {name}[{l}]", got[slot], ref[name][l])
            if name == "head_out":
                rm.assert_close(f"{case} sum_h head_out[{l}]", got[slot].astype(np.float64).sum(axis=0),
                                ref["attn_out"][l])


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("capture_models")
    hfs, models = {}, {}

    def get(spec, fmt):
        if spec not in hfs:
            hfs[spec] = rm.make_hf_model(rm.SPECS[spec])
        if (spec, fmt) not in models:
            s = rm.SPECS[spec]
            if fmt == "gguf":
                p = rm.write_gguf(hfs[spec], root / f"{spec}.gguf", "F32")
            else:
                p = rm.save_hf(hfs[spec], root / spec, legacy_config=s.legacy_config)
            models[(spec, fmt)] = sl.load(str(p))
        return hfs[spec], models[(spec, fmt)]
    return get


# mha: H = G; gqa_tied: 3 query heads per kv head; odd: MQA with head_dim 24; llama3: rope
# scaling (its GGUF carries rope_freqs). Both formats: GGUF permutes the Q/K rows.
@pytest.mark.parametrize("fmt", ["safetensors", "gguf"])
@pytest.mark.parametrize("spec", ["mha", "gqa_tied", "odd", "llama3"])
def test_captures_match_hooked_hf(store, spec, fmt):
    hf, model = store(spec, fmt)
    ids = rm.random_ids(hf.config.vocab_size, 23, seed=11)
    tr = model.run(ids, capture=ACTIVATIONS)
    check_captures(tr, hf_captures(hf, ids), case=f"{spec}/{fmt}")
    assert tr.attn is None and tr.resid is None and tr.logits is None   # only what was asked


def test_layers_subset_and_batch(store):
    """``layers=`` selects the layers of every activation capture; (B, T) ids add a leading B axis
    and each row matches its own reference run."""
    hf, model = store("gqa_tied", "gguf")
    ids = rm.random_ids(hf.config.vocab_size, 15, seed=3, batch=2)
    tr = model.run(ids, capture=ACTIVATIONS + ("attn",), layers=[3, 1], progress=False)
    assert tr.layers == [1, 3] and tr.attn.shape[:2] == (2, 2)
    for b in range(2):
        row = sl.Trace(ids=ids[b], layers=tr.layers, **{k: getattr(tr, k)[b] for k in ACTIVATIONS})
        check_captures(row, hf_captures(hf, ids[b]), layers=[1, 3], case=f"batch row {b}")


def test_z_and_outputs_follow_head_scale(store):
    """z is what W_O reads after interventions: with Intervention(head_scale=...) every capture
    matches HF whose o_proj input is scaled per head by a pre-hook."""
    hf, model = store("gqa_tied", "safetensors")
    c = model.config
    scale = np.random.default_rng(0).uniform(0.0, 2.0, (c.n_layers, c.n_heads)).astype(np.float32)
    scale[1, 2] = 0.0
    ids = rm.random_ids(hf.config.vocab_size, 19, seed=5)
    tr = model.run(ids, capture=ACTIVATIONS, intervene=sl.Intervention(head_scale=scale))
    ref = hf_captures(hf, ids, head_scale=scale)
    check_captures(tr, ref, case="head_scale")
    assert not tr.z[1, 2].any() and not tr.head_out[1, 2].any()
    # the scale acts on z: the unscaled run differs in z but not in q, k, v of the same layer 0
    plain = model.run(ids, capture=("q", "v", "z"), layers=[0])
    np.testing.assert_array_equal(plain.q[0], tr.q[0])
    np.testing.assert_array_equal(plain.v[0], tr.v[0])
    assert not np.array_equal(plain.z[0], tr.z[0])


def test_captures_smollm2(smollm2_gguf):
    """The real GGUF (Q4_1, Q/K rows permuted by llama.cpp) against transformers' own GGUF loader
    (which un-permutes Q/K): every activation capture, every layer."""
    path = smollm2_gguf
    hf = rm.hf_gguf_reference(str(path))[0]
    model = sl.load(str(path), quiet=True)
    ids = model.tokenize("My sister's new job starts next week in the city centre.", bos=True)
    tr = model.run(ids, capture=ACTIVATIONS)
    check_captures(tr, hf_captures(hf, ids), case="smollm2")


def test_captures_bitwise_equal_for_any_thread_count(smollm2_gguf):
    """1 and 2 threads give bitwise identical captures (T large enough for the kernels to split)."""
    model = sl.load(str(smollm2_gguf), quiet=True)
    ids = rm.random_ids(model.config.vocab_size, 96, seed=2)
    before = sl.get_num_threads()
    runs = []
    try:
        for n in (1, 2):
            sl.set_num_threads(n)
            runs.append(model.run(ids, capture=ACTIVATIONS, layers=[0, 7, 29]))
    finally:
        sl.set_num_threads(before)
    for name in ACTIVATIONS:
        a, b = getattr(runs[0], name), getattr(runs[1], name)
        assert a.tobytes() == b.tobytes(), name


def test_capture_names_and_sizes(store):
    hf, model = store("odd", "safetensors")
    c = model.config
    ids = rm.random_ids(hf.config.vocab_size, 9, seed=1)
    with pytest.raises(ValueError, match=r"unknown capture \['hook_z'\]"):
        model.run(ids, capture=("z", "hook_z"))
    with pytest.raises(ValueError, match="unknown capture"):
        model.capture_bytes(9, "result")
    # sizes, written out from the documented shapes (L' = 2 layers, B = 3)
    B, T, Ls = 3, 9, 2
    need = model.capture_bytes(T, ACTIVATIONS, layers=[0, 4], B=B)
    H, G, hd, d = c.n_heads, c.n_kv_heads, c.head_dim, c.d_model
    assert need == {"q": 4 * B * Ls * H * T * hd, "k": 4 * B * Ls * G * T * hd, "v": 4 * B * Ls * G * T * hd,
                    "z": 4 * B * Ls * H * T * hd, "head_out": 4 * B * Ls * H * T * d,
                    "attn_out": 4 * B * Ls * T * d, "mlp_out": 4 * B * Ls * T * d}
    tr = model.run(np.tile(ids, (B, 1)), capture=ACTIVATIONS, layers=[0, 4], progress=False)
    assert {k: getattr(tr, k).nbytes for k in ACTIVATIONS} == need
    assert set(ACTIVATIONS) <= set(CAPTURES)


def test_too_large_activation_capture_raises_before_running(store, monkeypatch):
    from sinklab import model as sm

    hf, model = store("odd", "safetensors")
    ids = rm.random_ids(hf.config.vocab_size, 9, seed=1)
    need = model.capture_bytes(9, "head_out")["head_out"]
    monkeypatch.setattr(sm, "available_memory", lambda: need - 1)
    with pytest.raises(MemoryError, match=r"head_out alone is .*layers=\[\.\.\.\]"):
        model.run(ids, capture="head_out")
    assert model.run(ids, capture="head_out", layers=[0]).head_out.shape == (1, 3, 9, 72)


def test_trace_save_load_keeps_captures(store, tmp_path):
    hf, model = store("mha", "safetensors")
    ids = rm.random_ids(hf.config.vocab_size, 7, seed=4)
    tr = model.run(ids, capture=ACTIVATIONS + ("logits",), layers=[2])
    back = sl.Trace.load(tr.save(tmp_path / "tr"))
    for name in ACTIVATIONS + ("ids", "logits"):
        np.testing.assert_array_equal(getattr(back, name), getattr(tr, name))
    assert back.layers == [2] and back.attn is None
    assert "head_out (1, 4, 7, 64) float32" in repr(tr)
