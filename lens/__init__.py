"""Lens packs: concept directions over one layer's hidden state, and `ahc lens train` to build them.

A pack is two files in one directory: `lens.safetensors` (float32 `directions` [n_concepts, hidden],
`biases` [n_concepts]) and `lens.json` (concept ids, names, layer, hierarchy, model fingerprint).
A concept's activation on a hidden state h is `directions[c] @ h + biases[c]`.

`layer` counts like transformers' `output_hidden_states`: 0 is the embedding output, N is the
residual stream after decoder layer N. (transformers applies the final norm to the last entry, so
a pack at layer == num_layers reads the normed state.)

This package is offline (numpy, safetensors, transformers for training; no vLLM and nothing of the
server): the server's in-engine capture (server/capture) loads packs through it. The side channel
(`lens.side_channel`, ZMQ) carries the engine's activations to the XDB writer, whose inbox
(`lens.inbox`) holds them until their tokens come.
"""

from lens.pack import LensPack, load_pack, model_fingerprint, save_pack

__all__ = ["LensPack", "load_pack", "model_fingerprint", "save_pack"]
