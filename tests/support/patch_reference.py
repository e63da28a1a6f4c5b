"""The independent reference for activation patching: a Hugging Face decoder (LLaMA, Qwen2,
Gemma 3 and the other families with ``model.model.layers``) run in fp32 eager with forward hooks
and a wrapped ``eager_attention_forward`` that do each patch the way a user of transformers would.

A patch here is a plain dict: point (sinklab's names), layer, mode ("replace"/"add"), rows,
positions, heads (None for stream points), value (n_rows, [n_heads,] n_pos, width) in sinklab's
layout (head-major). Nothing of sinklab is used.

Where each point is patched:
  resid[l]     forward pre-hook of decoder layer l (l = L: forward hook of the last layer)
  attn_out     the attention block's addition: self_attn's output (Gemma: post_attention_layernorm's)
  mlp_out      the MLP's addition: mlp's output (Gemma: post_feedforward_layernorm's)
  z            forward pre-hook of o_proj, input viewed (B, T, H, hd)
  head_out     forward hook of o_proj: out += v - z_h W_O[:, h]^T (replace) or += v (add)
  q, k, v      the query (B, H, T, hd) after RoPE, key and value (B, G, T, hd) that
               eager_attention_forward receives
  pattern      its probabilities (B, H, T, T); the output recomputed as P' @ repeat_kv(V)
"""
from __future__ import annotations

from typing import Dict, List

import numpy as np

from tests.support.reference_models import _modeling_module, require


def _entries(p):
    """(i, j, k, b, h, t) for every patched entry (j, h = 0 for stream points)."""
    heads = p.get("heads")
    for i, b in enumerate(p["rows"]):
        for j, h in enumerate([0] if heads is None else heads):
            for k, t in enumerate(p["positions"]):
                yield i, j, k, int(b), int(h), int(t)


def _val(p, i, j, k, like):
    torch = require("torch")
    v = p["value"][i, k] if p.get("heads") is None else p["value"][i, j, k]
    return torch.as_tensor(np.asarray(v, np.float32), dtype=like.dtype)


def _put(dst, src, mode):
    if mode == "add":
        dst += src
    else:
        dst[...] = src


def _is_gemma(layer) -> bool:
    return hasattr(layer, "pre_feedforward_layernorm")


def hf_patched(model, ids, patches: List[dict], x0=None, grad: bool = False) -> Dict[str, object]:
    """logits (B, T, V) and resid (B, L+1, T, d) of ``model`` on ids (B, T) with ``patches``
    (numpy). With ``grad``, torch tensors in the autograd graph instead (resid a list of L+1), and
    ``x0`` (B, T, d), when given, taken as resid[0] (the embeddings) before resid[0]'s patches."""
    torch = require("torch")
    layers = model.model.layers
    L = len(layers)
    resid = [None] * (L + 1)
    by = lambda point, l: [p for p in patches if p["point"] == point and p["layer"] == l]  # noqa: E731
    handles = []

    def patch_stream(h, point, l):
        ps = by(point, l)
        if not ps:
            return h
        h = h.clone()
        for p in ps:
            for i, j, k, b, _, t in _entries(p):
                _put(h[b, t], _val(p, i, j, k, h), p["mode"])
        return h

    def pre_layer(l):
        def hook(_mod, args, kwargs):
            h = args[0] if args else kwargs["hidden_states"]
            if l == 0 and x0 is not None:
                h = x0.to(h.dtype)
            h = patch_stream(h, "resid", l)
            if args:
                args = (h,) + tuple(args[1:])
            else:
                kwargs = dict(kwargs, hidden_states=h)
            resid[l] = h if grad else h.detach()
            return args, kwargs
        return hook

    def out_hook(point, l, final=False):
        def hook(_mod, _args, out):
            h = out[0] if isinstance(out, (tuple, list)) else out
            h = patch_stream(h, point, l)
            if final:
                resid[L] = h if grad else h.detach()
            return type(out)((h,) + tuple(out[1:])) if isinstance(out, (tuple, list)) else h
        return hook

    def o_pre(l):
        def hook(mod, args):
            ps = by("z", l)
            if not ps:
                return None
            z = args[0].clone()
            B, T, qd = z.shape
            hd = qd // model.config.num_attention_heads
            zv = z.view(B, T, -1, hd)
            for p in ps:
                for i, j, k, b, h, t in _entries(p):
                    _put(zv[b, t, h], _val(p, i, j, k, z), p["mode"])
            return (z,) + tuple(args[1:])
        return hook

    def o_post(l):
        def hook(mod, args, out):
            ps = by("head_out", l)
            if not ps:
                return None
            z = args[0]
            hd = z.shape[-1] // model.config.num_attention_heads
            out = out.clone()
            W = mod.weight
            for p in ps:
                for i, j, k, b, h, t in _entries(p):
                    v = _val(p, i, j, k, out)
                    if p["mode"] == "replace":
                        own = z[b, t, h * hd:(h + 1) * hd] @ W[:, h * hd:(h + 1) * hd].T
                        out[b, t] += v - own
                    else:
                        out[b, t] += v
            return out
        return hook

    for l, blk in enumerate(layers):
        handles.append(blk.register_forward_pre_hook(pre_layer(l), with_kwargs=True))
        gem = _is_gemma(blk)
        handles.append((blk.post_attention_layernorm if gem else blk.self_attn).register_forward_hook(
            out_hook("attn_out", l)))
        handles.append((blk.post_feedforward_layernorm if gem else blk.mlp).register_forward_hook(
            out_hook("mlp_out", l)))
        handles.append(blk.self_attn.o_proj.register_forward_pre_hook(o_pre(l)))
        handles.append(blk.self_attn.o_proj.register_forward_hook(o_post(l)))
    handles.append(layers[-1].register_forward_hook(out_hook("resid", L, final=True)))

    mod = _modeling_module(model)
    orig = mod.eager_attention_forward

    def attention(module, query, key, value, attention_mask, *args, **kwargs):
        l = module.layer_idx
        tensors = {"q": query, "k": key, "v": value}
        for name in ("q", "k", "v"):
            ps = by(name, l)
            if ps:
                x = tensors[name].clone()
                for p in ps:
                    for i, j, k, b, h, t in _entries(p):
                        _put(x[b, h, t], _val(p, i, j, k, x), p["mode"])
                tensors[name] = x
        out, probs = orig(module, tensors["q"], tensors["k"], tensors["v"], attention_mask, *args, **kwargs)
        ps = by("pattern", l)
        if ps:
            probs = probs.clone()
            for p in ps:
                for i, j, k, b, h, t in _entries(p):
                    _put(probs[b, h, t], _val(p, i, j, k, probs), p["mode"])
            vv = mod.repeat_kv(tensors["v"], module.num_key_value_groups)
            out = torch.matmul(probs, vv).transpose(1, 2).contiguous()
        return out, probs

    mod.eager_attention_forward = attention
    try:
        with torch.set_grad_enabled(grad):
            out = model(input_ids=torch.as_tensor(np.asarray(ids, np.int64)), use_cache=False)
    finally:
        mod.eager_attention_forward = orig
        for hd in handles:
            hd.remove()
    if grad:
        return {"logits": out.logits, "resid": resid}
    return {"logits": out.logits.float().numpy(), "resid": torch.stack(resid, dim=1).float().numpy()}
