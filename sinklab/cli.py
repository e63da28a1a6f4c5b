"""Command line: ``sinklab sinks MODEL`` measures the first-token attention sink;
``sinklab reproduce`` runs the report's analyses and writes it.

``sinklab train CONFIG.json`` trains a small LLaMA-style model from scratch (resuming from the
run folder's latest checkpoint); ``sinklab train --example`` prints a config. An invalid config
exits with status 2. ``sinklab experiment fig5|table2 [--profile quick|cpu|full]`` runs the
paper's Fig. 5 or Table 2 in miniature (every run resumable, shared runs trained once).

``sinklab reproduce --families`` runs the cross-family study (Table 1 across the registered
models, ⟨bos⟩ removal on Gemma-3-270M and Qwen2.5-0.5B) instead of one model's report;
``sinklab reproduce --beyond`` the analyses beyond the paper on three models side by side.

Global options (``--threads``, ``--quiet``, ``--debug``) go before or after the subcommand.
Errors a user can fix (a missing path, a corrupt model file, prompts too short for
``--max-tokens``) print one line ``sinklab: error: ...`` to stderr and exit with status 1;
Ctrl-C prints ``sinklab: interrupted`` (for ``train`` and ``sweep`` with where the work stands
and how a rerun resumes it) and exits with status 130;
a model file of an architecture sinklab does not support exits with status 2 (as a usage
error), its line naming the architecture and the supported ones. ``--debug`` shows the
traceback instead.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Callable, List, Optional, Sequence

import sinklab as sl
from .families import UnsupportedArchitecture
from .io import registry
from .prompts import load_passages
from .results import save_json, to_jsonable
from .runtime import Terminated, __version__, sigterm_as_interrupt

# Each subcommand imports its own top-floor module (viz and matplotlib, report, train, sweeps)
# when it runs, so `sinklab --help` or a typo answers without loading all of them.

DEFAULT_EPS = (0.3, 0.8)  # Gu et al.'s threshold and the one of the paper's Table 1


class CLIError(Exception):
    """A problem with what the user asked for, reported as one line without a traceback;
    ``code``: the exit status (1, or 2 for an unsupported architecture)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def _load(name: str, quiet: bool, precision: str = "fp32"):
    """sinklab.load, with the loaders' "unsupported architecture ..." ValueError (it names the
    architecture and the supported list) turned into a CLIError of exit status 2."""
    try:
        return sl.load(name, quiet=quiet, precision=precision)
    except ValueError as e:
        _raise_if_unsupported(name, e)
        raise


def _raise_if_unsupported(name: str, e: ValueError) -> None:
    """CLIError (status 2) when ``e`` is the loaders' unsupported-architecture error."""
    if isinstance(e, UnsupportedArchitecture):
        raise CLIError(f"{name}: {e}", code=2) from e


def _read_prompts(args) -> List[str]:
    if args.prompt:
        return list(args.prompt)
    if args.file:
        with open(args.file, encoding="utf-8") as f:
            prompts = [line.strip() for line in f if line.strip()]
        if not prompts:
            raise CLIError(f"{args.file} holds no prompts (one per line)")
        return prompts
    return load_passages("sinks")


def _check_model_arg(name: str) -> None:
    """CLIError unless ``name`` is an existing path or a registered model name."""
    if not os.path.exists(name) and not registry.is_registered(name):
        raise CLIError(f"{name!r} is neither a file, a folder, nor a registered model name "
                       f"({', '.join(sorted(registry.MODELS))})")


def cmd_sinks(args) -> int:
    """Sink rate of the first token over prompts of exactly ``--max-tokens`` tokens (Gu et al.)."""
    from sinklab.viz.plots import importance_heatmap

    _check_model_arg(args.model)
    prompts = _read_prompts(args)
    model = _load(args.model, args.quiet, args.precision)
    c = model.config
    bos = not args.no_bos
    if bos and c.bos_token_id is None:
        raise CLIError(f"{model.name} has no BOS token; use --no-bos")
    T = args.max_tokens
    eps_all = tuple(sorted({args.eps, *DEFAULT_EPS}))
    try:
        # Gu et al.'s rule: every prompt is cut to exactly its first T tokens (the BOS among
        # them), shorter prompts are dropped, so a_0 always averages over T queries.
        study = sl.sink_study(model, prompts, T=T, eps=eps_all, bos=bos, skip_short=True, bos_in_T=True,
                              capture="stats", progress=not args.quiet)
    except ValueError as e:
        raise CLIError(f"--max-tokens {T}: {e}") from e
    n_given, dropped = len(prompts), study.n_skipped
    mean_imp = study.mean  # (L, H)
    per_layer = study.layer_sink_rate(args.eps)

    out_dir = args.out if args.out is not None or args.json else "sinks-out"
    digest, manifest = registry.sha256_manifest(model.source)
    result = {"model": model.name, "source": model.source, "sha256": digest, "sha256_manifest": manifest,
              "bos_token_id": c.bos_token_id if bos else None, "eps": args.eps, "max_tokens": T, "T": T,
              "bos_in_T": True, "n_prompts_given": n_given, "n_prompts": study.n_prompts, "n_dropped": dropped,
              "kept_prompts": study.meta["kept_prompts"], "prompt_tokens": [T] * study.n_prompts,
              "sink_rate": {f"{e:g}": study.sink_rate(e) for e in eps_all},
              "first_token_importance_mean": mean_imp.tolist(), "precision": args.precision,
              "sinklab_version": sl.__version__}
    if out_dir is not None:
        os.makedirs(out_dir, exist_ok=True)
        fig = importance_heatmap(mean_imp, eps=args.eps, title=f"{model.name}: first-token importance "
                                                              f"({'with' if bos else 'no'} BOS, T={T})")
        png = os.path.join(out_dir, "sinks_heatmap.png")
        fig.savefig(png, dpi=130)
        save_json(os.path.join(out_dir, "sinks.json"), result)
    if args.json:
        json.dump(to_jsonable(result), sys.stdout)
        sys.stdout.write("\n")
        return 0
    print(f"model: {model.name} ({c.family}, {c.n_layers} layers x {c.n_heads} heads"
          f"{', bidirectional encoder: a0 averages over all queries' if c.bidirectional else ''}"
          f"{'' if args.precision == 'fp32' else ', weight products in ' + args.precision})")
    print(f"prompts: {study.n_prompts} of {n_given}, each cut to exactly {T} tokens, "
          f"BOS: {'%r (id %d) prepended (counted in the %d)' % (model.token_text(c.bos_token_id), c.bos_token_id, T) if bos else 'none'}")
    if dropped:
        print(f"dropped {dropped} of {n_given} prompts shorter than {T} tokens "
              f"(lower --max-tokens to keep them)")
    for eps in eps_all:
        print(f"sink rate (first token, eps={eps:g}): {100 * study.sink_rate(eps):.2f}%")
    print(f"\n{'layer':>5}  {'mean a0':>8}  {'max a0':>7}  sink heads (eps={args.eps:g})")
    for l in range(c.n_layers):
        print(f"{l:>5}  {mean_imp[l].mean():8.3f}  {mean_imp[l].max():7.3f}  {100 * per_layer[l]:6.1f}%")
    print(f"\nwrote {os.path.join(out_dir, 'sinks_heatmap.png')} and {os.path.join(out_dir, 'sinks.json')}")
    return 0


def cmd_models(args) -> int:
    """The registered models: name, size, licence, whether each is in the cache, what it is."""
    models = [{"name": m.name, "size_bytes": m.size, "licence": m.licence, "cache": registry.cache_state(m.name),
               "description": m.description} for m in registry.MODELS.values()]
    if args.json:
        json.dump(models, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    rows = [("name", "size", "licence", "cache")] + [
        (m["name"], f"{m['size_bytes'] / 1e6:,.0f} MB" if m["size_bytes"] else "?", m["licence"] or "?", m["cache"])
        for m in models]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r, what in zip(rows, ["what it is"] + [m["description"] for m in models]):
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + what)
    print(f"\ncache: {registry.cache_dir()} (SINKLAB_HOME); `sinklab sinks NAME` or sl.load(NAME) fetches a model "
          f"once, verified by sha256")
    return 0


def cmd_reproduce(args) -> int:
    from sinklab import report

    if args.beyond:
        return _reproduce_beyond(args)
    if args.families:
        if args.model is not None or tuple(args.eps) != DEFAULT_EPS:
            raise CLIError("--families runs its own models, with and without BOS, at eps 0.3 and 0.8: "
                           "drop --model and --eps")
        if args.training_profile is not None or args.training_root is not None:
            raise CLIError("--families trains nothing: drop --training-profile and --training-root")
        if args.precision != "fp32":
            raise CLIError("--families runs in fp32 only: drop --precision")
        out = args.out or "sinklab-families"
        res = report.reproduce_families(out, quick=args.quick, progress=not args.quiet)
        print(f"wrote {os.path.join(out, 'families.md')} and families.json "
              f"({res['meta']['seconds_total']:.0f} s)")
        return 0
    models = tuple(args.model) if args.model else report.DEFAULT_MODELS
    out = args.out or "sinklab-report"
    for m in models:
        _check_model_arg(m)
    # the pre-training section's options and the precision, passed only when given (reproduce() has the defaults)
    options = {k: v for k, v in (("training_profile", args.training_profile),
                                 ("training_root", args.training_root)) if v is not None}
    if args.precision != "fp32":
        options["precision"] = args.precision
    try:
        res = report.reproduce(models, out=out, quick=args.quick, progress=not args.quiet,
                               eps=tuple(args.eps), **options)
    except ValueError as e:
        for m in models:
            _raise_if_unsupported(m, e)
        raise
    secs = (res or {}).get("meta", {}).get("seconds_total")
    print(f"wrote {os.path.join(out, 'report.md')} and results.json"
          + (f" ({secs:.0f} s)" if secs is not None else ""))
    return 0


def _reproduce_beyond(args) -> int:
    from sinklab.report import beyond

    if args.families:
        raise CLIError("--beyond and --families are two reports: run them one at a time")
    if tuple(args.eps) != DEFAULT_EPS or args.precision != "fp32":
        raise CLIError("--beyond sets its own thresholds and runs in fp32: drop --eps and --precision")
    if args.training_profile is not None or args.training_root is not None:
        raise CLIError("--beyond trains nothing: drop --training-profile and --training-root")
    models = tuple(args.model) if args.model else beyond.BEYOND_MODELS
    for m in models:
        _check_model_arg(m)
    out = args.out or "sinklab-beyond"
    res = beyond.reproduce_beyond(models, out=out, quick=args.quick, progress=not args.quiet)
    print(f"wrote {os.path.join(out, 'beyond.md')} and beyond.json ({res['meta']['seconds_total']:.0f} s)")
    return 0


def _example_or_file(args, example_text: Callable[[], str], path: Optional[str], what: str, noun: str) -> bool:
    """True when ``--example`` printed the example (the command is done); otherwise checks that
    ``path`` (the command's ``what``, e.g. ``CONFIG.json``) names a file."""
    if args.example:
        sys.stdout.write(example_text())
        return True
    if path is None:
        raise CLIError(f"give a {what} (`sinklab {args.command} --example` prints one)", code=2)
    if not os.path.isfile(path):
        raise CLIError(f"{path}: no such {noun} file", code=2)
    return False


def cmd_train(args) -> int:
    """Trains a LLaMA-style model from scratch by a JSON config (sinklab.train.run)."""
    from sinklab.train.run import ConfigError, example_config, load_config, train

    if _example_or_file(args, example_config, args.config, "CONFIG.json", "config"):
        return 0
    try:
        config = load_config(args.config)
        if args.out:
            config.out_dir = args.out
        if args.threads:
            config.threads = args.threads
        res = train(config.validate(), resume=not args.no_resume, progress=not args.quiet)
    except ConfigError as e:
        raise CLIError(str(e), code=2) from e
    last = res.log[-1] if res.log else {}
    print(f"{res.steps} steps, {res.tokens:,} tokens"
          + (f" (resumed at step {res.resumed_from})" if res.resumed_from is not None else ""))
    if last.get("val_loss_bos") is not None:
        print(f"val loss: {last['val_loss_bos']:.4f} with <bos>, {last['val_loss_text']:.4f} text only; "
              f"sink rate (eps 0.3/0.8): {100 * last['sink_bos_0.3']:.2f}%/{100 * last['sink_bos_0.8']:.2f}% "
              f"with <bos>, {100 * last['sink_text_0.3']:.2f}%/{100 * last['sink_text_0.8']:.2f}% text only")
    print(f"wrote {os.path.join(res.out_dir, 'log.jsonl')}; checkpoint {res.checkpoint}")
    return 0


def cmd_experiment(args) -> int:
    """Runs (or resumes) the Fig. 5 or Table 2 miniature (sinklab.train.experiments), the depth
    sweep at matched parameters (sinklab.train.depth) or the attention variants with seeds
    (sinklab.train.variants)."""
    from sinklab.train.campaign import run_campaign
    from sinklab.train.depth import run_depth
    from sinklab.train.experiments import run_experiment
    from sinklab.train.variants import run_variants

    if args.name == "all":
        res = run_campaign(args.profile, root=args.root, out=args.out, progress=not args.quiet, threads=args.threads,
                           seeds=args.seeds, adopt=args.adopt, records_dir=args.records, jobs=args.jobs,
                           train_missing=not args.no_train)
        print(f"{res['finished']} of {res['runs']} distinct runs have finished")
        for name, summary in res["summaries"].items():
            print(f"\n## {name} ({summary['figure']})\n\n{summary['reading']}")
        for name in res["not_started"]:
            print(f"\n## {name}: none of its runs has finished")
        return 0
    if args.name in ("depth", "variants"):
        run = run_depth if args.name == "depth" else run_variants
        res = run(args.profile, root=args.root, out=args.out, progress=not args.quiet, threads=args.threads,
                  seeds=args.seeds, adopt=args.adopt, records_dir=args.records, jobs=args.jobs,
                  train_missing=not args.no_train)
        print(res["markdown"])
        print(f"wrote {res['figure']}")
        print()
        print(res["reading"])
        return 0
    res = run_experiment(args.name, args.profile, root=args.root, out=args.out, progress=not args.quiet,
                         threads=args.threads, seeds=args.seeds, adopt=args.adopt, records_dir=args.records,
                         jobs=args.jobs, train_missing=not args.no_train)
    if args.name == "table2":
        print(res["markdown"])
        print()
        print(res["differences_markdown"])
    else:
        for run in res["runs"]:
            n = len(run.get("seeds") or res["seeds"])    # a partial campaign's contexts differ
            sd = lambda k: ("" if run["sd"][k][-1] is None else  # noqa: E731
                            f" ± {100 * run['sd'][k][-1]:.2f}" if "sink" in k else f" ± {run['sd'][k][-1]:.4f}")
            print(f"C = {run['context']}: sink rate {100 * run['sink_0.3'][-1]:.2f}{sd('sink_0.3')}% (eps 0.3), "
                  f"{100 * run['sink_0.8'][-1]:.2f}{sd('sink_0.8')}% (eps 0.8), val loss {run['val_loss'][-1]:.4f}"
                  f"{sd('val_loss')} after {run['tokens'][-1]:,} tokens "
                  f"({'one seed' if n == 1 else f'mean ± sd over {n} seeds'})")
    print(f"wrote {res['figure']}")
    print()
    print(res["reading"])
    return 0


def cmd_sweep(args) -> int:
    """Runs a grid of analyses as Dask tasks (sinklab.sweeps); exit 1 if any task failed."""
    from sinklab.sweeps import SpecError, sweep
    from sinklab.sweeps.grid import EXAMPLE_SPEC

    if _example_or_file(args, lambda: EXAMPLE_SPEC, args.spec, "SPEC.toml or SPEC.json", "spec"):
        return 0
    try:
        res = sweep(args.spec, out=args.out, scheduler=args.scheduler, workers=args.workers,
                    threads=args.threads, serial=args.serial, progress=not args.quiet)
    except SpecError as e:
        raise CLIError(str(e), code=2) from e
    for f in res.figures:
        print(f"wrote {f}")
    return 1 if res.failed else 0


def _global_options(p: argparse.ArgumentParser, defaults: bool) -> None:
    """--threads/--quiet/--debug on the main parser (``defaults``) and on each subcommand
    (default SUPPRESS, so a value given before the subcommand is not reset after it)."""
    d = (lambda v: v) if defaults else (lambda v: argparse.SUPPRESS)
    p.add_argument("--threads", type=int, default=d(None), help="OpenMP threads (default: all cores)")
    p.add_argument("--quiet", action="store_true", default=d(False), help="no progress bars")
    p.add_argument("--debug", action="store_true", default=d(False), help="show tracebacks on errors")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sinklab", description="Attention sinks in transformer language models.")
    p.add_argument("--version", action="version", version=f"sinklab {__version__}")
    _global_options(p, defaults=True)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("sinks", help="sink rate and per-layer first-token importance of a model")
    s.add_argument("model", help="registered name (smollm2-135m-instruct), .gguf file, or Hugging Face folder")
    g = s.add_mutually_exclusive_group()
    g.add_argument("--prompt", action="append", help="a prompt (repeatable); default: the 144 shipped passages")
    g.add_argument("--file", help="a text file with one prompt per line")
    s.add_argument("--eps", type=float, default=0.3,
                   help="sink threshold on first-token importance (default 0.3; 0.3 and 0.8 are always reported)")
    s.add_argument("--max-tokens", type=int, default=64,
                   help="T: every prompt is cut to exactly its first T tokens, BOS included, and shorter "
                        "prompts are dropped (default 64, as Gu et al.)")
    s.add_argument("--no-bos", action="store_true", help="do not prepend the BOS token")
    s.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "int8"),
                   help="the forward's weight products: fp32 (exact, the default), bf16 or int8 (faster; the "
                        "documentation's docs/guides/precision.md says what each costs)")
    s.add_argument("--out", default=None,
                   help="output folder for the heatmap and sinks.json (default sinks-out; with --json, nothing is "
                        "written unless --out is given)")
    s.add_argument("--json", action="store_true",
                   help="print the result as JSON on stdout (what sinks.json holds) instead of the table")
    _global_options(s, defaults=False)
    s.set_defaults(func=cmd_sinks)
    mo = sub.add_parser("models", help="the registered models: size, licence, whether each is cached")
    mo.add_argument("--json", action="store_true", help="print the list as JSON on stdout")
    _global_options(mo, defaults=False)
    mo.set_defaults(func=cmd_models)
    r = sub.add_parser("reproduce", help="run the report's analyses (Markdown, PNG, JSON)")
    r.add_argument("--model", action="append", default=None,
                   help="registered name, .gguf file or Hugging Face folder; repeat it for several. The first "
                        "model trained with a fixed BOS is the study model for the paper's BOS claims, the others "
                        "the contrast (default: gemma-3-270m and smollm2-135m-instruct)")
    r.add_argument("--families", action="store_true",
                   help="instead of one model's report: Table 1 across the registered models and BOS removal "
                        "on Gemma-3-270M and Qwen2.5-0.5B (families.md, families.json)")
    r.add_argument("--beyond", action="store_true",
                   help="instead of the paper's report: the analyses beyond the paper (massive activations, the sink "
                        "key's geometry, secondary sinks, sinks across documents, windowed attention with kept sinks, "
                        "sink-head ablation, activation patching) on Gemma-3-270M, SmolLM2-135M and Qwen2.5-0.5B side "
                        "by side, or the --model ones (beyond.md, beyond.json; resumable)")
    r.add_argument("--eps", type=float, nargs="+", default=list(DEFAULT_EPS),
                   help="sink thresholds in (0, 1) (default 0.3 0.8)")
    r.add_argument("--quick", action="store_true", help="small prompt sets and lengths")
    r.add_argument("--out", default=None,
                   help="output folder (default sinklab-report, sinklab-families with --families, "
                        "sinklab-beyond with --beyond)")
    r.add_argument("--training-profile", default=None, choices=("none", "quick", "cpu", "miniature", "full"),
                   help="the section on Fig. 5 and Table 2 in miniature (models trained here): none skips it, "
                        "quick runs the smoke-test profile into OUT/training (about 15 s), cpu, miniature or full run "
                        "or resume that profile under --training-root (about an hour on 2 cores / hours / overnight). "
                        "Default: quick with --quick, else the miniature or else the cpu profile's summaries under "
                        "--training-root when they exist (`sinklab experiment fig5|table2 --profile P` writes them), "
                        "else quick")
    r.add_argument("--training-root", default=None,
                   help="the runs' folder of `sinklab experiment` (default sinklab-experiments)")
    r.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "int8"),
                   help="the forward passes' weight products: fp32 (exact, the default), bf16 or int8 (faster); "
                        "the Jacobian sections run in fp32 whatever it is")
    _global_options(r, defaults=False)
    r.set_defaults(func=cmd_reproduce)
    t = sub.add_parser("train", help="train a small LLaMA-style model from scratch (JSON config; resumable)")
    t.add_argument("config", nargs="?", default=None, help="the run's JSON config (keys: sinklab train --example)")
    t.add_argument("--out", default=None, help="the run's folder (overrides the config's out_dir)")
    t.add_argument("--no-resume", action="store_true",
                   help="start at step 0, deleting the checkpoints and log already in the folder")
    t.add_argument("--example", action="store_true", help="print the default config and exit")
    _global_options(t, defaults=False)
    t.set_defaults(func=cmd_train)
    x = sub.add_parser("experiment", help="pre-training experiments in miniature: the paper's fig5 (context "
                                          "length) and table2 (packing and a fixed <bos>), and beyond it depth "
                                          "and attention variants; resumable")
    x.add_argument("name", choices=("fig5", "table2", "depth", "variants", "all"),
                   help="fig5: sink formation against the training context; table2: causal or intra-document "
                        "packing, with or without a fixed <bos>; depth: 2-12 layers at matched block parameters "
                        "(profiles quick and miniature); variants: sink-logit, softmax-plus-one and gated attention "
                        "beside softmax, Table 2's fixed-<bos> causal recipe; all: every run of the four as one "
                        "queue (shared runs once, Table 2 first), then each summary")
    x.add_argument("--profile", default="cpu", choices=("quick", "cpu", "cpu2x", "miniature", "miniature-xl", "full"),
                   help="run sizes: quick (seconds, a smoke test), cpu (under an hour on 2 cores, the default), "
                        "cpu2x (cpu, twice the tokens), miniature (the miniature search's setting: 8 heads, weight "
                        "decay 2, 14.3M tokens, ~35 min a run at 1 thread), miniature-xl (the same on the extended "
                        "corpus pd-english-xl: 0.77 epochs instead of 2.3), full (a larger model, 5x the tokens: "
                        "overnight)")
    x.add_argument("--adopt", action="append", default=[], metavar="DIR",
                   help="copy in finished runs with the same settings from DIR (a sweep's runs/ folder or another "
                        "root) instead of training them again; repeatable (default: none)")
    x.add_argument("--records", default=None, metavar="DIR",
                   help="a folder of run records (log and settings of each finished run, a few kB; commit it): "
                        "runs recorded there are not trained again, and every finished run is recorded there "
                        "(default: none)")
    x.add_argument("--no-train", action="store_true",
                   help="train nothing: summarize the runs already finished (or recorded), a partial experiment "
                        "whose summary and reading name the runs still missing")
    x.add_argument("--jobs", type=int, default=1,
                   help="runs trained at a time, each in its own process with its share of --threads (on 2 cores, "
                        "--jobs 2 trains 1.6x the runs per hour of one 2-thread run; the numbers are the same; "
                        "default 1)")
    x.add_argument("--root", default="sinklab-experiments", help="folder of the runs, shared by the experiments (default sinklab-experiments)")
    x.add_argument("--out", default=None, help="folder of the summary JSON, figure and table (default --root)")
    x.add_argument("--seeds", type=int, default=None,
                   help="training seeds per condition, 0..N-1 (default: the profile's, 3); seed 0's runs keep the "
                        "folders of before, finished runs are skipped")
    _global_options(x, defaults=False)
    x.set_defaults(func=cmd_experiment)
    w = sub.add_parser("sweep", help="run analyses over a grid (models x prompts x eps x <bos> x interventions x T "
                                     "x training runs) as Dask tasks; resumable, results in one Parquet table")
    w.add_argument("spec", nargs="?", default=None, help="the grid: a TOML or JSON file (sinklab sweep --example)")
    w.add_argument("--out", default=None, help="results folder (default: the spec's out, else sweep-results)")
    w.add_argument("--scheduler", default=None,
                   help="address of a running Dask scheduler (tcp://host:8786) or a scheduler file; "
                        "default: a LocalCluster on this machine")
    w.add_argument("--workers", type=int, default=None,
                   help="LocalCluster worker processes (default: as many as the cores, the tasks, the grid's work and free memory permit); "
                        "--threads sets the OpenMP threads of each task")
    w.add_argument("--serial", action="store_true", help="run the tasks one by one in this process (no Dask)")
    w.add_argument("--example", action="store_true", help="print an example spec and exit")
    _global_options(w, defaults=False)
    w.set_defaults(func=cmd_sweep)
    return p


def _check_args(parser: argparse.ArgumentParser, args) -> None:
    eps = getattr(args, "eps", [])
    eps = eps if isinstance(eps, list) else [eps]
    for e in eps:
        if not 0 < e < 1:
            parser.error(f"--eps must lie in (0, 1), got {e:g}")
    if args.threads is not None and args.threads < 1:
        parser.error(f"--threads must be at least 1, got {args.threads}")
    if getattr(args, "max_tokens", 2) < 2:
        parser.error(f"--max-tokens must be at least 2, got {args.max_tokens}")


def _one_line(e: BaseException) -> str:
    """The exception's message as one line (its first), naming the type when it is not one a
    user is expected to fix."""
    msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
    lines = [ln.strip() for ln in str(msg).strip().splitlines() if ln.strip()]
    text = lines[0] if lines else type(e).__name__
    if len(lines) > 1:
        text += " (more with --debug)"
    if not isinstance(e, (CLIError, OSError, ValueError, KeyError, RuntimeError, MemoryError)):
        text = f"{type(e).__name__}: {text} (a bug? --debug shows the traceback)"
    return text


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _check_args(parser, args)
    try:
        if args.threads:
            sl.set_num_threads(args.threads)
        with sigterm_as_interrupt():  # kill / scancel: checkpoints and records are kept as on Ctrl-C
            return args.func(args)
    except BrokenPipeError:  # stdout closed early (`sinklab sinks M | head`): not an error worth a line
        try:  # as the Python docs advise: keep the interpreter's final flush from failing again
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 1
    except KeyboardInterrupt as e:
        if args.debug:
            raise
        # train and sweep say where their work stands and how a rerun resumes it
        said = str(e.args[0]) if e.args and e.args[0] else ""
        print(f"sinklab: interrupted{': ' + said if said else ''}", file=sys.stderr)
        # 128 + the signal, as a shell reports a process that Ctrl-C (SIGINT) or kill (SIGTERM) ended
        return 143 if isinstance(e, Terminated) else 130
    except Exception as e:  # one line for the user; the traceback only with --debug
        if args.debug:
            raise
        print(f"sinklab: error: {_one_line(e)}", file=sys.stderr)
        return e.code if isinstance(e, CLIError) else 1


if __name__ == "__main__":
    sys.exit(main())
