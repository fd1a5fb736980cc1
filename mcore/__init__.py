"""mcore: capture a model's graph, select a region, patch it with a TVM-FFI kernel slot, run it."""

__version__ = "0.1.0"
