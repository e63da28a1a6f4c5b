"""LayerNorm, biases, soft-capping and the GELU activations of csrc/ops.c against float64 torch.

These ops are reached from Python only through the model, so each is driven here by a small C
program compiled against csrc/ops.c (as tests/test_sgemm.py::test_c_api does): the test writes
float32 inputs to files, the program runs the op at a chosen SIMD level and thread count, and the
outputs are compared with float64 torch (the function, torch.autograd for backwards,
torch.func.jvp for tangents).

Error bounds, in units of u = 2**-24 (float32 rounding), from the operation counts of the float
steps (the long sums run in double and add nothing visible):
  - LayerNorm forward, ((x - mean) * rstd) * w + b: mean and rstd are each rounded once to
    float, then four rounded operations, so |out - ref| <= 6u (|w| rstd (|x| + |mean|) + |b|).
    A biased/unbiased variance mix-up (factor d/(d-1)) or a dropped eps (1e-3 relative here) is
    thousands of times larger.
  - LayerNorm backward / JVP, r (v - mean(v) - xh mean(v xh)) with v = w dy or dx: a few
    roundings on each of the three terms, bounded by 16u r (|v| + |mean(v)| + |xh| |mean(v xh)|)
    (times |w| for the JVP). Dropping either mean term is orders of magnitude larger.
  - dw, db, bias_backward: double sums of float products, one final rounding: 4u sum|terms|.
  - GELU-tanh computes x / (1 + exp(-2z)), z = sqrt(2/pi)(x + 0.044715 x^3) in float: the
    relative error of z (about 4u) becomes |2z| 4u relative in exp, so the bound is
    8u (2 + 2|z|) |ref| plus 1e-37 |x| for results in the denormal range (the vector exp clamps
    its argument at -87.3). Erf GELU follows torch's float formula, whose 1 + erf cancels for
    negative x: 4u |ref| + 2u |x|.
  - Softcap: tanhf of a rounded quotient, then a product: 4u |ref| + 2u |x| (1 - tanh^2).
"""
import os
import shutil
import subprocess
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tests.support import reference_models as rm

torch = rm.require("torch")

U = 2.0**-24
pytestmark = pytest.mark.cdriver  # compiles csrc/ into a driver (or library) and runs it

ROOT = Path(__file__).resolve().parents[1]
GENERIC, AVX2, AVX512 = 0, 1, 2
ACTS = {"swiglu": 0, "geglu_tanh": 1, "gelu_tanh": 2, "gelu_erf": 3}

DRIVER = textwrap.dedent(r"""
/* Runs one op of csrc/ops.c on float32 files in a directory (written by the test):
 *   drv DIR OP LEVEL THREADS ARGS...   (LEVEL: 0 generic, 1 avx2, 2 avx512) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "ops.h"
#include "sl_common.h"

static const char *dir;

static float *load(const char *name, int64_t n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.bin", dir, name);
    float *p = calloc((size_t)(n > 0 ? n : 1), sizeof(float));
    FILE *f = fopen(path, "rb");
    if (!f || fread(p, sizeof(float), (size_t)n, f) != (size_t)n) {
        fprintf(stderr, "cannot read %s\n", path);
        exit(2);
    }
    fclose(f);
    return p;
}

static void save(const char *name, const float *p, int64_t n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.bin", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, sizeof(float), (size_t)n, f) != (size_t)n) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(2);
    }
    fclose(f);
}

static float *copy(const float *p, int64_t n) {
    float *q = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    memcpy(q, p, (size_t)n * sizeof(float));
    return q;
}

int main(int argc, char **argv) {
    if (argc < 5) return 2;
    dir = argv[1];
    const char *op = argv[2];
    int level = atoi(argv[3]);
    if ((int)sl_set_simd((sl_simd_level)level) != level) {
        printf("LEVEL-UNAVAILABLE\n");
        return 0;
    }
    sl_set_num_threads(atoi(argv[4]));
    char **a = argv + 5;
    if (!strcmp(op, "layernorm")) { /* T d rows eps has_b accumulate */
        int64_t T = atoll(a[0]), d = atoll(a[1]), rows = atoll(a[2]);
        float eps = (float)atof(a[3]);
        int has_b = atoi(a[4]), acc = atoi(a[5]);
        float *x = load("x", T * d), *w = load("w", d), *b = load("b", d);
        float *dy = load("dy", rows * d), *dx = load("dx0", rows * d), *tan = load("tan", rows * d);
        float *dw = load("dw0", d), *db = load("db0", d);
        float *out = malloc((size_t)(T * d) * sizeof(float));
        float *mean = malloc((size_t)T * sizeof(float)), *rstd = malloc((size_t)T * sizeof(float));
        sl_layernorm(out, mean, rstd, x, w, has_b ? b : NULL, T, d, eps);
        save("out", out, T * d);
        save("mean", mean, T);
        save("rstd", rstd, T);
        float *inplace = copy(x, T * d); /* out aliasing x */
        sl_layernorm(inplace, NULL, NULL, inplace, w, has_b ? b : NULL, T, d, eps);
        save("out_inplace", inplace, T * d);
        sl_layernorm_backward(dx, acc, dw, has_b ? db : NULL, dy, x, w, mean, rstd, rows, T, d);
        save("dx", dx, rows * d);
        save("dw", dw, d);
        save("db", db, d);
        float *jvp = malloc((size_t)(rows * d) * sizeof(float));
        sl_layernorm_jvp(jvp, tan, x, w, mean, rstd, rows, T, d);
        save("jvp", jvp, rows * d);
    } else if (!strcmp(op, "act")) { /* act n rows */
        int act = atoi(a[0]);
        int64_t n = atoll(a[1]), rows = atoll(a[2]);
        int gated = act == SL_ACT_SWIGLU || act == SL_ACT_GEGLU_TANH;
        float *g = load("g", n), *u = load("u", n), *dh = load("dh", rows * n);
        float *tg = load("tg", rows * n), *tu = load("tu", rows * n);
        float *h = malloc((size_t)n * 4), *pg = malloc((size_t)n * 4), *pu = malloc((size_t)n * 4);
        sl_mlp_act(act, h, g, u, n);
        save("h", h, n);
        float *ha = copy(gated ? g : u, n); /* h aliasing its input */
        sl_mlp_act(act, ha, gated ? ha : g, gated ? u : ha, n);
        save("h_alias", ha, n);
        sl_mlp_act_partials(act, gated ? pg : NULL, pu, gated ? g : NULL, u, n);
        if (gated) save("dh_dg", pg, n);
        save("dh_du", pu, n);
        float *dg = malloc((size_t)(rows * n) * 4), *du = malloc((size_t)(rows * n) * 4);
        float *jv = malloc((size_t)(rows * n) * 4);
        sl_swiglu_backward(gated ? dg : NULL, du, dh, gated ? pg : NULL, pu, rows * n, n);
        if (gated) save("dg", dg, rows * n);
        save("du", du, rows * n);
        sl_swiglu_jvp(jv, gated ? tg : NULL, tu, gated ? pg : NULL, pu, rows * n, n);
        save("jvp", jv, rows * n);
    } else if (!strcmp(op, "softcap")) { /* n cap */
        int64_t n = atoll(a[0]);
        float cap = (float)atof(a[1]);
        float *x = load("x", n), *dy = load("dy", n), *dx = malloc((size_t)n * 4);
        sl_softcap(x, n, cap);
        save("y", x, n);
        sl_softcap_backward(dx, dy, x, n, cap);
        save("dx", dx, n);
        sl_softcap_backward(dy, dy, x, n, cap); /* dx aliasing dy */
        save("dx_alias", dy, n);
    } else if (!strcmp(op, "bias")) { /* rows d ld */
        int64_t rows = atoll(a[0]), d = atoll(a[1]), ld = atoll(a[2]);
        float *x = load("x", rows * ld), *b = load("b", d), *dy = load("dy", rows * ld), *db = load("db0", d);
        sl_bias_add(x, b, rows, d, ld);
        save("x_out", x, rows * ld);
        sl_bias_backward(db, dy, rows, d, ld);
        save("db", db, d);
    } else {
        return 2;
    }
    printf("OK\n");
    return 0;
}
""")


@pytest.fixture(scope="module")
def drv(tmp_path_factory):
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler")
    csrc = ROOT / "csrc"
    if not (csrc / "ops.c").exists():
        pytest.skip("C sources not available")
    d = tmp_path_factory.mktemp("opsdrv")
    src = d / "drv.c"
    src.write_text(DRIVER)
    exe = d / "drv"
    files = [str(src)] + [str(csrc / f) for f in ("ops.c", "cpu.c", "common.c")]
    base = [cc, "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", f"-I{csrc}", "-o", str(exe)]
    build = subprocess.run(base + ["-fopenmp", "-DSL_HAVE_OPENMP=1"] + files + ["-lm"], capture_output=True, text=True)
    if build.returncode != 0:  # compiler without OpenMP: the pragmas are ignored
        build = subprocess.run(base + ["-DSL_HAVE_OPENMP=0", "-Wno-unknown-pragmas"] + files + ["-lm"],
                               capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    return exe


class Run:
    """One driver invocation: inputs written as float32 files, outputs read back."""

    def __init__(self, exe, tmp_path):
        self.exe, self.base, self.n = exe, tmp_path, 0

    def __call__(self, op, inputs, args, level=GENERIC, threads=1):
        self.n += 1
        d = self.base / f"run{self.n}"
        d.mkdir()
        for k, v in inputs.items():
            np.ascontiguousarray(v, dtype=np.float32).tofile(d / f"{k}.bin")
        r = subprocess.run([str(self.exe), str(d), op, str(level), str(threads)] + [str(a) for a in args],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        if r.stdout.strip() == "LEVEL-UNAVAILABLE":
            pytest.skip(f"SIMD level {level} not available on this CPU")
        assert r.stdout.strip() == "OK", r.stdout + r.stderr
        return {p.stem: np.fromfile(p, dtype=np.float32) for p in d.glob("*.bin") if p.stem not in inputs}


@pytest.fixture
def run(drv, tmp_path):
    return Run(drv, tmp_path)


def t64(a):
    return torch.from_numpy(np.asarray(a, dtype=np.float64))


def within(got, ref, tol, what):
    got = np.asarray(got, dtype=np.float64).reshape(np.shape(ref))
    err = np.abs(got - ref)
    bad = ~(err <= tol)
    assert not bad.any(), (f"{what}: {bad.sum()} of {bad.size} outside the bound; worst err "
                           f"{err[bad].max():.3g} at tol {np.broadcast_to(tol, err.shape)[bad].min():.3g}")


# ---------------------------------------------------------------------------------------------
# LayerNorm


def ln_inputs(rng, T, d, B, offset=0.0):
    x = (rng.standard_normal((T, d)) * rng.uniform(0.2, 3.0, (T, 1)) + offset).astype(np.float32)
    return {
        "x": x,
        "w": rng.uniform(-2, 2, d).astype(np.float32),
        "b": rng.standard_normal(d).astype(np.float32),
        "dy": rng.standard_normal((B * T, d)).astype(np.float32),
        "dx0": rng.standard_normal((B * T, d)).astype(np.float32),
        "tan": rng.standard_normal((B * T, d)).astype(np.float32),
        "dw0": rng.standard_normal(d).astype(np.float32),
        "db0": rng.standard_normal(d).astype(np.float32),
    }


def ln_reference(inp, T, d, B, eps, has_b, accumulate):
    """float64 torch: forward, per-direction J^T dy, summed dw/db, per-direction J dx."""
    x, w, b = t64(inp["x"]).requires_grad_(), t64(inp["w"]).requires_grad_(), t64(inp["b"]).requires_grad_()
    y = torch.nn.functional.layer_norm(x, (d,), w, b if has_b else None, eps)
    dy = t64(inp["dy"]).reshape(B, T, d)
    dxs, dw, db = [], torch.zeros(d, dtype=torch.float64), torch.zeros(d, dtype=torch.float64)
    for k in range(B):
        gx, gw, gb = torch.autograd.grad(y, (x, w, b), dy[k], retain_graph=True, allow_unused=True)
        dxs.append(gx)
        dw += gw
        if has_b:
            db += gb
    dx = torch.cat(dxs).numpy()
    if accumulate:
        dx = dx + inp["dx0"].astype(np.float64)
    tan = t64(inp["tan"]).reshape(B, T, d)
    wd, bd = t64(inp["w"]), t64(inp["b"])
    f = lambda xx: torch.nn.functional.layer_norm(xx, (d,), wd, bd if has_b else None, eps)  # noqa: E731
    jvp = torch.cat([torch.func.jvp(f, (t64(inp["x"]),), (tan[k],))[1] for k in range(B)]).numpy()
    x64 = inp["x"].astype(np.float64)
    mean = x64.mean(1)
    rstd = 1.0 / np.sqrt(x64.var(1) + eps)
    return {
        "out": y.detach().numpy(), "mean": mean, "rstd": rstd, "dx": dx,
        "dw": dw.numpy() + inp["dw0"], "db": (db.numpy() + inp["db0"]) if has_b else inp["db0"].astype(np.float64),
        "jvp": jvp,
    }


def ln_bounds(inp, ref, T, d, B):
    """The bounds of the module docstring, from float64 quantities."""
    x, w, b = (inp[k].astype(np.float64) for k in ("x", "w", "b"))
    mean, rstd = ref["mean"][:, None], ref["rstd"][:, None]
    # |xh| plus what the float mean costs it: xh is computed from x - mean rounded to float
    xa = np.tile((np.abs(x) + np.abs(mean)) * rstd, (B, 1))
    r = np.tile(rstd, (B, 1))
    out = 6 * U * (np.abs(w) * rstd * (np.abs(x) + np.abs(mean)) + np.abs(b))

    def jac(v):
        v = np.abs(v)
        return 16 * U * r * (v + v.mean(1, keepdims=True) + xa * (v * xa).mean(1, keepdims=True))

    dy = inp["dy"].astype(np.float64)
    dx = jac(w * dy) + U * np.abs(ref["dx"])
    jvp = np.abs(w) * jac(inp["tan"].astype(np.float64))
    dw = 4 * U * (np.abs(dy * xa).sum(0) + np.abs(inp["dw0"]))
    db = 4 * U * (np.abs(dy).sum(0) + np.abs(inp["db0"]))
    return {"out": out, "dx": dx, "jvp": jvp, "dw": dw, "db": db}


LN_CASES = [  # T, d, B, eps, bias, accumulate, mean offset
    (5, 1, 1, 1e-5, True, 0, 0.0),
    (7, 13, 3, 1e-5, True, 1, 0.0),
    (6, 64, 2, 1e-5, False, 0, 0.0),
    (9, 333, 2, 1e-12, True, 1, 0.0),
    (4, 768, 1, 1e-5, True, 0, 20.0),
    (3, 50, 2, 0.5, False, 1, 0.0),
]


@pytest.mark.parametrize("level", [GENERIC, AVX2, AVX512], ids=["generic", "avx2", "avx512"])
@pytest.mark.parametrize("case", LN_CASES, ids=lambda c: "T{}-d{}-B{}-eps{}-b{}-acc{}-off{}".format(*c))
def test_layernorm_vs_torch(run, case, level):
    T, d, B, eps, has_b, acc, off = case
    inp = ln_inputs(np.random.default_rng(d * 31 + T), T, d, B, off)
    got = run("layernorm", inp, [T, d, B * T, repr(eps), int(has_b), acc], level)
    ref = ln_reference(inp, T, d, B, eps, has_b, acc)
    bnd = ln_bounds(inp, ref, T, d, B)
    within(got["mean"], ref["mean"], U * np.abs(ref["mean"]), "mean")
    within(got["rstd"], ref["rstd"], 2 * U * ref["rstd"], "rstd")
    within(got["out"], ref["out"], bnd["out"], "out")
    np.testing.assert_array_equal(got["out_inplace"], got["out"])  # out aliasing x
    within(got["dx"], ref["dx"], bnd["dx"], "dx")
    within(got["dw"], ref["dw"], bnd["dw"], "dw")
    within(got["db"], ref["db"], bnd["db"], "db")
    within(got["jvp"], ref["jvp"], bnd["jvp"], "jvp")


def test_layernorm_catches_unbiased_variance_and_eps(run):
    """The forward bound is tight enough to tell torch.nn.LayerNorm from near misses."""
    T, d, eps = 8, 256, 1e-3
    inp = ln_inputs(np.random.default_rng(5), T, d, 1)
    got = run("layernorm", inp, [T, d, T, repr(eps), 1, 0])["out"].reshape(T, d).astype(np.float64)
    x, w, b = (inp[k].astype(np.float64) for k in ("x", "w", "b"))
    ref = ln_reference(inp, T, d, 1, eps, True, 0)
    bnd = ln_bounds(inp, ref, T, d, 1)["out"]
    xc = x - x.mean(1, keepdims=True)
    unbiased = xc / np.sqrt(x.var(1, ddof=1, keepdims=True) + eps) * w + b
    no_eps = xc / np.sqrt(x.var(1, keepdims=True)) * w + b
    for wrong in (unbiased, no_eps):
        assert (np.abs(got - wrong) > bnd).any()


# ---------------------------------------------------------------------------------------------
# Activations


def gelu_tanh64(x):
    """x sigmoid(2z): torch's 0.5 x (1 + tanh(z)) without its cancellation for negative x (in
    float64, 1 + tanh(z) loses everything below 1e-16; test_gelu_tanh_identity checks the two
    agree to that)."""
    z = 0.7978845608028654 * (x + 0.044715 * x**3)
    return x * torch.sigmoid(2 * z)


def torch_act(name, g, u):
    F = torch.nn.functional
    if name == "swiglu":
        return F.silu(g) * u
    if name == "geglu_tanh":
        return gelu_tanh64(g) * u
    if name == "gelu_tanh":
        return gelu_tanh64(u)
    return F.gelu(u)


def test_gelu_tanh_identity():
    x = torch.linspace(-30, 30, 20001, dtype=torch.float64)
    ref = torch.nn.functional.gelu(x, approximate="tanh")
    assert torch.all(torch.abs(gelu_tanh64(x) - ref) <= 4e-16 * (1 + torch.abs(x)))


def act_inputs(rng, n, B):
    x = np.concatenate([
        rng.standard_normal(n - n // 4 - 12) * 3,
        rng.uniform(-12, 12, n // 4),
        [0.0, -0.0, 1e-20, -1e-20, 5.0, -5.0, 10.0, -10.0, 11.0, -11.0, 40.0, -40.0],
    ])[:n]
    return {
        "g": x.astype(np.float32),
        "u": rng.permutation(x).astype(np.float32),
        "dh": rng.standard_normal(B * n).astype(np.float32),
        "tg": rng.standard_normal(B * n).astype(np.float32),
        "tu": rng.standard_normal(B * n).astype(np.float32),
    }


def sigmoid_form(name, x):
    """For act(x) = x sigmoid(t): t, and dt/dx times |x| (the slope factor of act')."""
    x = x.astype(np.float64)
    if name == "swiglu":
        return x, np.abs(x)
    z = 0.7978845608028654 * (x + 0.044715 * x**3)
    return 2 * z, 2 * np.abs(x) * 0.7978845608028654 * (1 + 3 * 0.044715 * x**2)


def act_value_bound(name, x, ref):
    """Bound on |act(x) - ref| (ungated act): see the module docstring."""
    xa = np.abs(x.astype(np.float64))
    if name == "gelu_erf":
        return 4 * U * np.abs(ref) + 2 * U * xa
    t, _ = sigmoid_form(name, x)
    return 8 * U * (2 + np.abs(t)) * np.abs(ref) + 1e-37 * xa


def act_deriv_bound(name, x):
    """Bound on the error of act'(x) = s + q s (1 - s) (s = sigmoid(t), q the slope factor):
    the relative error of s from exp, plus the absolute error of the rounded 1 - s when s is
    near 1 (at most 2u, and never more than 1 - s itself). Erf: 1 + erf cancels (2u absolute),
    and the Gaussian's exp of a rounded x^2/2."""
    x = x.astype(np.float64)
    if name == "gelu_erf":
        pdf = np.exp(-0.5 * x * x) / np.sqrt(2 * np.pi)
        return 2 * U + 4 * U * np.abs(x) * pdf * (2 + x * x)
    t, q = sigmoid_form(name, x)
    s = 1 / (1 + np.exp(-t))
    return 8 * U * (2 + np.abs(t)) * (s + q * s * (1 - s)) + q * s * np.minimum(1 - s, 2 * U) + 1e-37 * (1 + q)


@pytest.mark.parametrize("level", [GENERIC, AVX2, AVX512], ids=["generic", "avx2", "avx512"])
@pytest.mark.parametrize("name", list(ACTS))
def test_activation_vs_torch(run, name, level):
    n, B = 1003, 3
    gated = name in ("swiglu", "geglu_tanh")
    inp = act_inputs(np.random.default_rng(ACTS[name]), n, B)
    got = run("act", inp, [ACTS[name], n, B], level)
    g, u = t64(inp["g"]).requires_grad_(), t64(inp["u"]).requires_grad_()
    h = torch_act(name, g, u)
    href = h.detach().numpy()
    xin = inp["g"] if gated else inp["u"]
    if gated:  # act(g) within its bound, times the exact u, rounded once more
        a = torch_act(name, t64(inp["g"]), torch.ones(n, dtype=torch.float64)).numpy()
        hb = act_value_bound(name, xin, a) * np.abs(inp["u"]) + U * np.abs(href)
    else:
        hb = act_value_bound(name, xin, href)
    within(got["h"], href, hb, "h")
    np.testing.assert_array_equal(got["h_alias"], got["h"])  # h aliasing its input
    # partials: dh_du (gated: act(g); plain: act'(u)) and dh_dg = u act'(g), from autograd
    gg, gu = torch.autograd.grad(h, (g, u), torch.ones_like(h), retain_graph=True, allow_unused=True)
    D = act_deriv_bound(name, xin)  # on act'
    if gated:
        uabs = np.abs(inp["u"]).astype(np.float64)
        a = gu.numpy()  # act(g)
        ab = act_value_bound(name, inp["g"], a)
        within(got["dh_du"], a, ab, "dh_du")
        within(got["dh_dg"], gg.numpy(), uabs * D + U * np.abs(gg.numpy()), "dh_dg")
        gb = uabs * D + U * np.abs(gg.numpy())  # bound on dh_dg
    else:
        within(got["dh_du"], gu.numpy(), D, "dh_du")
    # batched backward (rows = B * n, primal period n) and JVP vs autograd / torch.func.jvp:
    # one more rounded product (and a sum) on top of the partials' bounds
    dh = t64(inp["dh"]).reshape(B, n)
    tg, tu = t64(inp["tg"]).reshape(B, n), t64(inp["tu"]).reshape(B, n)
    f = lambda a_, c_: torch_act(name, a_, c_)  # noqa: E731
    for k in range(B):
        rg, ru = torch.autograd.grad(h, (g, u), dh[k], retain_graph=True, allow_unused=True)
        sl = slice(k * n, (k + 1) * n)
        dhk, tgk, tuk = (np.abs(v[k].numpy()) for v in (dh, tg, tu))
        if gated:
            within(got["dg"][sl], rg.numpy(), dhk * gb + U * np.abs(rg.numpy()), f"dg[{k}]")
            within(got["du"][sl], ru.numpy(), dhk * ab + U * np.abs(ru.numpy()), f"du[{k}]")
            jref = torch.func.jvp(f, (t64(inp["g"]), t64(inp["u"])), (tg[k], tu[k]))[1].numpy()
            jb = tgk * gb + tuk * ab + 2 * U * (tgk * np.abs(gg.numpy()) + tuk * np.abs(a))
        else:
            assert "dg" not in got
            within(got["du"][sl], ru.numpy(), dhk * D + U * np.abs(ru.numpy()), f"du[{k}]")
            zero = torch.zeros(n, dtype=torch.float64)
            jref = torch.func.jvp(f, (t64(inp["g"]), t64(inp["u"])), (zero, tu[k]))[1].numpy()
            jb = tuk * D + U * np.abs(jref)
        within(got["jvp"][sl], jref, jb, f"jvp[{k}]")


def test_gelu_variants_are_told_apart(run):
    """tanh vs erf GELU differ by up to ~1e-3: far outside each other's bounds."""
    n = 401
    x = np.linspace(-4, 4, n).astype(np.float32)
    inp = {"g": x, "u": x, "dh": x, "tg": x, "tu": x}
    h_tanh = run("act", inp, [ACTS["gelu_tanh"], n, 1])["h"].astype(np.float64)
    h_erf = run("act", inp, [ACTS["gelu_erf"], n, 1])["h"].astype(np.float64)
    ref_erf = torch.nn.functional.gelu(t64(x)).numpy()
    assert (np.abs(h_tanh - ref_erf) > act_value_bound("gelu_erf", x, ref_erf)).any()
    ref_tanh = torch.nn.functional.gelu(t64(x), approximate="tanh").numpy()
    assert (np.abs(h_erf - ref_tanh) > act_value_bound("gelu_tanh", x, ref_tanh)).any()


# ---------------------------------------------------------------------------------------------
# Soft-capping and biases


@pytest.mark.parametrize("level", [GENERIC, AVX2, AVX512], ids=["generic", "avx2", "avx512"])
@pytest.mark.parametrize("cap", [30.0, 50.0, 0.7])
def test_softcap_vs_torch(run, cap, level):
    rng = np.random.default_rng(int(cap * 10))
    n = 2000
    x = np.concatenate([rng.standard_normal(n - 6) * 3 * cap, [0.0, 1e-30, -1e-30, 1e6, -1e6, cap]]).astype(np.float32)
    dy = rng.standard_normal(n).astype(np.float32)
    got = run("softcap", {"x": x, "dy": dy}, [n, repr(cap)], level)
    xt = t64(x).requires_grad_()
    y = cap * torch.tanh(xt / cap)
    (dx,) = torch.autograd.grad(y, xt, t64(dy))
    yref, dxref = y.detach().numpy(), dx.numpy()
    sech2 = 1 - np.tanh(x.astype(np.float64) / cap) ** 2
    within(got["y"], yref, 4 * U * np.abs(yref) + 2 * U * np.abs(x) * sech2, "y")
    # 1 - (y/cap)^2 from the rounded y: its absolute error is about 2 |t| * 2u
    within(got["dx"], dxref, np.abs(dy) * (4 * U * np.abs(np.tanh(x / cap)) + 2 * U * sech2), "dx")
    np.testing.assert_array_equal(got["dx_alias"], got["dx"])


@pytest.mark.parametrize("rows,d,ld", [(1, 1, 1), (7, 300, 300), (5, 100, 130), (300, 520, 520)])
def test_bias_add_and_backward(run, rows, d, ld):
    rng = np.random.default_rng(rows + d)
    x = rng.standard_normal((rows, ld)).astype(np.float32)
    b = rng.standard_normal(d).astype(np.float32)
    dy = (rng.standard_normal((rows, ld)) * rng.uniform(0.1, 100, (rows, 1))).astype(np.float32)
    db0 = rng.standard_normal(d).astype(np.float32)
    got = run("bias", {"x": x, "b": b, "dy": dy, "db0": db0}, [rows, d, ld])
    want = x.copy()
    want[:, :d] += b  # float32 adds: exactly rounded, the same bits
    np.testing.assert_array_equal(got["x_out"].reshape(rows, ld), want)
    s = dy[:, :d].astype(np.float64)
    ref = db0 + s.sum(0)
    within(got["db"], ref, U * np.abs(ref) + 1e-15 * (np.abs(s).sum(0) + np.abs(db0)), "db")


# ---------------------------------------------------------------------------------------------
# Determinism: thread counts and SIMD levels


def big_inputs():
    rng = np.random.default_rng(11)
    T, d, B = 64, 768, 2
    ln = ln_inputs(rng, T, d, B)
    act = act_inputs(rng, 70001, 2)
    return (T, d, B), ln, act


@pytest.mark.parametrize("level", [GENERIC, AVX2, AVX512], ids=["generic", "avx2", "avx512"])
def test_thread_count_bitwise(run, level):
    (T, d, B), ln, act = big_inputs()
    for op, inp, args in [("layernorm", ln, [T, d, B * T, "1e-5", 1, 1])] + [
            ("act", act, [a, 70001, 2]) for a in ACTS.values()] + [
            ("softcap", {"x": act["g"] * 40, "dy": act["u"]}, [70001, "30"]),
            ("bias", {"x": act["dh"][:139000], "b": act["g"][:500], "dy": act["tg"][:139000],
                      "db0": act["u"][:500]}, [278, 500, 500])]:
        one = run(op, inp, args, level, threads=1)
        many = run(op, inp, args, level, threads=3)
        for k in one:
            np.testing.assert_array_equal(one[k], many[k], err_msg=f"{op} {k}")


def ulp_distance(a, b):
    """|a - b| in float32 units in the last place (ordered integer representation)."""
    ia, ib = (np.asarray(v, dtype=np.float32).view(np.int32).astype(np.int64) for v in (a, b))
    ia, ib = (np.where(v < 0, -(v & 0x7FFFFFFF), v) for v in (ia, ib))
    return np.abs(ia - ib)


def test_simd_levels_vs_generic(run):
    """What ops.c documents across levels: LayerNorm differs only through the order of its double
    sums (measured: bitwise on these inputs; bounded here by a rounding of mean and rstd each);
    GELU-tanh/GeGLU and softcap by the vector exp/tanh (measured <= 5 and <= 3 ulp on 2^20
    inputs; asserted <= 8 and <= 4 ulp, results below 1e-30 within 1e-36); erf GELU has no vector
    kernel (bitwise). The elementwise kernels run the same lane-wise operations on AVX2 and
    AVX-512: bitwise equal."""
    rng = np.random.default_rng(3)
    T, d = 24, 333
    ln = ln_inputs(rng, T, d, 1, 5.0)
    x64, w, b = (ln[k].astype(np.float64) for k in ("x", "w", "b"))
    n = 40001
    act = act_inputs(rng, n, 1)
    cap = 30.0
    sc = {"x": act["g"] * 10, "dy": act["u"]}
    base = {"ln": run("layernorm", ln, [T, d, T, "1e-5", 1, 0]),
            **{a: run("act", act, [ACTS[a], n, 1]) for a in ACTS},
            "sc": run("softcap", sc, [n, repr(cap)])}
    got = {}
    for level in (AVX2, AVX512):
        try:
            g = {"ln": run("layernorm", ln, [T, d, T, "1e-5", 1, 0], level),
                 **{a: run("act", act, [ACTS[a], n, 1], level) for a in ACTS},
                 "sc": run("softcap", sc, [n, repr(cap)], level)}
        except pytest.skip.Exception:
            continue
        got[level] = g
        assert (ulp_distance(g["ln"]["mean"], base["ln"]["mean"]) <= 1).all()
        assert (ulp_distance(g["ln"]["rstd"], base["ln"]["rstd"]) <= 1).all()
        m = base["ln"]["mean"].astype(np.float64)[:, None]
        r = base["ln"]["rstd"].astype(np.float64)[:, None]
        within(g["ln"]["out"], base["ln"]["out"].reshape(T, d).astype(np.float64),
               4 * U * (np.abs(w) * r * (np.abs(x64) + np.abs(m)) + np.abs(b)), "layernorm across levels")
        for a in ACTS:
            h0, h = base[a]["h"], g[a]["h"]
            small = np.abs(h0) < 1e-30
            limit = 0 if a == "gelu_erf" else 8
            assert (ulp_distance(h[~small], h0[~small]) <= limit).all(), a
            assert (np.abs(h[small].astype(np.float64) - h0[small]) <= 1e-36).all(), a
        assert (ulp_distance(g["sc"]["y"], base["sc"]["y"]) <= 4).all()
    if len(got) == 2:
        for a in ACTS:
            np.testing.assert_array_equal(got[AVX2][a]["h"], got[AVX512][a]["h"])
        np.testing.assert_array_equal(got[AVX2]["sc"]["y"], got[AVX512]["sc"]["y"])
