"""Attention patterns with the tokens written on them: a static figure of chosen heads, and a
standalone interactive HTML page (hover a token: the page colours every token by the attention
that query pays it, for the layer and head chosen above; no server, no network, no library).

Both read a :class:`sinklab.Trace` captured with ``"attn"`` (one sequence) and its token texts
(:attr:`sinklab.Trace.tokens`).
"""
from __future__ import annotations

import html
import json
import os
from typing import Any, List, Optional, Sequence, Tuple, Union

import numpy as np

from .figure import Figure, colormap, restylable, subplots

MAX_VALUES = 4_000_000   # attention entries an HTML page embeds (about 30 MB of JSON)


def _pattern(trace: Any) -> Tuple[np.ndarray, List[str], List[int]]:
    """(L', H, T, T) attention of one sequence, its token texts, the captured layers."""
    if trace.attn is None:
        raise ValueError("this trace has no attention: run the model with capture='attn' (layers=[...] to limit it)")
    if trace.attn.ndim != 4:
        raise ValueError(f"one sequence at a time: the trace's attention has shape {trace.attn.shape}; index a batch "
                         f"row first")
    try:
        tokens = list(trace.tokens)
    except ValueError:
        tokens = [str(int(i)) for i in trace.ids]
    return trace.attn, tokens, list(trace.layers)


def _label(tok: str) -> str:
    """A token's text as a tick label: whitespace made visible, long pieces cut."""
    t = tok.replace("\n", "⏎").replace("\t", "⇥").replace(" ", "·")
    return t if len(t) <= 12 else t[:11] + "…"


@restylable
def attention_pattern_figure(trace: Any, heads: Sequence[Tuple[int, int]], title: Optional[str] = None) -> Figure:
    """One (query × key) heatmap per ``(layer, head)`` in ``heads``, its axes labelled with the
    tokens (whitespace shown as ·, newlines as ⏎), probabilities on a 0-1 colour scale.

    Args:
        trace: a Trace with ``attn`` of one sequence (``capture="attn"``).
        heads: (layer, head) pairs; the layers must be among the captured ones.
    """
    attn, tokens, layers = _pattern(trace)
    if not heads:
        raise ValueError("heads: give at least one (layer, head) pair")
    n = len(heads)
    cols = min(n, 3)
    rows = (n + cols - 1) // cols
    T = attn.shape[-1]
    side = 2.2 + 0.16 * T
    fig, axes = subplots(rows, cols, figsize=(cols * side, rows * side), layout="constrained", squeeze=False)
    labels = [_label(t) for t in tokens]
    im = None
    for ax, (layer, head) in zip(axes.ravel(), heads):
        if layer not in layers:
            raise ValueError(f"layer {layer} was not captured (captured: {layers}); run with layers=[...] including it")
        if not 0 <= head < attn.shape[1]:
            raise ValueError(f"head {head} outside 0..{attn.shape[1] - 1}")
        im = ax.imshow(attn[layers.index(layer), head], cmap=colormap("viridis"), vmin=0, vmax=1,
                       interpolation="nearest")
        ax.set_xticks(range(T), labels, rotation=90, fontsize=7)
        ax.set_yticks(range(T), labels, fontsize=7)
        ax.set_xlabel("key")
        ax.set_ylabel("query")
        ax.set_title(f"layer {layer}, head {head}", fontsize=9)
    for ax in axes.ravel()[n:]:
        ax.set_visible(False)
    assert im is not None                       # heads is not empty
    fig.colorbar(im, ax=axes.ravel()[:n].tolist(), shrink=0.8, label="attention probability")
    fig.suptitle(title or f"{trace.meta.get('model', '')}: attention patterns")
    return fig


def attention_html(trace: Any, path: Union[str, os.PathLike, None] = None, title: Optional[str] = None) -> str:
    """A standalone HTML page of the trace's attention: pick a layer and a head, hover a token
    (or tap it) to colour every key by the attention that query pays it; the query is outlined
    and the top keys listed. The page embeds its data and script (open it in any browser, send
    it, commit it). ``#layer=L&head=H&query=I`` in its address preselects a view.

    Args:
        trace: a Trace with ``attn`` of one sequence (``capture="attn"``; ``layers=[...]`` keeps
            the page small: it holds L'·H·T² numbers, at most 4 million).
        path: where to write the page (``.html``); None only returns it.

    Returns:
        The HTML text.
    """
    attn, tokens, layers = _pattern(trace)
    if attn.size > MAX_VALUES:
        raise ValueError(f"{attn.size:,} attention entries are too many for one page (at most {MAX_VALUES:,}): "
                         f"capture fewer layers (layers=[...]) or a shorter sequence")
    data = {"tokens": tokens, "layers": layers, "heads": int(attn.shape[1]),
            "attn": np.round(attn.astype(np.float64), 4).tolist()}
    name = title or f"{trace.meta.get('model', 'sinklab')}: attention"
    page = _PAGE.replace("__TITLE__", html.escape(name)).replace("__DATA__", json.dumps(data).replace("</", "<\\/"))
    if path is not None:
        with open(path, "w", encoding="utf-8") as f:
            f.write(page)
    return page


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>__TITLE__</title>
<style>
body { font: 15px/1.9 system-ui, sans-serif; margin: 1.5em; max-width: 60em; }
.tok { padding: 1px 2px; margin: 0 1px; border-radius: 3px; cursor: pointer; white-space: pre; }
.tok.query { outline: 2px solid #c0392b; }
#info { font-size: 13px; color: #444; min-height: 3em; }
select { font-size: 14px; }
</style></head>
<body>
<h3>__TITLE__</h3>
<p>layer <select id="layer"></select> head <select id="head"></select>
 &nbsp;hover a token: each token is shaded by the attention that query pays it (darker = more).</p>
<div id="text"></div>
<p id="info"></p>
<script id="data" type="application/json">__DATA__</script>
<script>
"use strict";
const D = JSON.parse(document.getElementById("data").textContent);
const layerSel = document.getElementById("layer"), headSel = document.getElementById("head");
const text = document.getElementById("text"), info = document.getElementById("info");
D.layers.forEach((l, i) => layerSel.add(new Option(String(l), String(i))));
for (let h = 0; h < D.heads; h++) headSel.add(new Option(String(h), String(h)));
const spans = D.tokens.map((t, i) => {
  const s = document.createElement("span");
  s.className = "tok"; s.dataset.i = i;
  s.textContent = t.replace(/\\n/g, "\\u23ce");
  s.addEventListener("mouseenter", () => show(i));
  s.addEventListener("click", () => show(i));
  text.appendChild(s);
  return s;
});
let query = D.tokens.length - 1;
function show(i) {
  query = i;
  const row = D.attn[Number(layerSel.value)][Number(headSel.value)][i];
  spans.forEach((s, k) => {
    s.dataset.a = row[k];
    s.style.backgroundColor = k <= i || row[k] > 0 ? "rgba(41, 98, 255, " + row[k] + ")" : "transparent";
    s.classList.toggle("query", k === i);
  });
  const top = row.map((a, k) => [a, k]).sort((x, y) => y[0] - x[0]).slice(0, 5);
  info.textContent = "layer " + D.layers[Number(layerSel.value)] + ", head " + headSel.value + ", query " + i +
    " (" + JSON.stringify(D.tokens[i]) + "): top keys " +
    top.map(([a, k]) => k + " " + JSON.stringify(D.tokens[k]) + " " + a.toFixed(3)).join(", ");
}
layerSel.onchange = headSel.onchange = () => show(query);
const want = new URLSearchParams(location.hash.slice(1));
if (want.has("layer")) { const j = D.layers.indexOf(Number(want.get("layer"))); if (j >= 0) layerSel.value = String(j); }
if (want.has("head")) headSel.value = want.get("head");
show(want.has("query") ? Number(want.get("query")) : query);
</script>
</body></html>
"""

__all__ = ["attention_pattern_figure", "attention_html"]
