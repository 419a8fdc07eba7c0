"""The test bed: real PostgreSQL, PgBouncer, kube-apiserver + etcd, a node, helm, Prometheus.

A package of its own (not ``tests/``): the suite's fixtures, ``hack/demo.py``, ``bench/`` and
``chaos/`` all start the same real components from here.  Nothing here is shipped in the wheel,
and the product never imports it (an import-linter contract in ``pyproject.toml``).
"""
