"""Command line: ``sinklab sinks MODEL`` measures the first-token attention sink;
``sinklab reproduce`` runs every analysis and writes a report."""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import List, Optional, Sequence

import numpy as np


def _read_prompts(args) -> List[str]:
    if args.prompt:
        return list(args.prompt)
    if args.file:
        with open(args.file, encoding="utf-8") as f:
            prompts = [line.strip() for line in f if line.strip()]
        if not prompts:
            raise SystemExit(f"sinklab: {args.file} holds no prompts (one per line)")
        return prompts
    from sinklab.prompts import load_passages

    return load_passages("sinks")


def cmd_sinks(args) -> int:
    import sinklab as sl
    from sinklab.plots import importance_heatmap
    from sinklab.registry import sha256_file

    from tqdm.auto import tqdm

    model = sl.load(args.model)
    c = model.config
    bos = not args.no_bos
    if bos and c.bos_token_id is None:
        raise SystemExit("sinklab: this model has no BOS token; use --no-bos")
    importances = []
    lengths = []
    for text in tqdm(_read_prompts(args), desc="prompts", unit="prompt", disable=args.quiet):
        ids = model.tokenize(text, bos=bos)[: args.max_tokens]
        lengths.append(len(ids))
        tr = model.run(ids, capture=("attn",))
        importances.append(sl.first_token_importance(tr.attn))
    imp = np.stack(importances)  # (P, L, H)
    rates = {eps: float(np.mean(imp > eps)) for eps in sorted({args.eps, 0.3, 0.8})}
    per_layer = (imp > args.eps).mean(axis=(0, 2))

    print(f"model: {model.name} ({c.n_layers} layers x {c.n_heads} heads)")
    print(f"prompts: {len(imp)}, tokens per prompt: {min(lengths)}-{max(lengths)} (cut to {args.max_tokens}), "
          f"BOS: {'id %d prepended' % c.bos_token_id if bos else 'none'}")
    for eps, r in rates.items():
        print(f"sink rate (first token, eps={eps:g}): {100 * r:.2f}%")
    print(f"\n{'layer':>5}  {'mean a0':>8}  {'max a0':>7}  sink heads (eps={args.eps:g})")
    mean_imp = imp.mean(axis=0)
    for l in range(c.n_layers):
        print(f"{l:>5}  {mean_imp[l].mean():8.3f}  {mean_imp[l].max():7.3f}  {100 * per_layer[l]:6.1f}%")

    os.makedirs(args.out, exist_ok=True)
    fig = importance_heatmap(mean_imp, eps=args.eps,
                             title=f"{model.name}: first-token importance ({'with' if bos else 'no'} BOS)")
    png = os.path.join(args.out, "sinks_heatmap.png")
    fig.savefig(png, dpi=130)
    result = {"model": model.name, "source": model.source, "sha256": sha256_file(model.source),
              "bos_token_id": c.bos_token_id if bos else None, "eps": args.eps, "max_tokens": args.max_tokens,
              "n_prompts": len(imp), "prompt_tokens": lengths, "sink_rate": {str(k): v for k, v in rates.items()},
              "first_token_importance_mean": mean_imp.tolist(), "sinklab_version": sl.__version__}
    with open(os.path.join(args.out, "sinks.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(f"\nwrote {png} and {os.path.join(args.out, 'sinks.json')}")
    return 0


def cmd_reproduce(args) -> int:
    from sinklab.report import reproduce

    res = reproduce(args.model, out=args.out, quick=args.quick, progress=not args.quiet)
    print(f"wrote {os.path.join(args.out, 'report.md')} and results.json "
          f"({res['meta']['seconds_total']:.0f} s)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sinklab", description="Attention sinks in transformer language models.")
    p.add_argument("--threads", type=int, default=None, help="OpenMP threads (default: all cores)")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("sinks", help="sink rate and per-layer first-token importance of a model")
    s.add_argument("model", help="registered name (smollm2-135m-instruct), .gguf file, or Hugging Face folder")
    g = s.add_mutually_exclusive_group()
    g.add_argument("--prompt", action="append", help="a prompt (repeatable); default: the 144 shipped passages")
    g.add_argument("--file", help="a text file with one prompt per line")
    s.add_argument("--eps", type=float, default=0.3, help="sink threshold on first-token importance (default 0.3)")
    s.add_argument("--max-tokens", type=int, default=64, help="cut prompts to their first T tokens (default 64, as Gu et al.)")
    s.add_argument("--no-bos", action="store_true", help="do not prepend the BOS token")
    s.add_argument("--out", default="sinks-out", help="output folder for the heatmap and JSON")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.set_defaults(func=cmd_sinks)
    r = sub.add_parser("reproduce", help="run every analysis of the paper and write a report (Markdown, PNG, JSON)")
    r.add_argument("--model", default="smollm2-135m-instruct", help="registered name, .gguf file or HF folder")
    r.add_argument("--quick", action="store_true", help="small prompt sets and lengths (a few minutes on 2 cores)")
    r.add_argument("--out", default="sinklab-report", help="output folder")
    r.add_argument("--quiet", action="store_true", help="no progress bars")
    r.set_defaults(func=cmd_reproduce)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "eps", None) is not None and not 0 < args.eps < 1:
        raise SystemExit(f"sinklab: --eps must lie in (0, 1), got {args.eps}")
    if args.threads:
        import sinklab as sl

        sl.set_num_threads(args.threads)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
