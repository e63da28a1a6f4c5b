"""Figures, each a matplotlib Figure built without pyplot (:mod:`figure`): ``plots`` (heatmaps and
per-layer lines), ``figures_sinks`` (sink studies, passkey), ``figures_mixing`` (Fig. 2–3
perturbation, collapse, no-op heads), ``figures_beyond`` (massive activations, the per-head
sink map of the sink key's geometry, windowed perplexity, sink-head ablation), ``figures_patching``
(the activation-patching grid), ``attention_view`` (attention patterns with token labels, and a
standalone interactive HTML view). Every figure function takes ``ax=``/``fig=`` and ``cmap=``
(:func:`figure.restylable`)."""
