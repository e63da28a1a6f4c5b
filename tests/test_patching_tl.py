"""Activation patching against TransformerLens itself (its v4 ``TransformerBridge`` over the same
Hugging Face model): every TL hook name sinklab accepts as an alias names the tensor TL's hook
sees (up to the documented layout: head-major here, position-major in TL; ``hook_result`` once
the bridge is asked for it), and the same patch
done by a TL hook in ``run_with_hooks`` and by ``model.run(patch=...)`` gives the same logits.
What differs, and is checked to differ: TL's ``hook_q``/``hook_k`` are before RoPE, so sinklab
refuses those two aliases on a rotary model rather than patch the post-RoPE tensor under a
pre-RoPE name. (tests/test_patching.py checks the same patches against plain transformers
forward hooks, on more families.)
"""
import numpy as np
import pytest

from tests.support import reference_models as rm

import sinklab as sl  # noqa: E402

SPEC = rm.TinySpec("tl", d_model=64, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=16,
                   d_ff=128, vocab_size=300, context_length=128, seed=9)
T = 14
LAYER = 1
POS = [0, 3, 9]      # position 0 is the sink's
HEADS = [1, 3]
KV_HEADS = [1]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    torch = rm.require("torch")
    rm.require("transformers")
    tl = rm.require("transformer_lens")  # noqa: F841  (the import is the requirement)
    from transformer_lens.model_bridge import TransformerBridge

    hf = rm.make_hf_model(SPEC)
    folder = rm.save_hf(hf, tmp_path_factory.mktemp("tl") / "hf")
    bridge = TransformerBridge.boot_transformers(str(folder), hf_model=hf)
    bridge.set_use_attn_result(True)    # hook_result (per-head outputs) is computed only on request
    torch.manual_seed(0)
    return sl.load(folder), bridge, torch


def _ids():
    return rm.random_ids(SPEC.vocab_size, T, seed=4)


def _tl_run(bridge, torch, ids, hooks=()):
    with torch.no_grad():
        out = bridge.run_with_hooks(torch.tensor(ids)[None], fwd_hooks=list(hooks))
    return out[0].float().numpy()


# TL name -> (sinklab capture, how a (T, ...) sinklab array reads as TL's per-sequence array)
ALIASES = {
    "hook_resid_pre": ("resid", lambda a, l: a[l]),
    "hook_attn_out": ("attn_out", lambda a, l: a[l]),
    "hook_mlp_out": ("mlp_out", lambda a, l: a[l]),
    "attn.hook_z": ("z", lambda a, l: a[l].transpose(1, 0, 2)),
    "attn.hook_v": ("v", lambda a, l: a[l].transpose(1, 0, 2)),
    "attn.hook_rot_q": ("q", lambda a, l: a[l].transpose(1, 0, 2)),
    "attn.hook_rot_k": ("k", lambda a, l: a[l].transpose(1, 0, 2)),
    "attn.hook_pattern": ("attn", lambda a, l: a[l]),
    "attn.hook_result": ("head_out", lambda a, l: a[l].transpose(1, 0, 2)),
}


def test_every_alias_names_the_tensor_tl_hooks(pair):
    model, bridge, torch = pair
    ids = _ids()
    with torch.no_grad():
        _, cache = bridge.run_with_cache(torch.tensor(ids)[None])
    tr = model.run(ids, capture=tuple(c for c, _ in ALIASES.values()), progress=False)
    for name, (cap, as_tl) in ALIASES.items():
        for layer in range(SPEC.n_layers):
            want = cache[f"blocks.{layer}.{name}"][0].float().numpy()
            rm.assert_close(f"blocks.{layer}.{name}", as_tl(getattr(tr, cap), layer), want, rtol=1e-4)
    # hook_resid_post of layer l is resid l + 1 (the alias sinklab resolves it to)
    rm.assert_close("hook_resid_post", tr.resid[LAYER + 1],
                    cache[f"blocks.{LAYER}.hook_resid_post"][0].float().numpy(), rtol=1e-4)


def _value(shape, seed):
    return np.random.default_rng(seed).normal(0.0, 1.0, shape).astype(np.float32)


def _pattern_rows(seed):
    p = np.random.default_rng(seed).random((len(HEADS), len(POS), T)).astype(np.float32)
    return p / p.sum(axis=-1, keepdims=True)


# (TL hook, sinklab patch kwargs, the TL-layout value setter)
def _cases():
    d, hd = SPEC.d_model, SPEC.head_dim
    v_res = _value((len(POS), d), 1)
    v_z = _value((len(POS), len(HEADS), hd), 2)        # TL layout: (pos, head, d_head)
    v_v = _value((len(POS), len(KV_HEADS), hd), 3)
    v_pat = _pattern_rows(4)                            # TL layout: (head, query, key)
    v_head = _value((len(POS), len(HEADS), d), 6)
    return {
        "resid replace": ("hook_resid_pre", dict(value=v_res, positions=POS), v_res, None),
        "attn_out add": ("hook_attn_out", dict(value=v_res, positions=POS, mode="add"), v_res, "add"),
        "mlp_out replace": ("hook_mlp_out", dict(value=v_res, positions=POS), v_res, None),
        "z replace": ("attn.hook_z", dict(value=v_z.transpose(1, 0, 2), positions=POS, heads=HEADS), v_z, "heads"),
        "v replace": ("attn.hook_v", dict(value=v_v.transpose(1, 0, 2), positions=POS, heads=KV_HEADS), v_v, "kv"),
        "rot_q replace": ("attn.hook_rot_q", dict(value=v_z.transpose(1, 0, 2), positions=POS, heads=HEADS), v_z, "heads"),
        "rot_k add": ("attn.hook_rot_k", dict(value=v_v.transpose(1, 0, 2), positions=POS, heads=KV_HEADS, mode="add"),
                      v_v, "kv add"),
        "head_out replace": ("attn.hook_result", dict(value=v_head.transpose(1, 0, 2), positions=POS, heads=HEADS),
                             v_head, "heads"),
        "pattern replace": ("attn.hook_pattern", dict(value=v_pat, positions=POS, heads=HEADS), v_pat, "pattern"),
    }


def _tl_hook(torch, value, how):
    """A TL forward hook doing the patch on its (batch, pos, ...) tensor (pattern: (batch, head,
    query, key))."""
    val = torch.tensor(value)
    heads = KV_HEADS if how and how.startswith("kv") else HEADS

    def hook(x, hook):
        x = x.clone()
        for i, p in enumerate(POS):
            if how in (None, "add"):
                x[0, p] = val[i] if how is None else x[0, p] + val[i]
                continue
            for j, h in enumerate(heads):
                if how == "pattern":
                    x[0, h, p] = val[j, i]
                elif how.endswith("add"):
                    x[0, p, h] = x[0, p, h] + val[i, j]
                else:
                    x[0, p, h] = val[i, j]
        return x
    return hook


@pytest.mark.parametrize("case", list(_cases()))
def test_the_same_patch_gives_transformerlens_logits(pair, case):
    model, bridge, torch = pair
    ids = _ids()
    name, kw, tl_value, how = _cases()[case]
    want = _tl_run(bridge, torch, ids, [(f"blocks.{LAYER}.{name}", _tl_hook(torch, tl_value, how))])
    clean = _tl_run(bridge, torch, ids)
    assert np.abs(want - clean).max() > 1e-3, f"{case}: the TL patch changed nothing (the test would be empty)"
    got = model.run(ids, capture=("logits",), patch=sl.Patch(f"blocks.{LAYER}.{name}", **kw), progress=False).logits
    rm.assert_close(f"{case} logits", got, want, rtol=1e-4)


def test_pre_rope_aliases_are_refused_on_a_rotary_model(pair):
    model, bridge, torch = pair
    ids = _ids()
    with torch.no_grad():
        _, cache = bridge.run_with_cache(torch.tensor(ids)[None])
    pre, post = (cache[f"blocks.{LAYER}.attn.{n}"][0].float().numpy() for n in ("hook_q", "hook_rot_q"))
    assert np.abs(pre[1:] - post[1:]).max() > 1e-3, "TL's hook_q is not before RoPE here"
    v = _value((len(HEADS), len(POS), SPEC.head_dim), 5)
    with pytest.raises(ValueError, match="hook_rot_q"):
        model.run(ids, capture=("logits",), patch=sl.Patch(f"blocks.{LAYER}.attn.hook_q", value=v, positions=POS,
                                                             heads=HEADS), progress=False)
