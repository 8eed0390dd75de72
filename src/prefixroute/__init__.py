"""prefixroute: route LLM requests to the replica that already caches their prefix."""

__version__ = "0.1.0"
