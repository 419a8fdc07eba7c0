"""The kopf operator: ``ScheduledPublish`` objects into rows, outcomes into status and Events.

Imported as ``schedlock.operator``.  The folder sits at the top of the repository, so Python
started there (``python -c``/``-m`` put the root first on ``sys.path``, and a start does not load
``operator`` itself) finds it under the name ``operator``; then it hands that name to the
standard library's module, the only thing it may ever mean.
Nothing but the import system's own modules may be imported for that: ``collections`` and most
of the standard library import ``operator`` themselves.
"""

if __name__ == "operator":
    import importlib.machinery
    import os
    import sys

    _root = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    _path = [entry for entry in sys.path if os.path.realpath(entry or ".") != _root]
    _spec = importlib.machinery.PathFinder.find_spec("operator", _path)
    if _spec is None or _spec.loader is None:
        raise ImportError("the standard library's operator module is not on sys.path")
    _stdlib = type(sys)("operator")
    _stdlib.__spec__, _stdlib.__loader__, _stdlib.__file__ = _spec, _spec.loader, _spec.origin
    # The import system hands out whatever sys.modules holds once this module has run.
    sys.modules["operator"] = _stdlib
    _spec.loader.exec_module(_stdlib)
