"""sinklab's gradients on every model family (reference_models.FAMILY_SPECS) against
torch.autograd on the Hugging Face model holding the same weights (fp32, eager attention):
Model.vjp, Model.jvp, Model.jacobian, Model.loss_and_grad and sinklab.sensitivity, through the
ops the families add (biases, QK-norm, 1+w norms, GeGLU and GELU MLPs, LayerNorm, post-norms,
post-LN, embedding scale, learned positions, token types, attention scale, soft-caps, sliding
windows, bidirectional attention).

Reference: reference_models.family_resid runs HF's own forward with hooks on the blocks:
resid[l] = the stream entering block l (the gradient inputs), resid[L] = the last block's output
before the final norm; a JVP / Jacobian replaces resid[at] by its argument.

Bound, per tensor (one resid[l] gradient, one JVP layer, one parameter gradient, one Jacobian):
    max|sinklab - reference| <= 1e-4 * max|reference|       (as tests/test_gradients.py)
Lengths exceed every sliding window.
"""
from __future__ import annotations

from typing import Dict, Sequence

import numpy as np
import pytest

from tests.support import reference_models as rm

torch = rm.require("torch")
rm.require("transformers")
rm.require("gguf")

import sinklab as sl  # noqa: E402

F = torch.nn.functional
SPECS = rm.FAMILY_SPECS
# gemma3_gguf differs from gemma3 only in sizes and layer pattern: its GGUF form stands for it
ST_NAMES = [n for n in SPECS if n != "gemma3_gguf"]
CASES = [(n, "st") for n in ST_NAMES] + [(n, "gguf") for n, s in SPECS.items() if s.gguf_arch]
LM_CASES = [(n, f) for n, f in CASES if SPECS[n].has_logits]
CASE_IDS = [f"{n}-{f}" for n, f in CASES]


# ============================================================================ references

def _pos(T: int, positions):
    if positions is None:
        return list(range(T))
    if isinstance(positions, (int, np.integer)):
        positions = [int(positions)]
    return [int(p) % T for p in positions]


def ref_vjp(hf, ids, cot, layer: int, positions=None, layers=None) -> np.ndarray:
    """autograd of <cot, resid[layer][positions]> w.r.t. resid[l], l in `layers` (default
    0..layer): (n, T, d). cot: (P, d) or (d,)."""
    T = len(ids)
    pos = _pos(T, positions)
    layers = list(range(layer + 1)) if layers is None else list(layers)
    resid, _ = rm.family_resid(hf, ids)
    out = resid[layer][0, pos]
    c = torch.as_tensor(np.asarray(cot, np.float32).reshape(len(pos), -1))
    grads = torch.autograd.grad(out, [resid[l] for l in layers], grad_outputs=c, allow_unused=True)
    return np.stack([np.zeros(tuple(resid[0].shape[1:]), np.float32) if g is None
                     else g[0].detach().numpy() for g in grads])


def _resid0(hf, ids, layer: int) -> "torch.Tensor":
    with torch.no_grad():
        resid, _ = rm.family_resid(hf, ids)
    return resid[layer][0].detach().clone()


def _map_from(hf, ids, at: int, out_layers, pos=None):
    """x = resid[at] (T, d) -> stack of resid[l], l in out_layers; or resid[l][pos] (d,)."""
    def f(x):
        resid, _ = rm.family_resid(hf, ids, at=at, x=x)
        if pos is not None:
            return resid[out_layers[0]][0, pos]
        return torch.stack([resid[l][0] for l in out_layers])
    return f


def ref_jvp(hf, ids, tangent, at: int) -> np.ndarray:
    """Forward-mode derivative of resid[at] -> (resid[at], ..., resid[L]) along tangent (T, d):
    (L + 1 - at, T, d), by torch.autograd.functional.jvp (double backward through HF's code)."""
    L = len(rm.family_layers(hf))
    x0 = _resid0(hf, ids, at)
    t = torch.as_tensor(np.asarray(tangent, np.float32))
    _, jv = torch.autograd.functional.jvp(_map_from(hf, ids, at, list(range(at, L + 1))), x0, t)
    return jv.detach().numpy()


def ref_jacobian(hf, ids, of_layer: int, pos: int, wrt: int) -> np.ndarray:
    """d resid[of_layer][pos] / d resid[wrt]: (d, T, d), one backward pass per output row."""
    x0 = _resid0(hf, ids, wrt)
    J = torch.autograd.functional.jacobian(_map_from(hf, ids, wrt, [of_layer], pos), x0)
    return J.detach().numpy()


def ref_loss_and_grad(hf, ids, targets=None, gguf_layout=False):
    """Mean next-token cross-entropy (nats) and every parameter's gradient by canonical name."""
    ids = np.asarray(ids, np.int64)
    if targets is None:
        targets = np.concatenate([ids[1:], [-1]])
    hf.zero_grad(set_to_none=True)
    _, logits = rm.family_resid(hf, ids, logits=True)
    loss = F.cross_entropy(logits[0], torch.as_tensor(np.asarray(targets, np.int64)), ignore_index=-1)
    loss.backward()
    grads = rm.canonical_param_grads(hf, gguf_layout=gguf_layout)
    head = hf.get_output_embeddings()
    if "lm_head" not in grads and head.weight is not hf.get_input_embeddings().weight:
        grads["lm_head"] = head.weight.grad.detach().numpy().astype(np.float32).copy()  # untied copy
    hf.zero_grad(set_to_none=True)
    return float(loss.detach()), grads


def untied_head(hf):
    """A copy of the tied model `hf` whose LM head is its own parameter holding the same values:
    the reference for a file that stores the tied head as a separate tensor (llama.cpp's GPT-2
    converter writes output.weight as a copy of token_embd.weight), which sinklab loads as two
    parameters, each with its own gradient (their sum is the tied model's gradient)."""
    import copy

    u = copy.deepcopy(hf)
    head = u.get_output_embeddings()
    head.weight = torch.nn.Parameter(head.weight.detach().clone())
    return u


def ref_sensitivity(hf, ids, target: int, layers: Sequence[int]):
    """(fro, spectral) (n_layers, T) float64: norms of the (d, d) blocks of
    d resid[L][target] / d resid[l][j]."""
    L = len(rm.family_layers(hf))
    fro, spec = [], []
    for l in layers:
        J = torch.as_tensor(ref_jacobian(hf, ids, L, target, l)).double().permute(1, 0, 2)
        fro.append(torch.linalg.matrix_norm(J, "fro").numpy())
        spec.append(torch.linalg.matrix_norm(J, 2).numpy())
    return np.stack(fro), np.stack(spec)


# ============================================================================ fixtures

class Store(rm.FamilyModels):
    """The family models plus torch references computed once (shared by the two formats)."""

    def __init__(self, root):
        super().__init__(root)
        self._memo = {}

    def memo(self, key, fn):
        if key not in self._memo:
            self._memo[key] = fn()
        return self._memo[key]


@pytest.fixture(scope="module", autouse=True)
def _torch_one_thread():
    with rm.torch_single_thread():
        yield


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return Store(tmp_path_factory.mktemp("family_grad_models"))


@pytest.fixture(scope="module")
def log(request):
    lg = rm.ErrorLog("gradients_families")
    rm.report_fixture(request, lg)
    return lg


def _ids(name: str, T: int = None, seed: int = 0) -> np.ndarray:
    s = SPECS[name]
    T = T or s.T
    return rm.random_ids(s.hf["vocab_size"], T, seed=7919 * T + seed + s.seed)


def _rand(shape, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _ref_key(name: str, fmt: str) -> str:
    """Formats whose reference model is the same (no gguf_hf override) share memoized references."""
    return "gguf" if fmt != "st" and SPECS[name].gguf_hf else "st"


def _facts(store, name, fmt):
    return rm.config_facts(store.hf(name, fmt).config)


def compare_layers(log, case: str, got, ref, layers: Sequence[int]) -> None:
    got, ref = np.asarray(got), np.asarray(ref)
    assert got.shape == ref.shape, f"{case}: shape {got.shape} != reference {ref.shape}"
    assert got.dtype == np.float32, f"{case}: dtype {got.dtype}"
    for i, l in enumerate(layers):
        log.compare(case, f"resid[{l}]", got[i], ref[i])


# ============================================================================ reference self-checks

def test_reference_jvp_vjp_adjoint(store):
    """<u, J v> from the forward-mode reference equals <J^T u, v> from autograd, on a model with
    soft-caps and windows (gemma2) and on the bidirectional encoder (bert)."""
    for name in ("gemma2", "bert"):
        hf = store.hf(name)
        f = rm.config_facts(hf.config)
        L, d = f["n_layers"], f["d_model"]
        ids = _ids(name, 17)
        v, u = _rand((17, d), 1), _rand((17, d), 2)
        jv = ref_jvp(hf, ids, v, at=1)
        np.testing.assert_array_equal(jv[0], v)
        g = ref_vjp(hf, ids, u, L, None, layers=[1])[0]
        lhs = float(np.sum(u.astype(np.float64) * jv[-1]))
        rhs = float(np.sum(g.astype(np.float64) * v))
        assert abs(lhs - rhs) <= 1e-4 * (abs(lhs) + abs(rhs)), (name, lhs, rhs)


def test_reference_jacobian_rows_are_vjps(store):
    """Row a of the reference Jacobian is the VJP with cotangent e_a."""
    name = "qwen3"
    hf = store.hf(name)
    L = rm.config_facts(hf.config)["n_layers"]
    ids = _ids(name, 9)
    J = ref_jacobian(hf, ids, L, 5, 1)
    for a in (0, 17, 63):
        e = np.zeros(64, np.float32)
        e[a] = 1
        rm.assert_close(f"jacobian row {a}", J[a], ref_vjp(hf, ids, e, L, 5, layers=[1])[0], rtol=1e-6)
    assert np.all(J[:, 6:] == 0)          # causal


def test_reference_loss_matches_hf_labels(store):
    """The reference loss is HF's own (labels=), soft-capped logits included (gemma2)."""
    for name in ("gemma2", "gpt2"):
        hf = store.hf(name)
        ids = _ids(name, 17)
        loss, grads = ref_loss_and_grad(hf, ids)
        with torch.no_grad():
            want = hf(input_ids=torch.as_tensor(ids)[None], labels=torch.as_tensor(ids)[None]).loss
        assert loss == pytest.approx(float(want), rel=1e-6)
        assert all(np.any(g) for k, g in grads.items() if k != "pos_embd"), \
            [k for k, g in grads.items() if not np.any(g)]


# ============================================================================ Model.vjp

def _vjp_cases(L: int, T: int):
    """(layer, positions, layers): last layer at the last position, at every position, at
    several positions including the sink, an inner layer, and a `layers=` subset."""
    return [(L, -1, None), (L, None, None), (L, [0, T // 2, T - 1], None),
            (max(L - 1, 1), [T // 3], None), (L, [-1, 0], [0, L])]


@pytest.mark.parametrize("name,fmt", CASES, ids=CASE_IDS)
def test_vjp(store, log, name, fmt):
    f = _facts(store, name, fmt)
    L, d = f["n_layers"], f["d_model"]
    hf, model = store.hf(name, fmt), store.sl(name, fmt)
    ids = _ids(name)
    T = len(ids)
    for i, (layer, positions, layers) in enumerate(_vjp_cases(L, T)):
        P = 1 if isinstance(positions, int) else (T if positions is None else len(positions))
        cot = _rand((P, d), 100 * T + i)
        if isinstance(positions, int):
            cot = cot[0]
        kw = {} if layers is None else {"layers": layers}
        got = model.vjp(ids, cot, at=(layer, positions), **kw)
        want = store.memo(("vjp", name, _ref_key(name, fmt), i), lambda: ref_vjp(hf, ids, cot, layer, positions, layers))
        out_layers = list(range(layer + 1)) if layers is None else layers
        compare_layers(log, f"vjp {name}/{fmt}/T={T} at=({layer},{positions})", got, want, out_layers)


def test_vjp_structure(store):
    """Exact structure: a causal model's gradient of position p is zero after p; a windowed
    layer alone (resid[1] -> resid[0] through gemma2's sliding layer 0, window 10) is zero
    before p - 9; the encoder's gradient reaches every position."""
    m = store.sl("gemma2", "st")
    ids = _ids("gemma2")
    p = 30
    g = m.vjp(ids, _rand((64,), 3), at=(1, p), layers=[0])[0]
    assert np.all(g[p + 1:] == 0)
    assert np.all(g[:p - 9] == 0), "gradient leaks outside the sliding window"
    assert np.all(np.abs(g[p - 9:p + 1]).max(axis=-1) > 0)
    b = store.sl("bert", "st")
    ids = _ids("bert")
    g = b.vjp(ids, _rand((64,), 4), at=(3, 5), layers=[0])[0]
    assert np.all(np.abs(g).max(axis=-1) > 0), "bidirectional gradient must reach every position"


# ============================================================================ Model.jvp

@pytest.mark.parametrize("name,fmt", CASES, ids=CASE_IDS)
def test_jvp(store, log, name, fmt):
    f = _facts(store, name, fmt)
    L, d = f["n_layers"], f["d_model"]
    hf, model = store.hf(name, fmt), store.sl(name, fmt)
    ids = _ids(name, seed=1)
    T = len(ids)
    for at in (0, L - 1):
        v = _rand((T, d), 10 + at)
        got = model.jvp(ids, v, at=at)
        want = store.memo(("jvp", name, _ref_key(name, fmt), at), lambda: ref_jvp(hf, ids, v, at))
        compare_layers(log, f"jvp {name}/{fmt}/T={T} at={at}", got, want, range(at, L + 1))


# ============================================================================ Model.jacobian

@pytest.mark.parametrize("name", ST_NAMES)
def test_jacobian(store, log, name):
    f = _facts(store, name, "st")
    L, d = f["n_layers"], f["d_model"]
    hf, model = store.hf(name), store.sl(name, "st")
    T = 14 if not any(f["windows"]) else max(f["windows"]) + 4
    ids = _ids(name, T, seed=2)
    # an inner position: the encoder's Jacobian reaches the keys after it, a decoder's is 0 there
    wrt, pos = 0, T // 2
    got = model.jacobian(ids, of=(L, pos), wrt=wrt, progress=False)
    want = ref_jacobian(hf, ids, L, pos, wrt)
    assert got.shape == (d, T, d)
    log.compare(f"jacobian {name}/T={T} of=({L},{pos}) wrt={wrt}", "J", got, want)
    if SPECS[name].causal:
        assert np.all(got[:, pos + 1:] == 0), "non-causal Jacobian entries"


# ============================================================================ loss_and_grad

def compare_param_grads(log, case, name, got, want):
    """Each parameter gradient within the bound of its own max, except the key bias of a model
    without RoPE (GPT-2): it shifts every score of a query by the same q.b_k, which softmax
    ignores, so its true gradient is exactly 0 and the reference holds float32 rounding
    (~1e-8); there the bound is 1e-4 of the same layer's query-bias gradient."""
    rope = SPECS[name].family not in ("gpt2", "bert")
    for k in want:
        g = np.asarray(got[k])
        assert g.dtype == np.float32, f"{case} {k}: dtype {g.dtype}"
        if not rope and k.endswith(".attn_k_b"):
            scale = float(np.max(np.abs(want[k[:-len("attn_k_b")] + "attn_q_b"])))
            assert float(np.max(np.abs(g))) <= rm.RTOL * scale, (
                f"{case} {k}: max|grad| {np.max(np.abs(g)):.2e} > {rm.RTOL:g} * {scale:.2e} "
                "(the key bias cannot change the attention without RoPE)")
            continue
        log.compare(case, k, g, want[k])


@pytest.mark.parametrize("name,fmt", LM_CASES, ids=[f"{n}-{f}" for n, f in LM_CASES])
def test_loss_and_grad(store, log, name, fmt):
    hf, model = store.hf(name, fmt), store.sl(name, fmt)
    ids = _ids(name, seed=3)
    loss, grads = model.loss_and_grad(ids)
    tied_ref = hf.get_output_embeddings().weight is hf.get_input_embeddings().weight
    if tied_ref and "lm_head" in grads:
        np.testing.assert_array_equal(model.weight("lm_head"), model.weight("tok_embd"))
        hf = untied_head(hf)
    want_loss, want = ref_loss_and_grad(hf, ids, gguf_layout=(fmt == "gguf"))
    assert isinstance(loss, float)
    assert abs(loss - want_loss) <= 1e-4 * abs(want_loss), (loss, want_loss)
    case = f"loss_and_grad {name}/{fmt}/T={len(ids)}"
    assert sorted(grads) == sorted(want), (
        f"{case}: keys differ: missing {sorted(set(want) - set(grads))}, "
        f"extra {sorted(set(grads) - set(want))}")
    compare_param_grads(log, case, name, grads, want)
    for k in want:
        assert np.shape(grads[k]) == np.shape(model.weights[k]), k


@pytest.mark.parametrize("name", ["gemma2", "gpt2"])
def test_loss_and_grad_targets(store, log, name):
    """Explicit targets with ignored (-1) positions."""
    hf, model = store.hf(name), store.sl(name, "st")
    ids = _ids(name, 25, seed=4)
    rng = np.random.default_rng(4)
    targets = rng.integers(0, SPECS[name].hf.get("vocab_size", 320), 25)
    targets[rng.random(25) < 0.3] = -1
    loss, grads = model.loss_and_grad(ids, targets=targets)
    want_loss, want = ref_loss_and_grad(hf, ids, targets)
    assert abs(loss - want_loss) <= 1e-4 * abs(want_loss), (loss, want_loss)
    compare_param_grads(log, f"loss_and_grad targets {name}", name, grads, want)


# ============================================================================ sensitivity

@pytest.mark.parametrize("name,target", [("gemma2", 13), ("bert", 13), ("bert", 5)])
def test_sensitivity_exact(store, log, name, target):
    """The over-squashing map on a windowed, soft-capped decoder and on the encoder, whose inner
    targets are influenced by later positions too."""
    f = _facts(store, name, "st")
    L = f["n_layers"]
    hf, model = store.hf(name), store.sl(name, "st")
    T = 14
    ids = _ids(name, T, seed=5)
    res = sl.sensitivity(model, ids, target=target, method="exact", progress=False)
    assert res.fro.shape == (L + 1, T)
    fro, spectral = ref_sensitivity(hf, ids, target, range(L + 1))
    for i in range(L + 1):
        log.compare(f"sensitivity {name} t={target}", f"fro[{i}]", res.fro[i], fro[i])
        log.compare(f"sensitivity {name} t={target}", f"spectral[{i}]", res.spectral[i], spectral[i])
