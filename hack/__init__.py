"""Developer scripts: the demo, manifest generation, the migrations' replay against a git
revision (run from the repository root)."""
