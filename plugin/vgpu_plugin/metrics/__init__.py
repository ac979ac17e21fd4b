"""Node metrics: GPU usage sampler, process -> pod mapping, Prometheus endpoints, per-pod JSON API."""
