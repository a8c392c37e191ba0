"""What an operator sees: Prometheus metrics, sampler heartbeats, structured logs.

`config.py` is plain dataclasses; the rest needs `prometheus_client` (a dependency)."""
