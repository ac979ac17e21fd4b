"""Node metrics: GPU usage sampler, process -> pod mapping, Prometheus endpoints, per-pod JSON API.

The node daemon embeds it::

    from vgpu_plugin.metrics import MetricsServer, add_metrics_arguments, metrics_options
"""

from .flags import add_metrics_arguments, metrics_options
from .server import MetricsServer

__all__ = ["MetricsServer", "add_metrics_arguments", "metrics_options"]
