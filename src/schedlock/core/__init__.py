"""The bottom layer: typed settings, JSON logs, health probes and the pure scheduling maths.

Nothing here talks to a database or to Kubernetes; everything above may import it.
"""
