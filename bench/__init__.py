"""schedlock's benchmark harness: ``python -m bench run [--quick | --smoke] [--only SCENARIO …]``.

Everything is measured side by side on one machine in one run: schedlock as real ``schedlock
sidecar`` processes, and two baselines implemented faithfully in ``bench.baselines``
(``seed_tick``: the 10 s ``pg_try_advisory_lock`` tick this project started from; ``k8s_lease``:
the official Kubernetes Python client's Lease election with client-go's default timings), all
against the same throwaway PostgreSQL, the same kube-apiserver and the same recording app
(``testbed.receiver``).  See ``docs/performance.md`` for what each number means and what
bounds it.
"""
