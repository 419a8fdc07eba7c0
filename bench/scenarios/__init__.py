"""One module per scenario family; ``bench.runner`` decides the order and what runs together."""
