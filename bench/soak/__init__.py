"""The soak (``make soak``): the product running for an hour under load, kills and restarts,
sampled over time so that growth shows.  :mod:`bench.soak.run` runs it, :mod:`bench.soak.trends`
judges every series flat or growing, :mod:`bench.soak.plot` draws them."""
