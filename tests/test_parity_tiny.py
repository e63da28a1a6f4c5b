"""sinklab's forward vs Hugging Face transformers (fp32, eager attention) on random tiny LLaMA
models: logits, the residual stream entering every layer (and the last layer's output before
the final norm), and attention probabilities, for every config in reference_models.SPECS, from
safetensors folders (f32 / f16 / bf16, single file and sharded) and GGUF files (F32 / F16 /
Q8_0), with and without a batch axis and with a `layers=` subset.

Bound, per tensor (logits; each layer's resid; each layer's attn):
    max|sinklab - reference| <= 1e-4 * max|reference|
For f16/bf16/Q8_0 files the reference model holds exactly the weights stored in the file
(rounded / quantized -> dequantized), so the bound measures the forward, not the storage.
"""
import numpy as np
import pytest

from tests.support import reference_models as rm

rm.require("torch")
rm.require("transformers")
rm.require("gguf")

import sinklab as sl  # noqa: E402

SEQ_LENS = (1, 2, 17, 100)
CAPTURE = ("attn", "resid", "logits")

GGUF_CASES = [(s, q) for s in rm.SPECS for q in ("F32", "F16", "Q8_0")
              if q != "Q8_0" or rm.SPECS[s].q8_ok]
DTYPE_CASES = [("mha", "float16"), ("gqa_tied", "bfloat16"), ("llama3", "bfloat16"),
               ("odd", "float16")]


class Store:
    """Per-module cache: HF models, files written from them, sinklab models loaded from those
    files, and the matching reference models (rounded / dequantized weights)."""

    def __init__(self, root):
        self.root = root
        self._hf, self._path, self._sl, self._ref = {}, {}, {}, {}

    def hf(self, spec):
        if spec not in self._hf:
            self._hf[spec] = rm.make_hf_model(rm.SPECS[spec])
        return self._hf[spec]

    def path(self, spec, fmt):
        """fmt: "st-float32" | "st-float16" | "st-bfloat16" | "st-sharded" | "gguf-F32" | ..."""
        key = (spec, fmt)
        if key not in self._path:
            s = rm.SPECS[spec]
            kind, arg = fmt.split("-", 1)
            if kind == "gguf":
                p = rm.write_gguf(self.hf(spec), self.root / f"{spec}-{arg}.gguf", arg)
            elif arg == "sharded":
                p = rm.save_hf(self.hf(spec), self.root / f"{spec}-sharded", max_shard_size="40KB",
                               legacy_config=s.legacy_config)
            else:
                p = rm.save_hf(self.hf(spec), self.root / f"{spec}-{arg}", dtype=arg,
                               legacy_config=s.legacy_config)
            self._path[key] = p
        return self._path[key]

    def sl(self, spec, fmt):
        key = (spec, fmt)
        if key not in self._sl:
            self._sl[key] = sl.load(str(self.path(spec, fmt)))
        return self._sl[key]

    def ref_model(self, spec, fmt):
        key = (spec, fmt)
        if key not in self._ref:
            kind, arg = fmt.split("-", 1)
            if kind == "gguf":
                m = rm.dequantized_model(self.hf(spec), arg)
            elif arg in ("float16", "bfloat16"):
                m = rm.rounded_model(self.hf(spec), arg)
            else:
                m = self.hf(spec)
            self._ref[key] = m
        return self._ref[key]

    def check(self, log, spec, fmt, ids, layers=None, case=None):
        tr = self.sl(spec, fmt).run(ids, capture=CAPTURE, layers=layers)
        ref = rm.hf_forward(self.ref_model(spec, fmt), ids)
        case = case or f"{spec}/{fmt}/T={np.shape(ids)[-1]}"
        log.compare_trace(case, tr, ref, layers=layers)
        return tr, ref


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return Store(tmp_path_factory.mktemp("tiny_models"))


@pytest.fixture(scope="module")
def log(request):
    lg = rm.ErrorLog("tiny")
    rm.report_fixture(request, lg)
    return lg


def _ids(spec, T, seed=0, batch=None):
    return rm.random_ids(rm.SPECS[spec].vocab_size, T, seed=1000 * T + seed, batch=batch)


# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["st-float32", "gguf-F32"])
@pytest.mark.parametrize("spec", list(rm.SPECS))
def test_config(store, spec, fmt):
    s = rm.SPECS[spec]
    c = store.sl(spec, fmt).config
    assert c.arch == "llama"
    assert (c.n_layers, c.n_heads, c.n_kv_heads, c.d_model, c.head_dim, c.d_ff, c.vocab_size) == \
        (s.n_layers, s.n_heads, s.n_kv_heads, s.d_model, s.head_dim, s.d_ff, s.vocab_size)
    assert c.context_length == s.context_length
    assert c.rope_theta == pytest.approx(s.rope_theta, rel=1e-6)
    assert c.norm_eps == pytest.approx(s.norm_eps, rel=1e-6)
    assert bool(c.tied_embeddings) == s.tied
    assert c.bos_token_id == rm.BOS_ID
    if s.rope_scaling is None:
        assert not c.rope_scaling
    elif fmt.startswith("st"):
        # the safetensors config names the scaling; a GGUF may carry it as metadata or as the
        # rope_freqs tensor (llama3), so only check the safetensors form
        assert c.rope_scaling
        rtype = c.rope_scaling.get("rope_type", c.rope_scaling.get("type"))
        assert rtype == s.rope_type
        assert float(c.rope_scaling["factor"]) == s.rope_scaling["factor"]


@pytest.mark.parametrize("T", SEQ_LENS)
@pytest.mark.parametrize("spec", list(rm.SPECS))
def test_safetensors_f32(store, log, spec, T):
    store.check(log, spec, "st-float32", _ids(spec, T))


@pytest.mark.parametrize("T", SEQ_LENS)
@pytest.mark.parametrize("spec,qtype", GGUF_CASES)
def test_gguf(store, log, spec, qtype, T):
    store.check(log, spec, f"gguf-{qtype}", _ids(spec, T, seed=1))


@pytest.mark.parametrize("T", (2, 100))
@pytest.mark.parametrize("spec,dtype", DTYPE_CASES)
def test_safetensors_half(store, log, spec, dtype, T):
    store.check(log, spec, f"st-{dtype}", _ids(spec, T, seed=2))


@pytest.mark.parametrize("spec", ["mha", "odd", "gqa_tied"])
def test_safetensors_sharded(store, log, spec):
    path = store.path(spec, "st-sharded")
    assert (path / "model.safetensors.index.json").exists()
    assert len(list(path.glob("*.safetensors"))) > 1
    store.check(log, spec, "st-sharded", _ids(spec, 17, seed=3))


def test_gguf_and_safetensors_agree(store):
    """Same weights through the two loaders: the GGUF one un-does llama.cpp's Q/K permutation
    (or applies rope in llama.cpp's pair layout); either way the outputs must agree."""
    ids = _ids("gqa_tied", 33, seed=4)
    a = store.sl("gqa_tied", "st-float32").run(ids, capture=CAPTURE)
    b = store.sl("gqa_tied", "gguf-F32").run(ids, capture=CAPTURE)
    for name in CAPTURE:
        rm.assert_close(f"gguf vs safetensors {name}", getattr(b, name), getattr(a, name))


@pytest.mark.parametrize("spec,fmt", [("mha", "st-float32"), ("gqa_tied", "gguf-F32"),
                                      ("llama3", "gguf-Q8_0"), ("odd", "st-float32")])
def test_batch(store, log, spec, fmt):
    B, T = 3, 19
    ids = _ids(spec, T, seed=5, batch=B)
    ids[1, 0] = 7             # one row without BOS
    L, H = rm.SPECS[spec].n_layers, rm.SPECS[spec].n_heads
    tr, _ = store.check(log, spec, fmt, ids, case=f"{spec}/{fmt}/batch{B}x{T}")
    assert np.shape(tr.attn) == (B, L, H, T, T)
    assert np.shape(tr.resid) == (B, L + 1, T, rm.SPECS[spec].d_model)
    assert np.shape(tr.logits) == (B, T, rm.SPECS[spec].vocab_size)
    # each row of the batch equals the unbatched run of that row
    model = store.sl(spec, fmt)
    single = model.run(ids[2], capture=CAPTURE)
    for name in CAPTURE:
        rm.assert_close(f"batch row vs single {name}", np.asarray(getattr(tr, name))[2],
                        getattr(single, name), rtol=1e-6)


@pytest.mark.parametrize("layers", [[0], [0, 4], [1, 3]], ids=lambda x: "-".join(map(str, x)))
def test_layers_subset(store, log, layers):
    spec, fmt = "odd", "st-float32"      # 5 layers
    T = 23
    ids = _ids(spec, T, seed=6)
    tr, ref = store.check(log, spec, fmt, ids, layers=layers,
                          case=f"{spec}/{fmt}/layers={layers}")
    assert list(tr.layers) == list(layers)
    assert np.shape(tr.attn) == (len(layers), rm.SPECS[spec].n_heads, T, T)
    assert np.shape(tr.resid)[0] == rm.SPECS[spec].n_layers + 1


def test_layers_subset_batched(store, log):
    spec, fmt = "mha", "gguf-F16"
    ids = _ids(spec, 12, seed=7, batch=2)
    tr, _ = store.check(log, spec, fmt, ids, layers=[2], case=f"{spec}/{fmt}/batch2/layers=[2]")
    assert np.shape(tr.attn) == (2, 1, rm.SPECS[spec].n_heads, 12, 12)
    assert list(tr.layers) == [2]


def test_context_filled(store, log):
    """A prompt as long as the model's context (256 tokens)."""
    spec = "llama3"
    T = rm.SPECS[spec].context_length
    store.check(log, spec, "st-float32", _ids(spec, T, seed=8))


# --------------------------------------------------------------------------- reference self-checks

def test_gguf_writer_roundtrip_transformers(store):
    """The GGUF writer, read back by transformers' own GGUF loader (which un-does llama.cpp's
    Q/K permutation), gives exactly the weights the reference forward uses."""
    torch = rm.require("torch")
    transformers = rm.require("transformers")
    for spec, qtype in [("gqa_tied", "Q8_0"), ("odd", "F16")]:
        path = store.path(spec, f"gguf-{qtype}")
        m = transformers.AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32, attn_implementation="eager")
        want = store.ref_model(spec, f"gguf-{qtype}").state_dict()
        got = m.state_dict()
        bad = [k for k in want if not torch.equal(want[k], got[k])]
        assert not bad, f"{spec}/{qtype}: weights differ after the transformers GGUF round trip: {bad[:5]}"

