"""sinklab's gradients (Model.vjp, Model.jvp, Model.jacobian, Model.loss_and_grad,
sinklab.sensitivity) against independent references: `torch.autograd` / `torch.func` on the
Hugging Face LlamaForCausalLM (fp32, eager attention) holding the same weights, and float64
central finite differences.

Conventions (issue 8 / the sinklab API): resid[l] is the residual stream entering decoder layer l
(T, d); resid[0] = the token embeddings; resid[L] = the last layer's output before the final norm.
On the HF side resid[l] is read (and, for Jacobians and JVPs, replaced) by hooks on
model.model.layers[l], so the reference runs HF's own forward code.

Bound, per tensor (the gradient with respect to one resid[l], one parameter, one JVP layer, one
Jacobian block):
    max|sinklab - reference| <= 1e-4 * max|reference|
Models: the random tiny configurations of reference_models.SPECS (MHA, GQA + tied embeddings,
llama3 and linear rope scaling, odd sizes/MQA), each loaded from an HF safetensors folder
(rotate-half RoPE layout) and from an F32 GGUF (llama.cpp's permuted Q/K rows, adjacent-pair
RoPE); and SmolLM2-135M-Instruct at T = 32.
"""
from __future__ import annotations

import contextlib
from typing import Dict, List, Optional, Sequence

import numpy as np
import pytest

from tests.support import reference_models as rm

torch = rm.require("torch")
rm.require("transformers")
rm.require("gguf")
modeling_llama = rm.require("transformers.models.llama.modeling_llama")

import sinklab as sl  # noqa: E402
from sinklab.families.llama import GLOBAL_NAMES, LAYER_NAMES  # noqa: E402

F = torch.nn.functional
FORMATS = ("st", "gguf")            # safetensors float32 folder, GGUF F32 file
SPEC_NAMES = list(rm.SPECS)


# =============================================================================================
# Reference side: HF forward with hooks on the residual stream
# =============================================================================================

def _attention_with(iv: Optional[Dict]):
    """A differentiable replacement for transformers' eager_attention_forward applying the
    interventions in `iv` (dict of (L, H) arrays: mask_first bool, zero_first_value bool,
    scope "others"/"all", head_scale float), written without in-place updates so that
    torch.func.jvp / jacrev can go through it.

    mask_first: queries i >= 1 get score -inf on key 0 (query 0 keeps its only key).
    zero_first_value: v_0 is zero in the weighted sum; with scope "others" query 0's own output
    is kept from the untouched values.
    head_scale: the head's attention output (before o_proj) times the scale.
    """

    def forward(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        l = module.layer_idx
        groups = module.num_key_value_groups
        k = modeling_llama.repeat_kv(key, groups)
        v = modeling_llama.repeat_kv(value, groups)
        H, T = query.shape[1], query.shape[2]
        scores = torch.matmul(query, k.transpose(2, 3)) * scaling
        if attention_mask is not None:
            scores = scores + attention_mask
        mf = iv.get("mask_first")
        if mf is not None and np.any(mf[l]) and T > 1:
            m = torch.zeros(1, H, T, T, dtype=torch.bool)
            m[0, torch.as_tensor(np.flatnonzero(mf[l])), 1:, 0] = True
            scores = scores.masked_fill(m, float("-inf"))
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32)
        out = torch.matmul(probs, v)
        zf = iv.get("zero_first_value")
        if zf is not None and np.any(zf[l]):
            keep = torch.ones(1, 1, T, 1)
            keep[0, 0, 0, 0] = 0.0
            out_z = torch.matmul(probs, v * keep)
            if iv.get("scope", "others") == "others":
                q0 = torch.zeros(1, 1, T, 1, dtype=torch.bool)
                q0[0, 0, 0, 0] = True
                out_z = torch.where(q0, out, out_z)
            hz = torch.as_tensor(np.asarray(zf[l], bool)).view(1, H, 1, 1)
            out = torch.where(hz, out_z, out)
        hs = iv.get("head_scale")
        if hs is not None:
            out = out * torch.as_tensor(np.asarray(hs[l], np.float32)).to(out.dtype).view(1, H, 1, 1)
        return out.transpose(1, 2).contiguous(), probs

    return forward


@contextlib.contextmanager
def interventions(iv: Optional[Dict]):
    """Patch transformers' eager attention with `_attention_with(iv)` for the duration."""
    if not iv:
        yield
        return
    orig = modeling_llama.eager_attention_forward
    modeling_llama.eager_attention_forward = _attention_with(iv)
    try:
        yield
    finally:
        modeling_llama.eager_attention_forward = orig


def hf_resid(hf, ids, at: Optional[int] = None, x=None, iv: Optional[Dict] = None,
             logits: bool = False):
    """HF forward of ids (T,) with hooks; returns (resid: list of L+1 tensors (1, T, d) -- the
    tensors in the autograd graph, so that autograd.grad can take them as inputs --, logits (T, V)
    or None). With `at`, resid[at] is replaced by x (T, d) (for at = L: the last layer's output)."""
    L = hf.config.num_hidden_layers
    resid: List = [None] * (L + 1)
    handles = []

    def pre(l):
        def hook(_mod, args, kwargs):
            h = args[0]
            if at == l:
                h = x[None].to(h.dtype)
                args = (h,) + tuple(args[1:])
            resid[l] = h
            return args, kwargs
        return hook

    def post(_mod, _args, out):
        h = out[0] if isinstance(out, (tuple, list)) else out
        if at == L:
            h = x[None].to(h.dtype)
            out = h if not isinstance(out, (tuple, list)) else (h,) + tuple(out[1:])
        resid[L] = h
        return out

    for l, layer in enumerate(hf.model.layers):
        handles.append(layer.register_forward_pre_hook(pre(l), with_kwargs=True))
    handles.append(hf.model.layers[-1].register_forward_hook(post))
    ids_t = torch.as_tensor(np.asarray(ids, np.int64))[None]
    try:
        with interventions(iv):
            if logits:
                out = hf(input_ids=ids_t, use_cache=False).logits[0]
            else:
                hf.model(input_ids=ids_t, use_cache=False)
                out = None
    finally:
        for h in handles:
            h.remove()
    return resid, out


def _positions(T: int, positions) -> List[int]:
    if positions is None:
        return list(range(T))
    if isinstance(positions, (int, np.integer)):
        positions = [int(positions)]
    return [p % T for p in positions]


def ref_vjp(hf, ids, cot, layer: int, positions=None, layers=None, iv=None) -> np.ndarray:
    """torch.autograd.grad of <cot, resid[layer][positions]> w.r.t. resid[l], l in `layers`
    (default 0..layer): (n_layers_out, T, d) float32. cot: (P, d)."""
    T = len(ids)
    pos = _positions(T, positions)
    layers = list(range(layer + 1)) if layers is None else list(layers)
    resid, _ = hf_resid(hf, ids, iv=iv)
    out = resid[layer][0, pos]
    c = torch.as_tensor(np.asarray(cot, np.float32).reshape(len(pos), -1))
    grads = torch.autograd.grad(out, [resid[l] for l in layers], grad_outputs=c,
                                allow_unused=True)
    return np.stack([np.zeros(tuple(resid[0].shape[1:]), np.float32) if g is None
                     else g[0].detach().numpy() for g in grads])


def ref_fn(hf, ids, wrt: int, iv=None, out_layers=None, pos=None):
    """The map x = resid[wrt] (T, d) -> stack of resid[l] for l in out_layers (default wrt..L),
    or resid[l][pos] (d,) for a single out layer when pos is given."""
    L = hf.config.num_hidden_layers
    out_layers = list(range(wrt, L + 1)) if out_layers is None else list(out_layers)

    def f(x):
        resid, _ = hf_resid(hf, ids, at=wrt, x=x, iv=iv)
        if pos is not None:
            return resid[out_layers[0]][0, pos]
        return torch.stack([resid[l][0] for l in out_layers])

    return f


def hf_resid0(hf, ids, layer: int, iv=None) -> "torch.Tensor":
    """resid[layer] of the plain (or intervened) forward, detached: (T, d)."""
    with torch.no_grad():
        resid, _ = hf_resid(hf, ids, iv=iv)
    return resid[layer][0].detach().clone()


def ref_jacobian(hf, ids, of_layer: int, pos: int, wrt: int, iv=None) -> np.ndarray:
    """torch.func.jacrev of resid[wrt] -> resid[of_layer][pos]: (d, T, d)."""
    x0 = hf_resid0(hf, ids, wrt, iv)
    J = torch.func.jacrev(ref_fn(hf, ids, wrt, iv, [of_layer], pos))(x0)
    return J.detach().numpy()


def ref_jacobian_loop(hf, ids, of_layer: int, pos: int, wrt: int) -> np.ndarray:
    """The same Jacobian as d separate torch.autograd.grad calls (reference self-check)."""
    x = hf_resid0(hf, ids, wrt).requires_grad_(True)
    y = ref_fn(hf, ids, wrt, None, [of_layer], pos)(x)
    rows = [torch.autograd.grad(y[a], x, retain_graph=True)[0] for a in range(y.shape[0])]
    return torch.stack(rows).numpy()


def ref_jvp(hf, ids, tangent, at: int, iv=None) -> np.ndarray:
    """torch.func.jvp of resid[at] -> (resid[at], ..., resid[L]) along tangent (T, d):
    (L+1-at, T, d)."""
    x0 = hf_resid0(hf, ids, at, iv)
    t = torch.as_tensor(np.asarray(tangent, np.float32))
    _, jv = torch.func.jvp(ref_fn(hf, ids, at, iv), (x0,), (t,))
    return jv.detach().numpy()


def canonical_hf_names(n_layers: int, tied: bool) -> Dict[str, str]:
    """canonical weight name -> HF parameter name (sinklab.families.llama's tables)."""
    out = {k: GLOBAL_NAMES[k][0] for k in ("tok_embd", "out_norm")}
    if not tied:
        out["lm_head"] = GLOBAL_NAMES["lm_head"][0]
    for l in range(n_layers):
        for key, (hf_name, _) in LAYER_NAMES.items():
            out[f"blk.{l}.{key}"] = hf_name.format(l=l)
    return out


def ref_loss_and_grad(hf, ids, targets=None, iv=None, gguf_layout: bool = False):
    """Mean next-token cross-entropy (nats) and the gradient of every parameter, keyed by
    canonical name; attn_q/attn_k rows permuted into llama.cpp's layout when gguf_layout."""
    ids = np.asarray(ids, np.int64)
    if targets is None:
        targets = np.concatenate([ids[1:], [-1]])
    tgt = torch.as_tensor(np.asarray(targets, np.int64))
    hf.zero_grad(set_to_none=True)
    _, logits = hf_resid(hf, ids, iv=iv, logits=True)
    loss = F.cross_entropy(logits, tgt, ignore_index=-1)
    loss.backward()
    params = dict(hf.named_parameters())
    cfg = hf.config
    H, Hkv = cfg.num_attention_heads, cfg.num_key_value_heads
    grads = {}
    for canon, name in canonical_hf_names(cfg.num_hidden_layers, cfg.tie_word_embeddings).items():
        g = params[name].grad.detach().numpy().copy()
        if gguf_layout and canon.endswith(".attn_q"):
            g = rm.llama_cpp_permute(g, H, H)
        elif gguf_layout and canon.endswith(".attn_k"):
            g = rm.llama_cpp_permute(g, H, Hkv)
        grads[canon] = g
    hf.zero_grad(set_to_none=True)
    return float(loss.detach()), grads


# =============================================================================================
# Fixtures
# =============================================================================================

class Store(rm.TinyModels):
    """The tiny models, plus torch references computed once and shared by the two file formats."""

    def __init__(self, root):
        super().__init__(root)
        self._memo = {}

    def memo(self, key, fn):
        """fn() computed once per key."""
        if key not in self._memo:
            self._memo[key] = fn()
        return self._memo[key]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return Store(tmp_path_factory.mktemp("grad_models"))


@pytest.fixture(scope="module")
def log(request):
    lg = rm.ErrorLog("gradients")
    rm.report_fixture(request, lg)
    return lg


def _ids(spec: str, T: int, seed: int = 0) -> np.ndarray:
    return rm.random_ids(rm.SPECS[spec].vocab_size, T, seed=7919 * T + seed)


def _rand(shape, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def compare_layers(log, case: str, got, ref, layers: Sequence[int]) -> None:
    """Per layer (each resid[l] gradient / tangent against its own max)."""
    got, ref = np.asarray(got), np.asarray(ref)
    assert got.shape == ref.shape, f"{case}: shape {got.shape} != reference {ref.shape}"
    assert got.dtype == np.float32, f"{case}: dtype {got.dtype}"
    for i, l in enumerate(layers):
        log.compare(case, f"resid[{l}]", got[i], ref[i])


# =============================================================================================
# Reference self-checks (torch against torch / float64): make sure the references are right
# =============================================================================================

def test_reference_resid_hooks_match_hidden_states(store):
    """The hooks read the same residual stream as rm.hf_forward (hidden_states + last layer)."""
    hf = store.hf("gqa_tied")
    ids = _ids("gqa_tied", 9)
    want = rm.hf_forward(hf, ids)["resid"]
    with torch.no_grad():
        resid, _ = hf_resid(hf, ids)
    got = np.stack([r[0].numpy() for r in resid])
    np.testing.assert_array_equal(got, want)
    # injecting resid[2] itself reproduces the run
    with torch.no_grad():
        again, _ = hf_resid(hf, ids, at=2, x=resid[2][0].clone())
    np.testing.assert_array_equal(np.stack([r[0].numpy() for r in again]), want)


def test_reference_jacrev_vs_autograd_loop(store):
    hf = store.hf("odd")
    ids = _ids("odd", 6)
    a = ref_jacobian(hf, ids, 4, 3, 1)
    b = ref_jacobian_loop(hf, ids, 4, 3, 1)
    rm.assert_close("jacrev vs autograd loop", a, b, rtol=1e-5)
    # causality: resid[4][3] does not depend on later positions, and does on every earlier one
    assert a.shape == (72, 6, 72)
    assert np.all(a[:, 4:] == 0)
    assert np.all(np.abs(a[:, :4]).max(axis=(0, 2)) > 1e-3)


def test_reference_jvp_vjp_adjoint(store):
    """<u, J v> from torch.func.jvp equals <J^T u, v> from autograd (float32 rounding only)."""
    hf = store.hf("mha")
    L = rm.SPECS["mha"].n_layers
    ids = _ids("mha", 11)
    v = _rand((11, 64), 1)
    u = _rand((11, 64), 2)
    jv = ref_jvp(hf, ids, v, at=1)                 # (L, T, d): resid[1..L]
    np.testing.assert_array_equal(jv[0], v)
    g = ref_vjp(hf, ids, u, L, None, layers=[1])[0]
    lhs = float(np.sum(u.astype(np.float64) * jv[-1]))
    rhs = float(np.sum(g.astype(np.float64) * v))
    assert abs(lhs - rhs) <= 1e-4 * (abs(lhs) + abs(rhs)), (lhs, rhs)


def test_reference_interventions_match_existing_hooks(store, monkeypatch):
    """The differentiable intervention patch gives the forward that test_interventions' hooks
    give (there: in-place edits of the scores / values and an o_proj pre-hook)."""
    import test_interventions as ti
    spec = rm.SPECS["gqa_tied"]
    hf = store.hf("gqa_tied")
    ids = _ids("gqa_tied", 21)
    rng = np.random.default_rng(0)
    mask = rng.random((spec.n_layers, spec.n_heads)) < 0.4
    zero = rng.random((spec.n_layers, spec.n_heads)) < 0.4
    scale = rng.uniform(0, 2, (spec.n_layers, spec.n_heads)).astype(np.float32)
    for scope in ("others", "all"):
        want, _ = ti.reference(hf, ids, monkeypatch, mask_first=mask, zero_first_value=zero,
                               head_scale=scale, scope=scope)
        with torch.no_grad():
            _, got = hf_resid(hf, ids, iv=dict(mask_first=mask, zero_first_value=zero,
                                               scope=scope, head_scale=scale), logits=True)
        rm.assert_close(f"intervention patch {scope}", got.numpy(), want, rtol=1e-6)


def test_reference_loss_matches_hf_labels(store):
    hf = store.hf("linear")
    ids = _ids("linear", 17)
    loss, _ = ref_loss_and_grad(hf, ids)
    with torch.no_grad():
        want = hf(input_ids=torch.as_tensor(ids)[None], labels=torch.as_tensor(ids)[None]).loss
    assert loss == pytest.approx(float(want), rel=1e-6)


# =============================================================================================
# 1. Model.vjp
# =============================================================================================

def _vjp_cases(L: int, T: int):
    """(layer, positions, layers) triples: the last layer at the last position (int and list
    forms), several positions including 0, all positions (None), an inner layer, layer 0,
    negative positions, and a `layers=` subset."""
    cases = [(L, -1, None), (L, sorted({0, T - 1}), None), (L, None, None),
             (max(L - 1, 1), [T // 2], None), (0, [T - 1], None),
             (L, [-1, 0] if T > 1 else [-1], [0, L])]
    if T > 2:
        cases.append((1, sorted({1, T // 3, T - 2}), None))
    return cases


@pytest.mark.parametrize("T", [1, 7, 33, 100])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("spec", SPEC_NAMES)
def test_vjp(store, log, spec, fmt, T):
    s = rm.SPECS[spec]
    L, d = s.n_layers, s.d_model
    hf, model = store.hf(spec), store.sl(spec, fmt)
    ids = _ids(spec, T)
    for i, (layer, positions, layers) in enumerate(_vjp_cases(L, T)):
        P = 1 if isinstance(positions, int) else (T if positions is None else len(positions))
        cot = _rand((P, d), 100 * T + i)
        if isinstance(positions, int):
            cot = cot[0]                     # (d,) for an int position
        kw = {} if layers is None else {"layers": layers}
        at = (layer, positions) if positions is not None else (layer, None)
        got = model.vjp(ids, cot, at=at, **kw)
        want = store.memo(("vjp", spec, T, i),
                          lambda: ref_vjp(hf, ids, cot, layer, positions, layers))
        out_layers = list(range(layer + 1)) if layers is None else layers
        compare_layers(log, f"vjp {spec}/{fmt}/T={T} at=({layer},{positions})", got, want, out_layers)


@pytest.mark.parametrize("spec,fmt", [("gqa_tied", "gguf"), ("odd", "st")])
def test_vjp_batched(store, log, spec, fmt):
    """A (B, P, d) cotangent gives (B, n_layers, T, d) = the B single calls = torch."""
    s = rm.SPECS[spec]
    L, d, T, B = s.n_layers, s.d_model, 29, 3
    hf, model = store.hf(spec), store.sl(spec, fmt)
    ids = _ids(spec, T, seed=1)
    positions = [0, 5, T - 1]
    cot = _rand((B, len(positions), d), 7)
    got = model.vjp(ids, cot, at=(L, positions))
    assert got.shape == (B, L + 1, T, d)
    for b in range(B):
        single = model.vjp(ids, cot[b], at=(L, positions))
        rm.assert_close(f"batched row {b} vs single call", got[b], single, rtol=1e-6)
        want = ref_vjp(hf, ids, cot[b], L, positions)
        compare_layers(log, f"vjp batched {spec}/{fmt} b={b}", got[b], want, range(L + 1))
    # an int position with a (B, d) cotangent? the spec allows (B, P, d) with P = 1
    got1 = model.vjp(ids, cot[:, :1], at=(L - 1, [3]))
    assert got1.shape == (B, L, T, d)
    for b in range(B):
        compare_layers(log, f"vjp batched P=1 {spec}/{fmt} b={b}", got1[b],
                       ref_vjp(hf, ids, cot[b, :1], L - 1, [3]), range(L))


def test_vjp_gradient_is_causal(store):
    """Position p's gradient is exactly zero at positions after p (an exact structural check
    that does not depend on the tolerance)."""
    model = store.sl("mha", "st")
    ids = _ids("mha", 20, seed=2)
    g = model.vjp(ids, _rand((64,), 3), at=(3, 9))
    assert np.all(g[:, 10:] == 0)
    assert np.all(np.abs(g[:-1, :10]).max(axis=-1) > 0)


# =============================================================================================
# 2. Model.jacobian
# =============================================================================================

@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("spec", SPEC_NAMES)
def test_jacobian(store, log, spec, fmt):
    s = rm.SPECS[spec]
    L, d = s.n_layers, s.d_model
    hf, model = store.hf(spec), store.sl(spec, fmt)
    T = 13
    ids = _ids(spec, T, seed=3)
    for wrt, pos in [(0, -1), (L - 1, -1), (L // 2, 6)]:
        got = model.jacobian(ids, of=(L, pos), wrt=wrt, progress=False)
        want = store.memo(("jac", spec, wrt, pos), lambda: ref_jacobian(hf, ids, L, pos % T, wrt))
        assert got.shape == (d, T, d)
        log.compare(f"jacobian {spec}/{fmt} of=({L},{pos}) wrt={wrt}", "J", got, want)
        if pos % T < T - 1:
            assert np.all(got[:, pos % T + 1:] == 0), "non-causal Jacobian entries"
    # an inner `of` layer
    got = model.jacobian(ids, of=(L - 1, 4), wrt=0, progress=False)
    log.compare(f"jacobian {spec}/{fmt} of=({L - 1},4) wrt=0", "J", got, ref_jacobian(hf, ids, L - 1, 4, 0))


# =============================================================================================
# 3. Model.loss_and_grad
# =============================================================================================

def _compare_param_grads(log, case, got: Dict[str, np.ndarray], want: Dict[str, np.ndarray]):
    assert sorted(got) == sorted(want), (
        f"{case}: keys differ: missing {sorted(set(want) - set(got))}, extra {sorted(set(got) - set(want))}")
    for k in want:
        g = np.asarray(got[k])
        assert g.dtype == np.float32, f"{case} {k}: dtype {g.dtype}"
        log.compare(case, k, g, want[k])


@pytest.mark.parametrize("T", [2, 9, 64])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("spec", SPEC_NAMES)
def test_loss_and_grad(store, log, spec, fmt, T):
    hf, model = store.hf(spec), store.sl(spec, fmt)
    ids = _ids(spec, T, seed=4)
    loss, grads = model.loss_and_grad(ids)
    want_loss, want = ref_loss_and_grad(hf, ids, gguf_layout=(fmt == "gguf"))
    assert isinstance(loss, float)
    assert abs(loss - want_loss) <= 1e-4 * abs(want_loss), (loss, want_loss)
    _compare_param_grads(log, f"loss_and_grad {spec}/{fmt}/T={T}", grads, want)
    # the gradient keys/shapes are exactly those of the model's weights (minus a tied head)
    for k, g in grads.items():
        assert g.shape == np.shape(model.weights[k]), k


@pytest.mark.parametrize("spec,fmt", [("gqa_tied", "st"), ("llama3", "gguf")])
def test_loss_and_grad_targets(store, log, spec, fmt):
    """Explicit targets with ignored (-1) positions, including T = 1."""
    s = rm.SPECS[spec]
    hf, model = store.hf(spec), store.sl(spec, fmt)
    for T, seed in [(1, 5), (25, 6)]:
        ids = _ids(spec, T, seed=seed)
        rng = np.random.default_rng(seed)
        targets = rng.integers(0, s.vocab_size, T)
        if T > 1:
            targets[rng.random(T) < 0.3] = -1
            targets[2] = -1
        loss, grads = model.loss_and_grad(ids, targets=targets)
        want_loss, want = ref_loss_and_grad(hf, ids, targets, gguf_layout=(fmt == "gguf"))
        assert abs(loss - want_loss) <= 1e-4 * abs(want_loss), (loss, want_loss)
        _compare_param_grads(log, f"loss_and_grad targets {spec}/{fmt}/T={T}", grads, want)


# =============================================================================================
# 4. Model.jvp
# =============================================================================================

@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("spec", SPEC_NAMES)
def test_jvp(store, log, spec, fmt):
    s = rm.SPECS[spec]
    L, d = s.n_layers, s.d_model
    hf, model = store.hf(spec), store.sl(spec, fmt)
    for T in (1, 7, 33, 100):
        ids = _ids(spec, T, seed=5)
        for at in sorted({0, 1, L - 1, L}):
            tangent = _rand((T, d), 1000 * T + at)
            got = model.jvp(ids, tangent, at=at)
            want = store.memo(("jvp", spec, T, at), lambda: ref_jvp(hf, ids, tangent, at))
            assert got.shape == (L + 1 - at, T, d)
            compare_layers(log, f"jvp {spec}/{fmt}/T={T} at={at}", got, want, range(at, L + 1))


@pytest.mark.parametrize("spec,fmt", [("mha", "gguf"), ("odd", "st")])
def test_jvp_batched(store, log, spec, fmt):
    s = rm.SPECS[spec]
    L, d, T, B = s.n_layers, s.d_model, 21, 3
    hf, model = store.hf(spec), store.sl(spec, fmt)
    ids = _ids(spec, T, seed=6)
    tangent = _rand((B, T, d), 8)
    tangent[1, :5] = 0.0                      # a direction that only moves later positions
    got = model.jvp(ids, tangent, at=1)
    assert got.shape == (B, L, T, d)
    for b in range(B):
        rm.assert_close(f"batched jvp row {b} vs single", got[b], model.jvp(ids, tangent[b], at=1),
                        rtol=1e-6)
        compare_layers(log, f"jvp batched {spec}/{fmt} b={b}", got[b],
                       ref_jvp(hf, ids, tangent[b], 1), range(1, L + 1))
    assert np.all(got[1, :, :5] == 0), "a tangent at positions >= 5 moved earlier positions"


# =============================================================================================
# 5. Interventions, differentiated through
# =============================================================================================

def _intervention(spec: str, seed: int, scope: str, kinds=("mask", "zero", "scale")):
    """(sinklab.Intervention, reference dict) on random (layer, head)s."""
    s = rm.SPECS[spec]
    rng = np.random.default_rng(seed)
    shape = (s.n_layers, s.n_heads)
    mask = rng.random(shape) < 0.4 if "mask" in kinds else None
    zero = rng.random(shape) < 0.5 if "zero" in kinds else None
    scale = None
    if "scale" in kinds:
        scale = rng.uniform(0.0, 2.0, shape).astype(np.float32)
        scale[0, 0] = 0.0                       # an ablated head
    kw = {}
    if mask is not None:
        kw["mask_first"] = mask
    if zero is not None:
        kw["zero_first_value"] = zero
        kw["zero_first_value_scope"] = scope
    if scale is not None:
        kw["head_scale"] = scale
    return sl.Intervention(**kw), dict(mask_first=mask, zero_first_value=zero, scope=scope,
                                       head_scale=scale)


# (kinds, zero_first_value scope); the scope only matters with zero_first_value
IV_CASES = [(("mask",), "others"), (("zero",), "others"), (("zero",), "all"), (("scale",), "others"),
            (("mask", "zero", "scale"), "others"), (("mask", "zero", "scale"), "all")]


@pytest.mark.parametrize("kinds,scope", IV_CASES, ids=lambda k: "+".join(k) if isinstance(k, tuple) else k)
@pytest.mark.parametrize("spec,fmt", [("gqa_tied", "st"), ("odd", "gguf")])
def test_interventions_vjp_jvp(store, log, spec, fmt, kinds, scope):
    s = rm.SPECS[spec]
    L, d, T = s.n_layers, s.d_model, 33
    hf, model = store.hf(spec), store.sl(spec, fmt)
    ids = _ids(spec, T, seed=9)
    iv, ref_iv = _intervention(spec, 11 + len(kinds), scope, kinds)
    positions = [0, T // 2, T - 1]
    cot = _rand((len(positions), d), 12)
    got = model.vjp(ids, cot, at=(L, positions), intervene=iv)
    want = ref_vjp(hf, ids, cot, L, positions, iv=ref_iv)
    compare_layers(log, f"vjp {spec}/{fmt} iv={'+'.join(kinds)}/{scope}", got, want, range(L + 1))
    # the intervention changes the gradient far beyond the tolerance, so the check is decisive
    plain = store.memo(("vjp-plain", spec, T), lambda: ref_vjp(hf, ids, cot, L, positions))
    assert np.abs(plain[0] - want[0]).max() > 1e-2 * np.abs(want[0]).max()

    tangent = _rand((T, d), 13)
    got = model.jvp(ids, tangent, at=0, intervene=iv)
    want = ref_jvp(hf, ids, tangent, 0, iv=ref_iv)
    compare_layers(log, f"jvp {spec}/{fmt} iv={'+'.join(kinds)}/{scope}", got, want, range(L + 1))


@pytest.mark.parametrize("spec,fmt", [("gqa_tied", "gguf"), ("odd", "st")])
def test_interventions_jacobian_and_loss(store, log, spec, fmt):
    s = rm.SPECS[spec]
    L, T = s.n_layers, 11
    hf, model = store.hf(spec), store.sl(spec, fmt)
    ids = _ids(spec, T, seed=10)
    iv, ref_iv = _intervention(spec, 21, "all")
    got = model.jacobian(ids, of=(L, -1), wrt=1, intervene=iv, progress=False)
    x0 = hf_resid0(hf, ids, 1, ref_iv)
    want = torch.func.jacrev(ref_fn(hf, ids, 1, ref_iv, [L], T - 1))(x0).detach().numpy()
    log.compare(f"jacobian {spec}/{fmt} intervened", "J", got, want)
    loss, grads = model.loss_and_grad(ids, intervene=iv)
    want_loss, want_grads = ref_loss_and_grad(hf, ids, iv=ref_iv, gguf_layout=(fmt == "gguf"))
    assert abs(loss - want_loss) <= 1e-4 * abs(want_loss)
    _compare_param_grads(log, f"loss_and_grad {spec}/{fmt} intervened", grads, want_grads)


def test_mask_first_everywhere_cuts_the_sink_gradient(store):
    """With key 0 masked in every head, resid[L] at positions >= 1 cannot depend on resid[l][0]
    for any l: the gradient w.r.t. position 0 is exactly zero (a structural check)."""
    s = rm.SPECS["mha"]
    model = store.sl("mha", "st")
    ids = _ids("mha", 15, seed=11)
    iv = sl.Intervention(mask_first=np.ones((s.n_layers, s.n_heads), bool))
    g = model.vjp(ids, _rand((14, s.d_model), 4), at=(s.n_layers, list(range(1, 15))), intervene=iv)
    assert np.all(g[:, 0] == 0)
    g_plain = model.vjp(ids, _rand((14, s.d_model), 4), at=(s.n_layers, list(range(1, 15))))
    assert np.abs(g_plain[:, 0]).max() > 0


# =============================================================================================
# 6. Float64 finite differences
# =============================================================================================

class Float64Llama:
    """An independent float64 NumPy forward of a LlamaForCausalLM with default RoPE (HF's
    rotate-half layout): transformers' own "float64" model still runs RMSNorm, softmax and the
    rotary angles in float32, which would drown central differences in rounding.

    layers(x, l0) maps resid[l0] (T, d) to [resid[l0], ..., resid[L]]."""

    def __init__(self, hf):
        cfg = hf.config
        rope = getattr(cfg, "rope_parameters", None) or {}
        assert rope.get("rope_type", "default") == "default", "default RoPE only"
        self.theta = float(rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0)))
        self.L, self.H, self.Hkv = cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads
        self.hd, self.eps = cfg.head_dim, cfg.rms_norm_eps
        self.w = {k: v.detach().double().numpy() for k, v in hf.state_dict().items()}

    def embed(self, ids) -> np.ndarray:
        return self.w["model.embed_tokens.weight"][np.asarray(ids)]

    def _norm(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def _rope(self, x):                                     # (T, heads, hd)
        T, hd = x.shape[0], self.hd
        inv = 1.0 / self.theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd)
        ang = np.arange(T, dtype=np.float64)[:, None] * inv[None]
        cos = np.cos(np.concatenate([ang, ang], -1))[:, None]
        sin = np.sin(np.concatenate([ang, ang], -1))[:, None]
        rot = np.concatenate([-x[..., hd // 2:], x[..., :hd // 2]], -1)
        return x * cos + rot * sin

    def layer(self, x, l: int) -> np.ndarray:
        p, w = f"model.layers.{l}.", self.w
        T, H, hd = x.shape[0], self.H, self.hd
        xn = self._norm(x, w[p + "input_layernorm.weight"])
        q = self._rope((xn @ w[p + "self_attn.q_proj.weight"].T).reshape(T, H, hd))
        k = self._rope((xn @ w[p + "self_attn.k_proj.weight"].T).reshape(T, self.Hkv, hd))
        v = (xn @ w[p + "self_attn.v_proj.weight"].T).reshape(T, self.Hkv, hd)
        rep = H // self.Hkv
        k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
        s = np.einsum("ihe,jhe->hij", q, k) / np.sqrt(hd)
        s = np.where(np.tril(np.ones((T, T), bool))[None], s, -np.inf)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        o = np.einsum("hij,jhe->ihe", a, v).reshape(T, H * hd)
        x = x + o @ w[p + "self_attn.o_proj.weight"].T
        xn = self._norm(x, w[p + "post_attention_layernorm.weight"])
        g, u = xn @ w[p + "mlp.gate_proj.weight"].T, xn @ w[p + "mlp.up_proj.weight"].T
        return x + (g / (1.0 + np.exp(-g)) * u) @ w[p + "mlp.down_proj.weight"].T

    def layers(self, x, l0: int) -> List[np.ndarray]:
        out = [x]
        for l in range(l0, self.L):
            out.append(self.layer(out[-1], l))
        return out


def test_reference_float64_forward(store):
    """The float64 forward agrees with HF's fp32 forward (so it is the same model)."""
    hf = store.hf("mha")
    ids = _ids("mha", 12)
    f64 = Float64Llama(hf)
    want = rm.hf_forward(hf, ids)["resid"]
    got = np.stack(f64.layers(f64.embed(ids), 0))
    for l in range(len(got)):
        rm.assert_close(f"float64 forward resid[{l}]", got[l], want[l], rtol=1e-5)


def _fd(f, x0: np.ndarray, direction: np.ndarray, h: float):
    return (f(x0 + h * direction) - f(x0 - h * direction)) / (2 * h)


@pytest.mark.parametrize("fmt", FORMATS)
def test_finite_differences_float64(store, fmt):
    """The float32 C gradients against float64 central differences of the same model
    (h = 1e-4: truncation ~ h^2, rounding ~ 1e-16 / h; both far below the 1e-3 bound)."""
    spec = "mha"
    s = rm.SPECS[spec]
    L, d, T = s.n_layers, s.d_model, 12
    model = store.sl(spec, fmt)
    f64 = store.memo(("f64", spec), lambda: Float64Llama(store.hf(spec)))
    ids = _ids(spec, T, seed=12)
    pos, c = T - 1, _rand((d,), 14).astype(np.float64)
    h = 1e-4
    rng = np.random.default_rng(15)
    resid = f64.layers(f64.embed(ids), 0)
    for l in (0, 1, L - 1):
        g = model.vjp(ids, c.astype(np.float32), at=(L, pos), layers=[l])[0].astype(np.float64)

        def scalar(x, l=l):
            return float(c @ f64.layers(x, l)[-1][pos])

        # single coordinates at the sink, the target and in between
        coords = [(j, int(b)) for j in (0, pos // 2, pos) for b in rng.choice(d, 3, replace=False)]
        fd, ours = [], []
        for j, b in coords:
            e = np.zeros((T, d))
            e[j, b] = 1.0
            fd.append(_fd(scalar, resid[l], e, h))
            ours.append(g[j, b])
        rm.assert_close(f"{fmt} vjp resid[{l}] coordinates vs float64 FD", np.array(ours), np.array(fd),
                        rtol=1e-3)
        # random directions over all (T, d) coordinates
        fd, ours = [], []
        for k in range(4):
            u = rng.standard_normal((T, d))
            fd.append(_fd(scalar, resid[l], u, h))
            ours.append(float(np.sum(g * u)))
        rm.assert_close(f"{fmt} vjp resid[{l}] directions vs float64 FD", np.array(ours), np.array(fd),
                        rtol=1e-3)
    # the JVP along a direction at resid[1], every later layer
    u = rng.standard_normal((T, d))
    jv = model.jvp(ids, u.astype(np.float32), at=1)
    fd = _fd(lambda x: np.stack(f64.layers(x, 1)), resid[1], u, h)
    for i, l in enumerate(range(1, L + 1)):
        rm.assert_close(f"{fmt} jvp resid[{l}] vs float64 FD", jv[i], fd[i], rtol=1e-3)


# =============================================================================================
# 7. Determinism
# =============================================================================================

def _grad_calls(model, spec, iv=None):
    s = rm.SPECS[spec]
    L, d, T = s.n_layers, s.d_model, 70
    ids = _ids(spec, T, seed=16)
    out = {
        "vjp": model.vjp(ids, _rand((3, 2, d), 17), at=(L, [0, T - 1]), intervene=iv),
        "jvp": model.jvp(ids, _rand((T, d), 18), at=1, intervene=iv),
        "jacobian": model.jacobian(ids, of=(L, -1), wrt=2, intervene=iv, progress=False),
    }
    loss, grads = model.loss_and_grad(ids, intervene=iv)
    out["loss"] = np.float64(loss)
    out.update({f"grad {k}": v for k, v in grads.items()})
    return out


@pytest.mark.parametrize("spec,fmt", [("gqa_tied", "gguf"), ("odd", "st")])
def test_threads_bitwise(store, spec, fmt, threads_restored):
    model = store.sl(spec, fmt)
    iv, _ = _intervention(spec, 19, "others")
    for use_iv in (None, iv):
        runs = []
        for n in (1, 2):
            sl.set_num_threads(n)
            runs.append(_grad_calls(model, spec, use_iv))
        for k in runs[0]:
            assert np.array_equal(runs[0][k], runs[1][k]), f"{k}: 1 vs 2 threads differ (iv={use_iv is not None})"


@pytest.fixture
def simd_restored():
    yield
    sl._core.set_simd("auto")


def test_generic_simd_matches(store, simd_restored):
    spec, fmt = "gqa_tied", "st"
    model = store.sl(spec, fmt)
    auto = _grad_calls(model, spec)
    sl._core.set_simd("generic")
    generic = _grad_calls(model, spec)
    sl._core.set_simd("auto")
    for k in auto:
        rm.assert_close(f"{k}: generic vs auto kernels", generic[k], auto[k], rtol=1e-5)
    again = _grad_calls(model, spec)
    for k in auto:
        assert np.array_equal(again[k], auto[k]), f"{k}: not reproducible after set_simd('auto')"


# =============================================================================================
# 8. Errors
# =============================================================================================

def test_errors(store):
    spec = "mha"
    s = rm.SPECS[spec]
    L, d, T = s.n_layers, s.d_model, 8
    model = store.sl(spec, "st")
    ids = _ids(spec, T)
    bad = (ValueError, TypeError)
    c = _rand((2, d), 0)
    # cotangent shape / dtype
    for cot in (_rand((3, d), 0), _rand((2, d + 1), 0), _rand((2,), 0), _rand((1, 2, 2, d), 0)):
        with pytest.raises(bad, match="(?i)cotangent"):
            model.vjp(ids, cot, at=(L, [0, 1]))
    with pytest.raises(bad, match="(?i)cotangent"):
        model.vjp(ids, _rand((d,), 0), at=(L, [0, 1]))          # (d,) needs a single position
    with pytest.raises(bad, match="(?i)cotangent|dtype"):
        model.vjp(ids, np.full((2, d), "x"), at=(L, [0, 1]))
    # layer out of range
    for layer in (L + 1, -L - 2, 100):
        with pytest.raises(ValueError, match="(?i)layer"):
            model.vjp(ids, c, at=(layer, [0, 1]))
    with pytest.raises(ValueError, match="(?i)layer"):
        model.vjp(ids, c, at=(1, [0, 1]), layers=[2])             # a layer after `at`
    # bad positions
    for positions in ([0, T], [-T - 1, 0]):
        with pytest.raises(ValueError, match="(?i)position"):
            model.vjp(ids, c, at=(L, positions))
    with pytest.raises(ValueError, match="(?i)position"):
        model.vjp(ids, _rand((0, d), 0), at=(L, []))
    with pytest.raises(ValueError, match="(?i)position"):
        model.vjp(ids, c, at=(L, [3, 3 - T]))                      # the same position twice
    # jacobian: wrt >= layer, bad position
    for of, wrt in (((1, -1), 1), ((1, -1), 2), ((L + 1, -1), 0)):
        with pytest.raises(ValueError, match="(?i)layer|wrt"):
            model.jacobian(ids, of=of, wrt=wrt, progress=False)
    with pytest.raises(ValueError, match="(?i)position"):
        model.jacobian(ids, of=(L, T), wrt=0, progress=False)
    # jvp: tangent shape, layer
    with pytest.raises(bad, match="(?i)tangent"):
        model.jvp(ids, _rand((T + 1, d), 0), at=1)
    with pytest.raises(bad, match="(?i)tangent"):
        model.jvp(ids, _rand((T, d - 1), 0), at=1)
    with pytest.raises(ValueError, match="(?i)layer|at"):
        model.jvp(ids, _rand((T, d), 0), at=L + 1)
    # loss_and_grad: targets length / range
    with pytest.raises(ValueError, match="(?i)target"):
        model.loss_and_grad(ids, targets=np.zeros(T + 1, np.int64))
    with pytest.raises(ValueError, match="(?i)target"):
        model.loss_and_grad(ids, targets=np.full(T, s.vocab_size, np.int64))
    # bad ids as in the forward
    with pytest.raises(bad):
        model.vjp(np.array([0, s.vocab_size]), _rand((d,), 0), at=(L, -1))


# =============================================================================================
# sinklab.sensitivity: the over-squashing map
# =============================================================================================

def ref_sensitivity(hf, ids, target: int, layers: Sequence[int], iv=None):
    """(fro, spectral), each (n_layers, T) float64: norms of the (d x d) blocks
    d resid[L][target] / d resid[l][j], from torch.func.jacrev."""
    L = hf.config.num_hidden_layers
    fro, spec = [], []
    for l in layers:
        x0 = hf_resid0(hf, ids, l, iv)
        J = torch.func.jacrev(ref_fn(hf, ids, l, iv, [L], target))(x0).detach().double()  # (d, T, d)
        blocks = J.permute(1, 0, 2)                                                # (T, d, d)
        fro.append(torch.linalg.matrix_norm(blocks, "fro").numpy())
        spec.append(torch.linalg.matrix_norm(blocks, 2).numpy())
    return np.stack(fro), np.stack(spec)


@pytest.mark.parametrize("spec,fmt", [("gqa_tied", "st"), ("odd", "gguf")])
def test_sensitivity_exact(store, log, spec, fmt):
    s = rm.SPECS[spec]
    L, d, T = s.n_layers, s.d_model, 17
    hf, model = store.hf(spec), store.sl(spec, fmt)
    ids = _ids(spec, T, seed=20)
    res = sl.sensitivity(model, ids, target=-1, method="exact", progress=False)
    assert list(res.layers) == list(range(L + 1)) and res.target == T - 1
    assert res.fro.shape == (L + 1, T) and res.fro.dtype == np.float64
    assert res.spectral is not None and res.spectral.shape == (L + 1, T)
    fro, spectral = ref_sensitivity(hf, ids, T - 1, range(L + 1))
    for i in range(L + 1):
        log.compare(f"sensitivity {spec}/{fmt}", f"fro[{i}]", res.fro[i], fro[i])
        log.compare(f"sensitivity {spec}/{fmt}", f"spectral[{i}]", res.spectral[i], spectral[i])
    # the last layer's block is the identity at the target and zero elsewhere
    assert res.fro[L, T - 1] == pytest.approx(np.sqrt(d), rel=1e-6)
    assert np.all(res.fro[L, :T - 1] == 0)
    # an inner target and a layer subset, with an intervention
    iv, ref_iv = _intervention(spec, 22, "all")
    res = sl.sensitivity(model, ids, target=9, layers=[0, 2], method="exact", intervene=iv,
                         progress=False)
    assert list(res.layers) == [0, 2] and res.fro.shape == (2, T)
    fro, spectral = ref_sensitivity(hf, ids, 9, [0, 2], ref_iv)
    for i in range(2):
        log.compare(f"sensitivity {spec}/{fmt} target=9 intervened", f"fro[{i}]", res.fro[i], fro[i])
        log.compare(f"sensitivity {spec}/{fmt} target=9 intervened", f"spectral[{i}]",
                    res.spectral[i], spectral[i])
    assert np.all(res.fro[:, 10:] == 0)


def test_sensitivity_estimate(store):
    """The random-projection estimate of the Frobenius norms: close to the torch value, with a
    standard error that covers its error, reproducible for a seed."""
    spec = "gqa_tied"
    s = rm.SPECS[spec]
    L, T = s.n_layers, 24
    hf, model = store.hf(spec), store.sl(spec, "gguf")
    ids = _ids(spec, T, seed=21)
    fro, _ = ref_sensitivity(hf, ids, T - 1, range(L))
    est = sl.sensitivity(model, ids, method="estimate", n_probes=64, layers=list(range(L)), seed=3,
                         spectral=False, progress=False)
    assert est.spectral is None and est.stderr is not None
    assert est.fro.shape == est.stderr.shape == (L, T) and est.n_probes == 64
    rel = np.abs(est.fro - fro) / fro
    assert np.median(rel) < 0.1, np.median(rel)
    assert np.mean(np.abs(est.fro - fro) <= 3 * est.stderr) >= 0.9
    again = sl.sensitivity(model, ids, method="estimate", n_probes=64, layers=list(range(L)), seed=3,
                           spectral=False, progress=False)
    assert np.array_equal(again.fro, est.fro)
    other = sl.sensitivity(model, ids, method="estimate", n_probes=64, layers=list(range(L)), seed=4,
                           spectral=False, progress=False)
    assert not np.array_equal(other.fro, est.fro)


# =============================================================================================
# 9. SmolLM2-135M
# =============================================================================================

@pytest.fixture(scope="module")
def smol(smollm2_reference, smollm2_model):
    """(HF reference, sinklab model, ids (32,) = <bos> + a shipped passage's first 31 tokens)."""
    ref, tok = smollm2_reference
    model = smollm2_model
    text = sl.load_passages()[0]
    ids = np.array([tok.bos_token_id] + tok(text, add_special_tokens=False)["input_ids"][:31],
                   dtype=np.int64)
    assert len(ids) == 32 and ids[0] == model.config.bos_token_id
    return ref, model, ids


def test_smollm2_vjp(smol, log):
    ref, model, ids = smol
    L, d = model.config.n_layers, model.config.d_model
    cot = _rand((d,), 30)
    got = model.vjp(ids, cot, at=(L, -1))
    want = ref_vjp(ref, ids, cot, L, -1)
    compare_layers(log, "smollm2 vjp at=(L,-1)", got, want, range(L + 1))


def test_smollm2_loss_and_grad(smol, log):
    """Loss and a few parameter gradients (Q/K rows permuted into the GGUF layout) against a
    float64 copy of the reference. Not against the fp32 reference: on SmolLM2 (<bos> residual
    norm ~6100 at the last layer) torch's own fp32 parameter gradients are off the float64 ones
    by more than 1e-4 of max|ref| for 44 of 272 tensors (worst blk.29.ffn_norm, 5.7e-4), so an
    fp32 reference cannot check 1e-4. (HF's float64 model still runs RMSNorm and softmax in
    float32: ~1e-7 relative, far below the bound.)"""
    import copy
    ref, model, ids = smol
    H, Hkv = ref.config.num_attention_heads, ref.config.num_key_value_heads
    loss, grads = model.loss_and_grad(ids)
    names = {"tok_embd": "model.embed_tokens.weight", "out_norm": "model.norm.weight",
             "blk.0.attn_q": "model.layers.0.self_attn.q_proj.weight",
             "blk.7.attn_k": "model.layers.7.self_attn.k_proj.weight",
             "blk.15.attn_v": "model.layers.15.self_attn.v_proj.weight",
             "blk.16.attn_norm": "model.layers.16.input_layernorm.weight",
             "blk.20.attn_q": "model.layers.20.self_attn.q_proj.weight",
             "blk.29.ffn_down": "model.layers.29.mlp.down_proj.weight"}
    ref64 = copy.deepcopy(ref).double()
    params = dict(ref64.named_parameters())
    for n, p in params.items():
        p.requires_grad_(n in names.values())
    tgt = torch.as_tensor(np.concatenate([ids[1:], [-1]]))
    _, logits = hf_resid(ref64, ids, logits=True)
    want_loss = F.cross_entropy(logits, tgt, ignore_index=-1)
    want_loss.backward()
    assert abs(loss - want_loss.item()) <= 1e-4 * want_loss.item()
    assert "lm_head" not in grads                      # tied: the head is in tok_embd
    failed = []
    for canon, name in names.items():
        w = params[name].grad.numpy()
        if canon.endswith("attn_q"):
            w = rm.llama_cpp_permute(w, H, H)
        elif canon.endswith("attn_k"):
            w = rm.llama_cpp_permute(w, H, Hkv)
        try:
            log.compare("smollm2 loss_and_grad vs float64", canon, grads[canon], w)
        except AssertionError as e:
            failed.append(str(e))
    assert not failed, "\n".join(failed)


# =============================================================================================
# Families (issue 10): what tests/test_gradients_families.py (values against torch.autograd)
# leaves out: thread-count independence, quantized residency, the gradient-buffer contract
# =============================================================================================

FAMILY_THREAD_CASES = ["gemma2", "qwen3", "gpt2", "bert"]   # post-norms+caps+windows, QK-norm, LN+biases, post-LN


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    return rm.FamilyModels(tmp_path_factory.mktemp("grad_family_models"))


def _family_ids(name: str, T: int = 40, seed: int = 0) -> np.ndarray:
    return rm.random_ids(rm.FAMILY_SPECS[name].hf["vocab_size"], T, seed=104729 + seed)


def _family_calls(model, name: str) -> Dict[str, np.ndarray]:
    """vjp / jvp with 16 directions (B*T*d above the kernels' parallel thresholds) and, with an
    LM head, loss_and_grad."""
    L, d = model.config.n_layers, model.config.d_model
    ids = _family_ids(name)
    T = len(ids)
    out = {"vjp": model.vjp(ids, _rand((16, T, d), 1), at=(L, None)),
           "vjp mid": model.vjp(ids, _rand((16, d), 2), at=(L, T // 2), layers=[0]),
           "jvp": model.jvp(ids, _rand((16, T, d), 3), at=0)}
    if model.config.has_lm_head:
        loss, grads = model.loss_and_grad(ids)
        out["loss"] = np.float64(loss)
        out.update({f"grad {k}": v for k, v in grads.items()})
    return out


@pytest.mark.parametrize("name", FAMILY_THREAD_CASES)
def test_family_threads_bitwise(families, name, threads_restored):
    """Every family feature's derivative (LayerNorm, biases, QK-norm, post-norms, post-LN, GELU,
    learned positions, token types, embedding norm and scale, soft-caps) is the same bits on 1
    and 3 threads."""
    model = families.sl(name, "st")
    runs = []
    for n in (1, 3):
        sl.set_num_threads(n)
        runs.append(_family_calls(model, name))
    for k in runs[0]:
        assert np.all(np.isfinite(runs[0][k])), k
        assert np.array_equal(runs[0][k], runs[1][k]), f"{name} {k}: 1 vs 3 threads differ"


def _f32_twin(model):
    """The same model with every quantized matrix decoded to float32 (a tied head stays tied)."""
    from sinklab.families.tensors import to_f32
    from sinklab.model import Model

    done: Dict[int, np.ndarray] = {}
    w = {k: done.setdefault(id(v), to_f32(v)) for k, v in model.weights.items() if k != "rope_inv_freq"}
    return Model(model.config, w, None, model.source, model.rope_layout)


@pytest.mark.parametrize("name", ["gemma2", "qwen2"])
def test_family_quantized_gradients(families, log, name):
    """A Q8_0 GGUF family model (matrices decoded block by block inside the products, also the
    backward's x·W): loss_and_grad and vjp within the bound of torch.autograd on the HF model
    holding the file's rounded weights, and bitwise those of the float32 model holding the
    dequantized matrices."""
    model = families.sl(name, "gguf-Q8_0")
    assert any(not isinstance(v, np.ndarray) for v in model.weights.values()), "nothing stayed quantized"
    twin = _f32_twin(model)
    ids = _family_ids(name, seed=1)
    loss, grads = model.loss_and_grad(ids)
    loss2, grads2 = twin.loss_and_grad(ids)
    assert loss == loss2
    assert sorted(grads) == sorted(grads2)
    for k in grads:
        assert np.array_equal(grads[k], grads2[k]), f"{name} Q8_0 {k}: differs from its float32 twin"
    L, d = model.config.n_layers, model.config.d_model
    cot = _rand((d,), 5)
    g = model.vjp(ids, cot, at=(L, -1))
    assert np.array_equal(g, twin.vjp(ids, cot, at=(L, -1)))

    hf = families.hf(name, "gguf-Q8_0")
    hf.zero_grad(set_to_none=True)
    _, logits = rm.family_resid(hf, ids, logits=True)
    want_loss = F.cross_entropy(logits[0], torch.as_tensor(np.concatenate([ids[1:], [-1]])), ignore_index=-1)
    want_loss.backward()
    want = rm.canonical_param_grads(hf)
    hf.zero_grad(set_to_none=True)
    want_loss = float(want_loss.detach())
    assert abs(loss - want_loss) <= 1e-4 * want_loss
    assert sorted(grads) == sorted(want)
    for k in want:
        log.compare(f"loss_and_grad {name}/gguf-Q8_0", k, grads[k], want[k])


def test_family_grad_buffers(families):
    """model_loss_grad takes exactly one buffer per tensor the model has: a missing optional
    one (a bias) is a KeyError naming it, an extra one (a tensor the model lacks) a ValueError,
    a mis-shaped one a ValueError; the Python API allocates the right set."""
    model = families.sl("gpt2", "st")
    ids = _family_ids("gpt2", 12)
    tg = np.concatenate([ids[1:], [-1]]).astype(np.int64)
    _, grads = model.loss_and_grad(ids)
    assert set(grads) == set(model.weights) - {"lm_head"}        # tied head: no entry of its own
    bufs = {k: np.zeros_like(v) for k, v in grads.items()}
    bufs["lm_head"] = bufs["tok_embd"]
    loss = sl._core.model_loss_grad(model._handle, ids, tg, bufs)
    for k in grads:
        assert np.array_equal(bufs[k], grads[k]), k
    assert np.isfinite(loss)
    for key in ("blk.1.attn_q_b", "out_norm_b", "pos_embd"):
        partial = {k: v for k, v in bufs.items() if k != key}
        with pytest.raises(KeyError, match=key):
            sl._core.model_loss_grad(model._handle, ids, tg, partial)
    with pytest.raises(ValueError, match="lacks"):
        sl._core.model_loss_grad(model._handle, ids, tg, dict(bufs, **{"blk.0.attn_q_norm": np.zeros(16, np.float32)}))
    with pytest.raises(ValueError):
        sl._core.model_loss_grad(model._handle, ids, tg, dict(bufs, **{"blk.0.ffn_up_b": np.zeros(3, np.float32)}))
    bert = families.sl("bert", "st")
    with pytest.raises(ValueError, match="(?i)head|logits"):
        bert.loss_and_grad(_family_ids("bert", 12))
