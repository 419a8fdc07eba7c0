"""schedlock: scheduled work in Kubernetes that fires once, on time, with millisecond failover.

src layout: the import name ``schedlock.a.b`` is the file ``src/schedlock/a/b.py``.  The layers,
top to bottom (import-linter enforces them, see ``pyproject.toml``): ``schedlock.cli`` (the one
console script), ``schedlock.operator`` | ``schedlock.sidecar`` (the two components), then
``schedlock.store`` (the only code that talks to a database) and ``schedlock.core`` (settings,
logs, probes, the pure scheduling maths).
"""

__version__ = "0.1.0"
