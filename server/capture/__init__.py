"""Activation capture inside the engine: a worker that projects one layer's hidden state onto a lens
pack's concepts each step and pushes them to the API process, which joins them to the generated
tokens. The packs themselves (format, training) are the offline `lens` package; CAPTURE_NOTES.md has
the vLLM internals this relies on."""
