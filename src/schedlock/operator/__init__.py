"""The kopf operator: ``ScheduledPublish`` objects into rows, outcomes into status and Events.

Imported as ``schedlock.operator`` only: the folder lives under ``src/schedlock/``, which is
never on ``sys.path`` itself, so it cannot shadow the standard library's ``operator``.
"""
