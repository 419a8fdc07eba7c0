"""Developer scripts: the demo, manifest generation (run from the repository root)."""
