"""The chaos run: the whole product under a seeded random schedule of faults, and a verdict.

``python -m chaos --duration 600 [--seed N]`` (``make chaos``).  See ``chaos/README.md``.
"""
