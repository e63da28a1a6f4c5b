"""The analyses of "Why do LLMs attend to the first token?", each on captured tensors only:

- ``sinks``: Gu et al.'s first-token importance and sink rate (used throughout; Table 1's metric)
- ``sinkset``: sink studies over prompt sets, with and without ⟨bos⟩ (Table 1, Table 2's inference rows)
- ``perturbation``: a one-word swap spreading with and without ⟨bos⟩ (Fig. 2–3)
- ``collapse``: rank and representational collapse, Prop. 3.1 checked per layer
- ``noop``: sinks as approximate no-ops, conditional ("apostrophe") heads
- ``quality``: perplexity and passkey with and without ⟨bos⟩ (stand-ins for the ⟨bos⟩-removal benchmarks)

Beyond the paper:

- ``massive``: massive activations (Sun et al., 2024) per residual stream, the ⟨bos⟩ norm jump and the block and MLP neurons that write it
- ``key_geometry``: the sink key's norm vs angle, an exact split of the sink's mean logit gap per head
- ``windowed``: StreamingLLM-style sliding-window perplexity with and without the first k tokens kept visible
- ``head_ablation``: the top sink heads switched off against matched random non-sink heads of the same layers
- ``patching_experiment``: activation patching (denoising) from a clean into a corrupted prompt per (layer, position) or (layer, head), the recovered logit difference with intervals over pairs
"""
