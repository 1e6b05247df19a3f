"""One module per backend, each with `load(path, manifest, options) -> Backend` (runtime/backend.py)."""
