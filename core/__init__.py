"""schedlock: scheduled work in Kubernetes that fires once, on time, with millisecond failover.

The distribution maps three folders to import names (see ``pyproject.toml``):
``core/`` is the shared core (CLI, settings, store, pure scheduling maths),
``sidecar/`` is ``schedlock.sidecar`` and ``operator/`` is ``schedlock.operator``.
"""

__version__ = "0.1.0"
