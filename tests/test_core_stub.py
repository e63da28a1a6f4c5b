"""sinklab/_core.pyi against the C source it describes (csrc/*.c: the method table, each
function's keyword list and argument format) and against the built module: every function is
there, with the binding's parameter names, its positional-only calls and its optional
arguments, so that a type checker reading the stub sees the calls the C code accepts."""
import ast
import re
from pathlib import Path

import pytest

from sinklab import _core

ROOT = Path(__file__).resolve().parents[1]
STUB = ROOT / "sinklab" / "_core.pyi"
CSRC = ROOT / "csrc"


def c_signatures():
    """{name: (keyword names or None, number of arguments, number required, METH flags)} from
    the method table and each function's PyArg_Parse* format."""
    src = "\n".join(p.read_text() for p in sorted(CSRC.glob("*.c")))
    table = re.findall(r'\{"(\w+)",\s*(?:\(PyCFunction\)\(void \(\*\)\(void\)\))?(\w+),\s*([A-Z_ |]+),', src)
    out = {}
    for name, fn, flags in table:
        body = re.search(r"PyObject\s*\*\s*%s\s*\([^)]*\)\s*\{(.*?)\n\}" % fn, src, re.S)
        assert body, f"no body found for {fn} ({name})"
        kw = re.search(r"kwlist\[\]\s*=\s*\{([^}]*)\}", body.group(1))
        fmt = re.search(r'PyArg_Parse\w*\([^"]*"([^":;]*)', body.group(1))
        codes = re.findall(r"[A-Za-z|]", fmt.group(1)) if fmt else []
        n = len([c for c in codes if c != "|"])
        req = codes.index("|") if "|" in codes else n
        if "METH_O" in flags.split() or flags.strip() == "METH_O":
            n, req = 1, 1
        if "METH_NOARGS" in flags:
            n, req = 0, 0
        out[name] = (re.findall(r'"(\w+)"', kw.group(1)) if kw else None, n, req, flags.strip())
    return out


def stub_signatures():
    tree = ast.parse(STUB.read_text())
    funcs = {f.name: f.args for f in tree.body if isinstance(f, ast.FunctionDef)}
    attrs = {a.target.id for a in tree.body if isinstance(a, ast.AnnAssign)}
    return funcs, attrs


def test_the_stub_names_every_function_of_the_binding_and_the_module():
    c = c_signatures()
    funcs, attrs = stub_signatures()
    assert set(funcs) == set(c), (sorted(set(c) - set(funcs)), sorted(set(funcs) - set(c)))
    built = {n for n in dir(_core) if not n.startswith("__")}
    assert set(funcs) | attrs == built, sorted(built ^ (set(funcs) | attrs))


@pytest.mark.parametrize("name", sorted(c_signatures()))
def test_each_signature_matches_the_c_keyword_list_and_format(name):
    kw, n, req, flags = c_signatures()[name]
    args = stub_signatures()[0][name]
    names = [a.arg for a in args.posonlyargs + args.args]
    assert not args.vararg and not args.kwarg and not args.kwonlyargs, name
    assert len(names) == n, f"{name}: the stub has {len(names)} parameters, the C format {n}"
    assert n - len(args.defaults) == req, f"{name}: {n - len(args.defaults)} required in the stub, {req} in C"
    if kw is None:       # METH_O / METH_VARARGS without keywords: positional only
        assert len(args.posonlyargs) == n, f"{name}: takes no keywords in C, so its parameters are positional-only"
    else:
        assert not args.posonlyargs and names == kw, f"{name}: stub {names} vs kwlist {kw}"
