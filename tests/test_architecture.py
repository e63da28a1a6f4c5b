"""The package's import graph, read from the source with ``ast`` (nothing is imported to build it).

Show it::

    python tests/test_architecture.py            # floors, every edge, and what breaks a rule
    python tests/test_architecture.py --dot      # the graph in Graphviz dot

Nodes are the modules of sinklab/ (a package is its ``__init__``) and ``sinklab._core``.
Edges: every import of a sinklab module, top-level or inside a function (``from a import b``
names module ``a.b`` when that is a module, else ``a``; ``from sinklab import X`` names the
module ``X`` is defined in, through ``sinklab/__init__``'s lazy table; importing ``a.b.c`` also
runs the ``__init__`` of package ``a.b``, an edge too unless the importer is inside ``a.b``).

Floors, bottom to top, after DESIGN.md's layout (a module may import its own floor and below):

    0 ground   _core, system (memory, atomic writes, stale temporaries), runtime (threads,
               SIMD, build info, dequantization), progress, results, prompts
    1 files    io/, families/, tokenizer/ (file formats and the weight schema)
    2 model    model, trace, interventions, patching, inputs, batching (the door to the C core)
    3 viz      viz/ (draws plain results: no analysis, no training)
    4 analysis analysis/
    5 train    train/
    6 top      report/, sweeps/, cli, and the package itself (``import sinklab``: its lazy
               exports reach every floor; its only eager import is runtime)

Rules (each test prints the offending edges, file and line):

(a) no cycle; (b) no upward edge (``sinklab/__init__``'s lazy exports are not import
statements, so they are exempt by construction); (c) ``_core`` is imported only by model.py,
train/engine.py and runtime.py; (d) no private name (``_x``) of another sinklab module is
imported; (e) imports inside functions name only third-party modules (optional dependencies:
torch, pandas, dask, matplotlib, scipy, ...), never sinklab's own, except the subcommands of
cli.py, which import their top-floor module when they run (``sinklab --help`` would otherwise
load matplotlib, the report, the trainer and the sweeps: about 1.3 s), and the figure modules
(those of viz/ that import ``viz.figure``, hence matplotlib), imported where a figure is drawn:
matplotlib is the heaviest import of all (about 1 s), and a sweep's Dask workers or a training
run would otherwise load it to draw nothing.
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Tuple

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "sinklab"

FLOORS: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ("ground", ("sinklab._core", "sinklab.system", "sinklab.runtime", "sinklab.progress", "sinklab.results",
                "sinklab.prompts", "sinklab.reprs", "sinklab.labels")),
    ("files", ("sinklab.io", "sinklab.families", "sinklab.tokenizer")),
    ("model", ("sinklab.model", "sinklab.trace", "sinklab.interventions", "sinklab.patching", "sinklab.inputs",
               "sinklab.batching")),
    ("viz", ("sinklab.viz",)),
    ("analysis", ("sinklab.analysis",)),
    ("train", ("sinklab.train",)),
    ("top", ("sinklab.report", "sinklab.sweeps", "sinklab.cli", "sinklab")),
)
CORE = "sinklab._core"
CORE_DOORS = {"sinklab.model", "sinklab.train.engine", "sinklab.runtime"}
# Imports deferred on purpose (see the docstring, rule (e)): cli's subcommands import their own
# module when they run. (Figure modules, see drawing_modules, may be imported where a figure is
# drawn, anywhere.)
DEFERRED = {"sinklab.cli": ("sinklab.viz", "sinklab.report", "sinklab.train", "sinklab.sweeps")}
FIGURE_BASE = "sinklab.viz.figure"  # the one module that imports matplotlib's Figure


@dataclass(frozen=True)
class Edge:
    src: str
    dst: str
    line: int
    in_function: bool
    names: Tuple[str, ...]  # the names a ``from`` import takes (empty for ``import x``)
    implied: bool = False   # the __init__ of a package above the module named (runs first)

    def where(self) -> str:
        path = module_path(self.src).relative_to(ROOT)
        kind = ("in a function" if self.in_function else "top level") + (", its package's __init__" if self.implied else "")
        taken = f" ({', '.join(self.names)})" if self.names else ""
        return f"{path}:{self.line}: {self.src} -> {self.dst}{taken} [{kind}]"


def modules() -> Dict[str, Path]:
    """Module name -> source file, every .py under sinklab/."""
    out = {}
    for p in sorted(PKG.rglob("*.py")):
        parts = p.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = p
    return out


def module_path(name: str) -> Path:
    return modules().get(name, PKG / "_core")


def floor_of(name: str) -> int:
    """Index of the floor whose longest prefix matches ``name``."""
    best, best_len = None, -1
    for i, (_, prefixes) in enumerate(FLOORS):
        for pre in prefixes:
            if (name == pre or name.startswith(pre + ".")) and len(pre) > best_len:
                best, best_len = i, len(pre)
    if best is None:
        raise KeyError(f"{name} is on no floor: add it to FLOORS in tests/test_architecture.py")
    return best


def _is_package(name: str, mods: Dict[str, Path]) -> bool:
    return mods[name].name == "__init__.py"


def _lazy_table(mods: Dict[str, Path]) -> Dict[str, str]:
    """sinklab/__init__'s names -> the module they come from: its ``_LAZY`` dict (relative
    module names) and its top-level ``from .x import names``."""
    tree = ast.parse(mods["sinklab"].read_text(encoding="utf-8"))
    out: Dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            for a in node.names:
                out[a.asname or a.name] = f"sinklab.{node.module}"
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
        if isinstance(target, ast.Name) and target.id == "_LAZY" and node.value is not None:
            for k, v in ast.literal_eval(node.value).items():
                out[k] = f"sinklab.{v}"
    return out


def _imports(tree: ast.AST) -> Iterator[Tuple[ast.stmt, bool]]:
    """Every import statement and whether it sits inside a function (or lambda/class body
    within one)."""
    def walk(node: ast.AST, in_fn: bool) -> Iterator[Tuple[ast.stmt, bool]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, in_fn
            yield from walk(child, in_fn or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))
    yield from walk(tree, False)


def _resolve_from(src: str, node: ast.ImportFrom, mods: Dict[str, Path]) -> Optional[str]:
    """The absolute module a ``from`` import reads from (None outside sinklab)."""
    if node.level == 0:
        base = node.module or ""
    else:
        parts = src.split(".") if _is_package(src, mods) else src.split(".")[:-1]
        parts = parts[:len(parts) - (node.level - 1)]
        base = ".".join(parts + ([node.module] if node.module else []))
    return base if base == "sinklab" or base.startswith("sinklab.") else None


def edges() -> List[Edge]:
    """Every import of a sinklab module by a sinklab module (see the module docstring)."""
    mods = modules()
    known = set(mods) | {CORE}
    lazy = _lazy_table(mods)
    out: List[Edge] = []
    for src, path in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node, in_fn in _imports(tree):
            targets: List[Tuple[str, Tuple[str, ...]]] = []
            if isinstance(node, ast.Import):
                targets = [(a.name, ()) for a in node.names if a.name.split(".")[0] == "sinklab"]
            else:
                base = _resolve_from(src, node, mods)
                if base is None:
                    continue
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    if sub in known:
                        targets.append((sub, ()))
                    elif base == "sinklab" and a.name in lazy:
                        targets.append((lazy[a.name], (a.name,)))
                    else:
                        targets.append((base, (a.name,)))
            for dst, names in targets:
                if dst not in known:
                    raise AssertionError(f"{path}:{node.lineno}: import of unknown module {dst}")
                out.append(Edge(src, dst, node.lineno, in_fn, names))
                # running dst also runs the __init__ of each package above it (not the root's,
                # nor those of the importer's own packages, already running)
                parts = dst.split(".")
                for k in range(2, len(parts)):
                    pkg = ".".join(parts[:k])
                    if pkg in mods and not (src == pkg or src.startswith(pkg + ".")):
                        out.append(Edge(src, pkg, node.lineno, in_fn, (), implied=True))
    # one edge per (src, dst, line, kind)
    return sorted(set(out), key=lambda e: (e.src, e.line, e.dst))


def _graph(es: List[Edge]) -> Dict[str, Set[str]]:
    g: Dict[str, Set[str]] = {}
    for e in es:
        if e.src != e.dst:
            g.setdefault(e.src, set()).add(e.dst)
            g.setdefault(e.dst, set())
    return g


def cycles(es: List[Edge]) -> List[List[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    g = _graph(es)
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on: Set[str] = set()
    out: List[List[str]] = []
    counter = [0]

    def visit(v: str) -> None:  # recursion depth <= number of modules (~130)
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def cycle_violations(es: List[Edge]) -> List[str]:
    out = []
    for comp in cycles(es):
        inside = set(comp)
        out.append("cycle among " + ", ".join(comp) + ":\n    "
                   + "\n    ".join(e.where() for e in es if e.src in inside and e.dst in inside and e.src != e.dst))
    return out


def upward_violations(es: List[Edge]) -> List[str]:
    return [f"{e.where()}: floor {FLOORS[floor_of(e.src)][0]} imports floor {FLOORS[floor_of(e.dst)][0]}"
            for e in es if not e.implied and floor_of(e.dst) > floor_of(e.src)]


def core_violations(es: List[Edge]) -> List[str]:
    return [e.where() for e in es if not e.implied and e.dst == CORE and e.src not in CORE_DOORS]


def private_violations(es: List[Edge]) -> List[str]:
    return [e.where() for e in es if e.src != e.dst and any(n.startswith("_") and not n.startswith("__")
                                                            for n in e.names)]


def drawing_modules(es: List[Edge]) -> Set[str]:
    """viz modules that load matplotlib: viz.figure and those that import it, at top level."""
    out = {FIGURE_BASE}
    grew = True
    while grew:
        grew = False
        for e in es:
            if not e.in_function and e.dst in out and e.src.startswith("sinklab.viz") and e.src not in out:
                out.add(e.src)
                grew = True
    return out


def function_import_violations(es: List[Edge]) -> List[str]:
    out = []
    drawing = drawing_modules(es)
    for e in es:
        if not e.in_function or e.implied or e.dst in drawing:
            continue
        allowed = DEFERRED.get(e.src, ())
        if any(e.dst == a or e.dst.startswith(a + ".") for a in allowed):
            continue
        out.append(e.where())
    return out


def _fail_with(violations: List[str], what: str) -> None:
    assert not violations, f"{len(violations)} {what}:\n" + "\n".join(violations)


# ------------------------------------------------------------------ tests
def test_every_module_is_on_a_floor():
    for name in modules():
        floor_of(name)


def test_graph_sees_known_edges():
    """The reader finds the imports it must (so an empty violation list means something)."""
    es = {(e.src, e.dst, e.in_function) for e in edges()}
    assert ("sinklab.runtime", CORE, False) in es
    assert ("sinklab.model", "sinklab.system", False) in es
    assert ("sinklab.sweeps.store", "sinklab.system", False) in es
    assert ("sinklab.cli", "sinklab.report", True) in es  # a deferred subcommand import
    drawing = drawing_modules(edges())
    assert {"sinklab.viz.figure", "sinklab.viz.figures_training", "sinklab.viz.plots"} <= drawing
    assert "sinklab.viz.reference" not in drawing


def test_the_sweep_and_training_modules_load_no_matplotlib():
    """A sweep's Dask worker imports sweeps.runner (and through it the analyses and the trainer):
    matplotlib (about 1 s) only loads when a figure is drawn."""
    code = ("import sys, sinklab.sweeps.runner, sinklab.train.run, sinklab.train.experiments\n"
            "print('matplotlib' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_a_no_import_cycle():
    _fail_with(cycle_violations(edges()), "import cycle(s) (top-level and function-level imports)")


def test_b_no_upward_import():
    _fail_with(upward_violations(edges()), "upward import(s)")


def test_c_core_only_through_its_doors():
    _fail_with(core_violations(edges()), f"import(s) of _core outside {sorted(CORE_DOORS)}")


def test_d_no_private_name_across_modules():
    _fail_with(private_violations(edges()), "private name(s) imported from another sinklab module")


def test_e_function_level_imports_are_third_party_only():
    _fail_with(function_import_violations(edges()), "import(s) of sinklab modules inside functions")


def test_sweeps_store_does_not_reach_into_training():
    dst = {e.dst for e in edges() if e.src == "sinklab.sweeps.store"}
    assert not any(d == "sinklab.train" or d.startswith("sinklab.train.") for d in dst), dst


def test_import_sinklab_loads_only_the_runtime():
    """``import sinklab`` loads the C core and its runtime, nothing of the floors above, and no
    Dask, pandas or matplotlib; a lazy export then loads its module, and a subpackage or module
    named as an attribute is imported then."""
    code = ("import sys, sinklab\n"
            "print(sorted(m for m in sys.modules if m.startswith('sinklab')))\n"
            "heavy = ('dask', 'distributed', 'pandas', 'matplotlib', 'torch', 'tqdm')\n"
            "print([m for m in sys.modules if m.split('.')[0] in heavy])\n"
            "sinklab.sink_rate\n"
            "print('sinklab.analysis.sinks' in sys.modules, 'sinklab.sweeps' in sys.modules)\n"
            "print(sorted(sinklab.io.registry.MODELS) != [], sinklab.inputs.__name__)\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSTARTUP"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    loaded, heavy, after, subpackages = out.stdout.strip().splitlines()
    assert loaded == str(["sinklab", "sinklab._core", "sinklab.runtime"])
    assert heavy == "[]"
    assert after == "True False"
    assert subpackages == "True sinklab.inputs"  # sl.io.registry, sl.inputs: imported when named


def test_every_public_name_resolves_and_is_listed():
    import sinklab

    for name in sinklab.__all__:
        assert getattr(sinklab, name) is not None, name
    assert set(sinklab.__all__) <= set(dir(sinklab))
    assert sinklab.load.__module__ == "sinklab.model" and sinklab.sweep.__module__ == "sinklab.sweeps.runner"
    try:
        sinklab.no_such_name
    except AttributeError as e:
        assert "no_such_name" in str(e)
    else:
        raise AssertionError("sinklab.no_such_name did not raise AttributeError")


def test_figure_sink_tokens_match_the_training_evaluation():
    """The training figures keep their own copy of the sink metric's T (viz imports no training
    code); it must be the trainer's."""
    from sinklab.train.evaluate import SINK_TOKENS
    from sinklab.viz import reference

    assert reference.SINK_TOKENS == SINK_TOKENS


def test_controls_figure_legend_names_every_class_of_the_analysis():
    """The controls figure's legend (viz) covers the analysis' top-key classes, same labels."""
    from sinklab.analysis.controls import CLASS_KEYS, CLASSES
    from sinklab.viz.figures_sinks import TOP_KEY_CLASSES

    assert TOP_KEY_CLASSES == dict(zip(CLASS_KEYS, CLASSES))


# ------------------------------------------------------------------ python tests/test_architecture.py
def main(argv: List[str]) -> int:
    es = edges()
    if "--dot" in argv:
        print("digraph sinklab {\n  rankdir=BT;")
        for e in sorted({(e.src, e.dst, e.in_function) for e in es if e.src != e.dst}):
            print(f'  "{e[0]}" -> "{e[1]}"' + (" [style=dashed];" if e[2] else ";"))
        print("}")
        return 0
    by_floor: Dict[int, List[str]] = {}
    for name in sorted(set(modules()) | {CORE}):
        by_floor.setdefault(floor_of(name), []).append(name)
    for i, (label, _) in enumerate(FLOORS):
        print(f"floor {i} {label}: {' '.join(by_floor.get(i, []))}")
    print("\nedges (src -> dst; * = inside a function):")
    seen = sorted({(e.src, e.dst, e.in_function) for e in es if e.src != e.dst})
    for src, dst, fn in seen:
        print(f"  {src} -> {dst}{' *' if fn else ''}")
    bad = 0
    for title, found in (("(a) cycles", cycle_violations(es)), ("(b) upward", upward_violations(es)),
                         ("(c) _core outside its doors", core_violations(es)),
                         ("(d) private names", private_violations(es)),
                         ("(e) package imports inside functions", function_import_violations(es))):
        print(f"\n{title}: {len(found)}")
        for v in found:
            print("  " + v.replace("\n", "\n  "))
        bad += len(found)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
