"""Attention variants that need no ⟨bos⟩ sink in the model and the training engine
(``ModelConfig.attn_variant``: ``"sink_logit"``, ``"softmax1"``, ``"gated"``).

The reference is a float64 PyTorch LLaMA written here from the definitions (RMSNorm, RoPE in
Hugging Face's rotate-half layout, SwiGLU, grouped-query heads), with the sink as an extra logit
column dropped after the softmax and the gate as z * sigmoid(a W_gᵀ) before W_O: one Trainer
step's loss and every gradient (torch.autograd), the captured probabilities, and the model's
VJP / JVP through the residual stream (torch.func). Training-side properties: initialisation,
weight decay on W_g but not on s_h, checkpoints that resume bitwise, and run names of softmax
configs unchanged.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import sinklab
from sinklab.families.config import ModelConfig
from sinklab.train import AdamW, Trainer, llama_config
from sinklab.train import checkpoint as ckpt_io
from sinklab.train.experiments import run_config
from sinklab.train.run import ConfigError, TrainConfig
from tests.support.reference_models import require

torch = require("torch")

RTOL = 1e-4
VARIANTS = ("sink_logit", "softmax1", "gated")
V, D, L, H, G, T = 97, 32, 2, 4, 2, 24


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def trainer(variant, seed=0, wd=0.1):
    cfg = llama_config(vocab_size=V, d_model=D, n_layers=L, n_heads=H, n_kv_heads=G, context_length=T,
                       attn_variant=variant)
    tr = Trainer(cfg, seed=seed, init_std=0.08, optimizer=AdamW(weight_decay=wd, grad_clip=0.0))
    if variant == "sink_logit":  # away from their initial 0, so the test sees a per-head logit
        r = np.random.default_rng(seed + 10)
        for l in range(L):
            tr.weights[f"blk.{l}.attn_sinks"][:] = r.uniform(-1.5, 1.5, H).astype(np.float32)
    return tr


# ---------------------------------------------------------------- float64 reference

def rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rot(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), -1)


def ref_layers(P, x, cfg, mask, upto=None):
    """resid[0..upto] of the reference decoder from resid[0] = x (T, d): a list of (T, d)."""
    hd, Tn = cfg.head_dim, x.shape[0]
    inv = 1.0 / cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    ang = torch.outer(torch.arange(Tn, dtype=torch.float64), inv)
    cos, sin = torch.cat((ang, ang), -1).cos(), torch.cat((ang, ang), -1).sin()
    out = [x]
    for l in range(cfg.n_layers if upto is None else upto):
        w = lambda k: P[f"blk.{l}.{k}"]  # noqa: E731
        a = rms(x, w("attn_norm"), cfg.norm_eps)
        q = (a @ w("attn_q").T).view(Tn, cfg.n_heads, hd).transpose(0, 1)
        k = (a @ w("attn_k").T).view(Tn, cfg.n_kv_heads, hd).transpose(0, 1)
        v = (a @ w("attn_v").T).view(Tn, cfg.n_kv_heads, hd).transpose(0, 1)
        q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
        rep = cfg.n_heads // cfg.n_kv_heads
        k, v = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
        z = (q @ k.transpose(1, 2)) / math.sqrt(hd)
        z = z.masked_fill(~mask, float("-inf"))
        if cfg.attn_variant in ("sink_logit", "softmax1"):
            s = w("attn_sinks") if cfg.attn_variant == "sink_logit" else torch.zeros(cfg.n_heads, dtype=z.dtype)
            p = torch.softmax(torch.cat([z, s[:, None, None].expand(-1, Tn, 1)], -1), -1)[..., :Tn]
        else:
            p = torch.softmax(z, -1)
        o = (p @ v).transpose(0, 1).reshape(Tn, cfg.n_heads * hd)
        if cfg.attn_variant == "gated":
            o = o * torch.sigmoid(a @ w("attn_gate").T)
        x = x + o @ w("attn_output").T
        m = rms(x, w("ffn_norm"), cfg.norm_eps)
        x = x + (torch.nn.functional.silu(m @ w("ffn_gate").T) * (m @ w("ffn_up").T)) @ w("ffn_down").T
        out.append(x)
    return out


def ref_probs(P, x, cfg, mask, layer):
    """The key probabilities (H, T, T) of ``layer``, recomputed as ref_layers does."""
    captured = {}
    orig = torch.softmax

    def spy(t, dim):
        r = orig(t, dim)
        captured.setdefault("p", []).append(r[..., :x.shape[0]])
        return r
    torch.softmax = spy
    try:
        ref_layers(P, x, cfg, mask, upto=layer + 1)
    finally:
        torch.softmax = orig
    return captured["p"][layer]


def ref_loss(P, ids, targets, cfg, mask):
    x = P["tok_embd"][torch.as_tensor(ids)]
    h = ref_layers(P, x, cfg, mask)[-1]
    logits = rms(h, P["out_norm"], cfg.norm_eps) @ P["lm_head"].T
    tg = torch.as_tensor(targets)
    keep = tg >= 0
    return torch.nn.functional.cross_entropy(logits[keep], tg[keep], reduction="sum")


def params64(weights):
    return {k: torch.tensor(np.asarray(v, np.float64), requires_grad=True) for k, v in weights.items()
            if k != "rope_inv_freq"}


def dense_mask(key_start=None, keep_first=False):
    j = torch.arange(T)
    m = j[None, :] <= j[:, None]
    if key_start is not None:
        m &= j[None, :] >= torch.as_tensor(key_start)[:, None]
        if keep_first:
            m[:, 0] = True
    return m


def windows(seed, B=2):
    r = np.random.default_rng(seed)
    ids = r.integers(1, V, (B, T))
    targets = r.integers(1, V, (B, T))
    targets[0, -4:] = -1
    ids[:, 0] = 0  # a fixed first token
    ks = np.zeros((B, T), np.int64)
    for b in range(B):
        starts = np.sort(r.choice(np.arange(2, T), 2, replace=False))
        for s0 in starts:
            ks[b, s0:] = s0
    return ids, targets, ks


# ---------------------------------------------------------------- model level

@pytest.mark.parametrize("masking", ["causal", "intra_doc_fixed_bos"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_trainer_step_loss_and_gradients_match_float64_torch(variant, masking):
    """One Trainer step (no clipping): its loss and every parameter gradient within 1e-4 relative
    of float64 torch.autograd on the variant's reference LLaMA."""
    tr = trainer(variant)
    ids, targets, ks = windows(1)
    intra = masking != "causal"
    P = params64(tr.weights)
    n = int((targets >= 0).sum())
    total = sum(ref_loss(P, ids[b], targets[b], tr.config, dense_mask(ks[b] if intra else None, intra))
                for b in range(ids.shape[0])) / n
    total.backward()
    loss, _ = tr.step(ids, targets, 1e-3, key_start=ks if intra else None, keep_first=intra)
    assert abs(loss - float(total)) <= RTOL * float(total)
    names = [s.name for s in tr.layout]
    assert any(k.endswith({"sink_logit": "attn_sinks", "gated": "attn_gate"}.get(variant, "attn_q")) for k in names)
    for key in names:
        assert rel(tr.grad_views[key], P[key].grad) <= RTOL, (key, rel(tr.grad_views[key], P[key].grad))


@pytest.mark.parametrize("variant", VARIANTS)
def test_captured_probabilities_are_the_real_keys(variant):
    """Model.run's attention: the reference's key probabilities (rows < 1 with a sink), and a
    batch of two prompts bitwise the prompts run alone (the batched attention path)."""
    tr = trainer(variant, seed=2)
    ids, _, _ = windows(3)
    tr_run = tr.model.run(ids[0], capture=("attn",))
    P = params64(tr.weights)
    x = P["tok_embd"][torch.as_tensor(ids[0])]
    for layer in range(L):
        ref = ref_probs(P, x, tr.config, dense_mask(), layer).detach().numpy()
        assert np.max(np.abs(tr_run.attn[layer] - ref)) <= RTOL
    rows = tr_run.attn.astype(np.float64).sum(-1)
    if variant == "gated":
        assert np.allclose(rows, 1.0, atol=1e-5)
    else:
        assert np.all(rows < 1.0)
    short = ids[1, :15]
    padded = np.stack([ids[0], np.concatenate([short, np.zeros(T - 15, np.int64)])])
    batch = tr.model.run(padded, capture=("attn", "logits"), lengths=[T, 15])
    alone = tr.model.run(short, capture=("attn", "logits"))
    assert np.array_equal(batch.attn[0], tr_run.attn)
    assert np.array_equal(batch.attn[1][:, :, :15, :15], alone.attn)
    assert np.array_equal(batch.logits[1][:15], alone.logits)


@pytest.mark.parametrize("variant", VARIANTS)
def test_vjp_and_jvp_match_torch(variant):
    """Model.vjp / Model.jvp of resid[L] w.r.t. resid[0] against torch.func on the reference."""
    tr = trainer(variant, seed=4)
    ids, _, _ = windows(5)
    ids = ids[0, :16]
    Tn = ids.shape[0]
    P = {k: v.detach() for k, v in params64(tr.weights).items()}
    r = np.random.default_rng(6)
    cot = r.standard_normal((Tn, D)).astype(np.float32)
    tan = r.standard_normal((Tn, D)).astype(np.float32)
    x0 = P["tok_embd"][torch.as_tensor(ids)]
    mask = torch.arange(Tn)[None, :] <= torch.arange(Tn)[:, None]
    f = lambda x: ref_layers(P, x, tr.config, mask)[-1]  # noqa: E731
    _, pull = torch.func.vjp(f, x0)
    (ref_g,) = pull(torch.as_tensor(cot, dtype=torch.float64))
    _, ref_t = torch.func.jvp(f, (x0,), (torch.as_tensor(tan, dtype=torch.float64),))
    g = tr.model.vjp(ids, cot, at=L, layers=[0])[0]
    t = tr.model.jvp(ids, tan, at=0)[-1]
    assert rel(g, ref_g) <= RTOL
    assert rel(t, ref_t) <= RTOL


def test_model_rejects_inconsistent_variants():
    with pytest.raises(ValueError, match="attn_variant"):
        ModelConfig(arch="llama", n_layers=1, n_heads=2, n_kv_heads=2, d_model=8, head_dim=4, d_ff=16, vocab_size=10,
                    context_length=8, rope_theta=1e4, norm_eps=1e-5, tied_embeddings=False, attn_variant="sigmoid")
    tr = trainer("sink_logit")
    w = dict(tr.weights)
    cfg = llama_config(vocab_size=V, d_model=D, n_layers=L, n_heads=H, n_kv_heads=G, context_length=T)
    with pytest.raises(ValueError, match="attn_sinks"):  # a softmax model given sink logits
        sinklab.Model(cfg, w, None, "<test>", 0)
    gated = llama_config(vocab_size=V, d_model=D, n_layers=L, n_heads=H, n_kv_heads=G, context_length=T,
                         attn_variant="gated")
    del w["blk.0.attn_sinks"], w["blk.1.attn_sinks"]
    with pytest.raises(ValueError, match="attn_gate"):
        sinklab.Model(gated, w, None, "<test>", 0)
    bad = dict(tr.weights)
    bad["blk.1.attn_sinks"] = np.array([0, np.nan, 0, 0], np.float32)
    with pytest.raises(ValueError, match="sinks"):
        sinklab.Model(tr.config, bad, None, "<test>", 0).run(np.arange(5))


# ---------------------------------------------------------------- training

def test_initialisation_and_weight_decay():
    """s_h starts at 0 and takes no weight decay; W_g starts N(0, std²) and is decayed: after one
    AdamW step (bias-corrected first step: update = -lr g/(|g| + eps) - lr wd w), the sink's
    update has no decay term and the gate's has it."""
    cfg = llama_config(vocab_size=V, d_model=D, n_layers=L, n_heads=H, n_kv_heads=G, context_length=T,
                       attn_variant="sink_logit")
    tr = Trainer(cfg, seed=0, init_std=0.08)
    assert all(not tr.weights[f"blk.{l}.attn_sinks"].any() for l in range(L))
    gated = Trainer(llama_config(vocab_size=V, d_model=D, n_layers=L, n_heads=H, n_kv_heads=G, context_length=T,
                                 attn_variant="gated"), seed=0, init_std=0.08)
    wg = np.concatenate([gated.weights[f"blk.{l}.attn_gate"].ravel() for l in range(L)])
    assert abs(wg.std() - 0.08) < 0.08 * 0.05 and abs(wg.mean()) < 0.01
    # a softmax model's layout and initial weights are those of the same seed without variants
    plain = Trainer(llama_config(vocab_size=V, d_model=D, n_layers=L, n_heads=H, n_kv_heads=G, context_length=T),
                    seed=0, init_std=0.08)
    assert all(np.array_equal(plain.weights[k], tr.weights[k]) for k in plain.weights)
    lr, wd = 1e-2, 0.5
    for t, key in ((trainer("sink_logit", wd=wd), "blk.0.attn_sinks"), (trainer("gated", wd=wd), "blk.0.attn_gate")):
        ids, targets, _ = windows(7)
        before = t.weights[key].astype(np.float64).copy()
        t.step(ids, targets, lr)
        g = t.grad_views[key].astype(np.float64)
        adam = -lr * g / (np.abs(g) + t.optimizer.eps)
        decay = -lr * wd * before
        got = t.weights[key] - before
        if key.endswith("attn_sinks"):
            assert np.max(np.abs(got - adam)) <= 1e-6 and np.max(np.abs(decay)) > 1e-3
        else:
            assert np.max(np.abs(got - (adam + decay))) <= 1e-6


@pytest.mark.parametrize("variant", ["sink_logit", "gated"])
def test_checkpoint_round_trip_resumes_bitwise(variant, tmp_path):
    """Two steps straight, or one step, a checkpoint, a new trainer from it and the second step:
    the same weights (the variant's tensors included), moments and loss, bitwise."""
    ids1, tg1, _ = windows(8)
    ids2, tg2, _ = windows(9)
    a = trainer(variant)
    a.step(ids1, tg1, 1e-3)
    folder = ckpt_io.save_checkpoint(a, str(tmp_path / "run"))
    ck = ckpt_io.load_checkpoint(folder)
    assert ck.config.attn_variant == variant
    b = ckpt_io.trainer_from_checkpoint(ck)
    la, _ = a.step(ids2, tg2, 1e-3)
    lb, _ = b.step(ids2, tg2, 1e-3)
    assert la == lb
    for k in a.weights:
        assert np.array_equal(a.weights[k], b.weights[k]), k
    assert np.array_equal(a.mom, b.mom) and np.array_equal(a.vel, b.vel)


def test_train_config_attention_field():
    assert TrainConfig().attention == "softmax"
    with pytest.raises(ConfigError, match="attention"):
        TrainConfig(attention="sigmoid").validate()
    # softmax runs keep the folder names they had before the field existed (computed with b82faf3)
    assert run_config("quick", 64).out_dir.endswith("quick-C64-causal-e1eaba989b")
    assert run_config("quick", 256, "intra_doc", True).out_dir.endswith("quick-C256-intra_doc-bos-0d750ced06")
    names = {run_config("quick", 64, attention=a).out_dir for a in ("softmax",) + VARIANTS}
    assert len(names) == 4 and run_config("quick", 64, attention="gated").out_dir.split("-")[-2] == "gated"


@pytest.mark.parametrize("variant", VARIANTS)
def test_load_of_a_variant_checkpoint_runs_the_variant(variant, tmp_path):
    """sinklab.load of a saved variant checkpoint reads its sink logits / gate (config.json's
    sinklab_attn_variant): its logits are the float64 reference's of the same weights (a softmax
    LLaMA built from the same file would differ by the sink's share or the gate)."""
    tr = trainer(variant)
    folder = ckpt_io.save_checkpoint(tr, str(tmp_path / "run"))
    m = sinklab.load(folder)
    assert m.config.attn_variant == variant
    ids = np.random.default_rng(3).integers(0, V, T)
    got = m.run(ids, capture="logits", progress=False).logits
    P = params64(tr.weights)
    cfg = tr.config
    h = ref_layers(P, P["tok_embd"][torch.as_tensor(ids)], cfg, dense_mask())[-1]
    ref = (rms(h, P["out_norm"], cfg.norm_eps) @ P["lm_head"].T).detach().numpy()
    assert rel(got, ref) <= RTOL
    softmax_cfg = ModelConfig(**{**cfg.__dict__, "attn_variant": "softmax"})
    h0 = ref_layers(P, P["tok_embd"][torch.as_tensor(ids)], softmax_cfg, dense_mask())[-1]
    assert rel(got, (rms(h0, P["out_norm"], cfg.norm_eps) @ P["lm_head"].T).detach().numpy()) > 100 * RTOL


def test_load_rejects_an_unknown_variant_in_config(tmp_path):
    import json
    import shutil
    tr = trainer("softmax1")
    folder = ckpt_io.save_checkpoint(tr, str(tmp_path / "run"))
    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    c = json.loads((bad / "config.json").read_text())
    c["sinklab_attn_variant"] = "sigmoid"
    (bad / "config.json").write_text(json.dumps(c))
    with pytest.raises(ValueError, match="attn_variant"):
        sinklab.load(str(bad))


def test_z_of_a_gated_model_is_after_the_gate_in_captures_and_patches(tmp_path):
    """On a gated-attention model, ``z`` (the capture and the patch point) is the head output
    after the gate, z ⊙ σ(W_g a): what W_O reads. Checked against the float64 torch model of the
    same weights with a pre-hook on W_O, and a patch placed before the gate gives other logits."""
    torch = require("torch")
    from tests.support import torch_llama

    tr = trainer("gated")
    m = sinklab.load(ckpt_io.save_checkpoint(tr, str(tmp_path / "run")))
    tm = torch_llama.TorchLlama.from_config(tr.config)
    torch_llama.copy_sinklab_weights(tm, tr.weights)
    tm = tm.double()
    hd = D // H
    ids = np.random.default_rng(5).integers(0, V, T)
    seen, normed = {}, {}
    hooks = [b.o.register_forward_pre_hook(lambda mod, a, l=l: seen.__setitem__(l, a[0].detach().clone()))
             for l, b in enumerate(tm.blocks)]
    hooks += [b.attn_norm.register_forward_hook(lambda mod, a, out, l=l: normed.__setitem__(l, out.detach()))
              for l, b in enumerate(tm.blocks)]
    with torch.no_grad():
        tm(torch.as_tensor(ids)[None])
    for h in hooks:
        h.remove()
    z = m.run(ids, capture="z", progress=False).z                          # (L, H, T, hd)
    for l in range(L):
        ref = seen[l][0].reshape(T, H, hd).permute(1, 0, 2).numpy()
        assert rel(z[l], ref) <= RTOL, l
    P = np.random.default_rng(6).standard_normal((H, T, hd)).astype(np.float32)
    got = m.run(ids, capture="logits", patch=sinklab.Patch("z", P, layer=1), progress=False).logits
    flat_p = torch.as_tensor(P, dtype=torch.float64).permute(1, 0, 2).reshape(1, T, H * hd)

    def logits_with(o_input):
        h = tm.blocks[1].o.register_forward_pre_hook(lambda mod, a: (o_input(a[0]),))
        try:
            with torch.no_grad():
                return tm(torch.as_tensor(ids)[None])[0].numpy()
        finally:
            h.remove()

    after = logits_with(lambda x: flat_p)
    before = logits_with(lambda x: flat_p * torch.sigmoid(tm.blocks[1].attn_gate(normed[1])))
    assert rel(got, after) <= RTOL
    assert rel(got, before) > 100 * RTOL
