"""The parts of the one-node test cluster that ``testbed.cluster`` puts together, one job each:
the address plan, the host state it captures and restores, its prerequisites, and the
configuration and manifests of its components."""
