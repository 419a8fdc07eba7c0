"""Results: ``latest.json``, ``latest.md``, the PNG plots, and the table in docs/performance.md."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.scenarios.scale import STANDBYS
from testbed.sidecars import REPO

KEYS = (
    "failover_sigkill_ms",
    "failover_sigstop_ms",
    "handover_sigterm_ms",
    "lateness_ms",
    "throughput_fires_per_s",
    "idle_queries_per_s_per_replica",
    "operator",
    "footprint",
    "scale",
    "scale_targets",
    "cluster",
    "history",
    "tenancy",
    "operator_10k",
)
SYSTEMS = ("schedlock", "seed_tick", "k8s_lease", "river", "procrastinate")
PEERS = SYSTEMS[3:]  # the maintained systems run beside schedlock (bench/peers/)
DOCS = REPO / "docs" / "performance.md"
BEGIN = "<!-- bench:results:begin (written by `make bench`; do not edit by hand) -->"
END = "<!-- bench:results:end -->"
HISTORY_BEGIN = "<!-- bench:history:begin (written by `make bench`; do not edit by hand) -->"
HISTORY_END = "<!-- bench:history:end -->"
TENANCY_BEGIN = "<!-- bench:tenancy:begin (written by `make bench`; do not edit by hand) -->"
TENANCY_END = "<!-- bench:tenancy:end -->"
SCALE_TARGETS_BEGIN = (
    "<!-- bench:scale_targets:begin (written by `make bench`; do not edit by hand) -->"
)
SCALE_TARGETS_END = "<!-- bench:scale_targets:end -->"
# The scale_targets figures of the code before one session per sidecar (issue 22), kept as
# measured: the "before" row of the scenario's table; the "after" row is the latest run.
SCALE_TARGETS_BEFORE = REPO / "bench" / "results" / "scale_targets_before.json"
OPERATOR_10K_BEGIN = (
    "<!-- bench:operator_10k:begin (written by `make bench`; do not edit by hand) -->"
)
OPERATOR_10K_END = "<!-- bench:operator_10k:end -->"


def document(info: dict[str, Any], when: datetime, results: dict[str, Any]) -> dict[str, Any]:
    """The JSON document: exactly ``machine``, ``when`` and one key per scenario (null if not
    run); distributions are ``{system: {p50, p99, max, n, …}}``."""
    doc: dict[str, Any] = {"machine": info, "when": when.isoformat(timespec="seconds")}
    for key in KEYS:
        doc[key] = results.get(key)
    return doc


# -- formatting ----------------------------------------------------------------------------------


def _num(value: Any, unit: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    v = float(value)
    if abs(v) >= 100:
        text = f"{v:,.0f}"
    elif abs(v) >= 10:
        text = f"{v:.1f}".rstrip("0").rstrip(".")
    else:
        text = f"{v:.2f}".rstrip("0").rstrip(".")
    return text + unit


def _dist(entry: dict[str, Any] | None, unit: str = "") -> str:
    if not entry or entry.get("n") in (None, 0):
        return "–"
    mark = "≥ " if entry.get("censored") else ""
    return (
        f"{mark}{_num(entry['p50'])} / {_num(entry['p99'])} / {_num(entry['max'])}{unit} "
        f"(n={entry['n']}{', ' + str(entry['censored']) + ' capped' if entry.get('censored') else ''})"
    )


def _get(doc: dict[str, Any], *path: str) -> Any:
    node: Any = doc
    for part in path:
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


def _check(ok: bool | None) -> str:
    return "–" if ok is None else ("✅" if ok else "❌")


def targets(doc: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    """(target, measured, met?) for the issue's targets for schedlock."""
    out: list[tuple[str, str, bool | None]] = []

    def p99(key: str, system: str = "schedlock") -> float | None:
        value = _get(doc, key, system, "p99")
        return None if value is None else float(value)

    kill, k8s = p99("failover_sigkill_ms"), p99("failover_sigkill_ms", "k8s_lease")
    out.append(
        (
            "failover_sigkill p99 < 250 ms",
            _num(kill, " ms"),
            None if kill is None else kill < 250,
        )
    )
    if kill is not None and k8s is not None:
        ratio = k8s / kill if kill > 0 else math.inf
        out.append(("… and ≥ 20× better than k8s_lease (p99)", f"{ratio:,.0f}×", ratio >= 20))
    lease = _get(doc, "machine", "timings", "schedlock_lease_s")
    stop = p99("failover_sigstop_ms")
    if lease is not None:
        out.append(
            (
                f"failover_sigstop p99 < lease + 1 s ({_num((float(lease) + 1) * 1000)} ms)",
                _num(stop, " ms"),
                None if stop is None else stop < (float(lease) + 1) * 1000,
            )
        )
    term = p99("handover_sigterm_ms")
    out.append(
        ("handover_sigterm p99 < 100 ms", _num(term, " ms"), None if term is None else term < 100)
    )
    late = p99("lateness_ms")
    out.append(("lateness p99 < 100 ms", _num(late, " ms"), None if late is None else late < 100))
    rate = _get(doc, "throughput_fires_per_s", "schedlock", "p50")
    out.append(
        ("throughput ≥ 2,000 fires/s", _num(rate, "/s"), None if rate is None else rate >= 2000)
    )
    idle = _get(doc, "idle_queries_per_s_per_replica", "schedlock") or {}
    followers, per_key = (
        idle.get("followers_queries_per_s_max"),
        idle.get("leader_queries_per_s_per_key"),
    )
    out.append(
        (
            "idle standbys 0 queries/s",
            _num(followers, " q/s"),
            None if followers is None else followers == 0,
        )
    )
    reserves = idle.get("reserves_queries_per_s_per_key")
    out.append(
        (
            "idle reserves ≤ 2 queries/s per key, together",
            _num(reserves, " q/s"),
            None if reserves is None else reserves <= 2,
        )
    )
    out.append(
        (
            "idle leader ≤ 1 query/s per key",
            _num(per_key, " q/s"),
            None if per_key is None else per_key <= 1,
        )
    )
    row = _get(doc, "operator", "cr_to_row_ms", "p99")
    out.append(
        ("operator cr_to_row p99 < 1 s", _num(row, " ms"), None if row is None else row < 1000)
    )
    rss = _get(doc, "footprint", "schedlock", "rss_mb", "max")
    out.append(("sidecar RSS < 80 MB", _num(rss, " MB"), None if rss is None else rss < 80))
    # Issue 22's sidecar for every pod.
    out.append(("sidecar idle RSS ≤ 35 MB", _num(rss, " MB"), None if rss is None else rss <= 35))
    cpu = _get(doc, "footprint", "schedlock", "idle_cpu_percent", "p50")
    out.append(("sidecar idle CPU ≤ 0.15 %", _num(cpu, " %"), None if cpu is None else cpu <= 0.15))
    start = _get(doc, "footprint", "schedlock", "start_to_ready_s", "max")
    out.append(
        ("sidecar start to /readyz ≤ 1 s", _num(start, " s"), None if start is None else start <= 1)
    )
    image = _get(doc, "footprint", "schedlock", "image_mb", "schedlock-sidecar", "unpacked")
    out.append(
        ("sidecar image ≤ 120 MB", _num(image, " MB"), None if image is None else image <= 120)
    )
    return out


def _failover_cell(entry: dict[str, Any] | None, system: str, what: str) -> str:
    """A failover distribution; for a peer also the rows its victims left stuck."""
    if system not in PEERS or not entry or entry.get("n") in (None, 0):
        return _dist(entry)
    stuck, n = entry.get("stuck_rows_total", 0), entry["n"]
    rows = f"{stuck} row{'' if stuck == 1 else 's'} stuck after {n} {what}{'' if n == 1 else 's'}"
    if system == "procrastinate":  # no hand-over: the others go on; what the victim held stays
        return f"no leader: n/a — {rows} (others' gap {_dist(entry)})"
    return f"{_dist(entry)}; {rows}"


def _idle_cell(entry: dict[str, Any] | None, system: str) -> str:
    if not entry:
        return "–"
    if system in ("seed_tick", "procrastinate"):
        return f"{_num(entry['p50'])} each (max {_num(entry['max'])})"
    text = (
        f"leader {_num(entry.get('leader_queries_per_s_per_key'))}/key, "
        f"followers {_num(entry.get('followers_queries_per_s_max'))}"
    )
    if system == "k8s_lease":
        text += (
            f"; API req/s leader {_num(entry.get('api_requests_per_s_leader'))}, "
            f"followers {_num(entry.get('api_requests_per_s_followers_max'))}"
        )
    return text


def table(doc: dict[str, Any]) -> str:
    """The Markdown table (also what the run prints)."""
    rows: list[list[str]] = [["scenario (p50 / p99 / max)", *SYSTEMS]]

    def per_system(label: str, key: str, unit: str = "", *path: str) -> None:
        rows.append([label, *(_dist(_get(doc, key, s, *path), unit) for s in SYSTEMS)])

    for label, key, what in (
        ("failover SIGKILL, ms", "failover_sigkill_ms", "kill"),
        ("failover SIGSTOP, ms", "failover_sigstop_ms", "freeze"),
        ("hand-over SIGTERM, ms", "handover_sigterm_ms", "hand-over"),
    ):
        rows.append([label, *(_failover_cell(_get(doc, key, s), s, what) for s in SYSTEMS)])
    per_system("lateness, ms", "lateness_ms")
    per_system("throughput, fires/s", "throughput_fires_per_s")
    rows.append(
        [
            "idle queries/s per replica",
            *(_idle_cell(_get(doc, "idle_queries_per_s_per_replica", s), s) for s in SYSTEMS),
        ]
    )
    op = doc.get("operator") or {}
    objects = f" ({op['objects']} objects)" if op.get("objects") else ""
    others = len(SYSTEMS) - 1
    for key in ("cr_to_row_ms", "cr_to_published_ms"):
        rows.append([f"operator {key}{objects}", _dist(op.get(key)), *["n/a"] * others])
    per_system("sessions held per replica", "footprint", "", "sessions")
    per_system("RSS per replica, MB", "footprint", "", "rss_mb")
    per_system("idle CPU, % of a core", "footprint", "", "idle_cpu_percent")
    per_system("start to /readyz 200, s", "footprint", "", "start_to_ready_s")
    images = _get(doc, "footprint", "schedlock", "image_mb") or {}
    rows.append(
        [
            "image, MB unpacked (pulled)",
            "; ".join(
                f"{name} {_num(size.get('unpacked'))} ({_num(size.get('compressed'))})"
                for name, size in images.items()
            )
            or "–",
            *["n/a"] * (len(SYSTEMS) - 1),
        ]
    )
    sc = doc.get("scale")
    if sc:
        cell = (
            f"{sc['sidecars']} replicas of one target at max_connections "
            f"{sc['max_connections']}: {'one' if sc['one_leader_per_key'] else 'NOT one'} "
            f"leader per key, {sc['connections']} sessions (table below)"
        )
    else:
        cell = "–"
    rows.append(["scale", cell, *["n/a"] * others])
    cl = doc.get("cluster") or {}
    for label, key in (
        ("in a cluster: leader pod force-deleted, gap ms", "pod_delete_force_gap_ms"),
        ("in a cluster: leader pod deleted, gap ms", "pod_delete_gap_ms"),
        ("in a cluster: rolling update, gap ms", "rolling_update"),
    ):
        entry = cl.get(key)
        cell = _dist(entry)
        if entry:
            cell += (
                f"; lost {entry['lost']}, failed {entry['failed']}, "
                f"latest row {_num(entry['late_max_ms'], ' ms')}"
            )
        rows.append([label, cell, *["n/a (no pods)"] * others])
    for index, row in enumerate(rows):
        if index > 0 and row[0] == "hand-over SIGTERM, ms":
            row[2] = row[3] = "n/a (no hand-over)"
            row[5] = "n/a (no leader)"
    lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    lines += ["| " + " | ".join(row) + " |" for row in rows[1:]]
    lines += ["", "| schedlock target | measured | met |", "|---|---|---|"]
    lines += [f"| {name} | {value} | {_check(ok)} |" for name, value, ok in targets(doc)]
    lines += scale_table(sc)
    return "\n".join(lines)


def _seconds(entry: dict[str, Any] | None) -> str:
    if not entry:
        return "–"
    return ("≥ " if entry.get("censored") else "") + _num(entry.get("seconds"), " s")


def _sweep(entry: dict[str, Any] | None) -> str:
    if not entry:
        return "–"
    return (
        f"{_seconds(entry)}: {entry['rows_read']:,} rows in {entry['pages']:,} pages, "
        f"{entry['latest_slot_calls']:,} latest_slot, {entry['kube_gets']:,} GETs"
    )


def _ratio_cell(value: float | None, entry: dict[str, Any] | None = None) -> str:
    """A ratio; a lower bound (``≥``) when the loaded side hit its cap (``entry``)."""
    if value is None:
        return "–"
    return ("≥ " if (entry or {}).get("censored") else "") + f"{value:.2f}×"


def history_table(doc: dict[str, Any]) -> str:
    """The ``history`` scenario: empty against loaded, the ratios, the prune backlog."""
    h = doc.get("history")
    if not h:
        return ""
    empty, loaded, ratio = h.get("empty") or {}, h.get("history") or {}, h.get("ratio") or {}
    load = h.get("load") or {}
    rows_label = f"{h['rows']:,} finished rows"
    lines = [
        f"| one key led by a real sidecar | empty | {rows_label} | ratio |",
        "|---|---|---|---|",
    ]

    def lateness(entry: dict[str, Any], field: str) -> str:
        return _num(_get(entry, "lateness_ms", field), " ms")

    for field in ("p50", "p99"):
        n = _get(loaded, "lateness_ms", "n")
        lines.append(
            f"| lateness {field} ({n} rows) | {lateness(empty, field)} | "
            f"{lateness(loaded, field)} | {_ratio_cell(ratio.get('lateness_' + field))} |"
        )
    lines.append(
        f"| throughput, fires/s | {_num(_get(empty, 'throughput', 'fires_per_s'))} | "
        f"{_num(_get(loaded, 'throughput', 'fires_per_s'))} | "
        f"{_ratio_cell(ratio.get('throughput'))} |"
    )
    lines.append(
        f"| `schedlock status` (CLI, process start included) | "
        f"{_seconds(empty.get('status_cli'))} | {_seconds(loaded.get('status_cli'))} | "
        f"{_ratio_cell(ratio.get('status_cli'), loaded.get('status_cli'))} |"
    )
    lines.append(
        f"| `key_status` (the store verb) | {_seconds(empty.get('key_status'))} | "
        f"{_seconds(loaded.get('key_status'))} | |"
    )
    sweep = loaded.get("sync_first_sweep")
    lines.append(
        f"| operator status sync, first sweep | {_sweep(empty.get('sync_first_sweep'))} | "
        f"{_sweep(sweep)} | {_ratio_cell(ratio.get('sync_first_sweep'), sweep)} |"
    )
    if load:
        lines += [
            "",
            f"History: {load['rows']:,} rows over {load['keys']} keys and {load['schedules']:,} "
            f"schedules, loaded in {_num(load['insert_s'], ' s')} + VACUUM ANALYZE "
            f"{_num(load['vacuum_analyze_s'], ' s')}; `schedlock_publishes` "
            f"{_num(load['table_mb'], ' MB')}, {_num(load['heap_bytes_per_row'])} heap bytes a row.",
        ]
    targets_ = h.get("targets") or {}
    p99_ratio, status_s = ratio.get("lateness_p99"), _get(loaded, "status_cli", "seconds")
    status_capped = bool(_get(loaded, "status_cli", "censored"))
    lines += ["", "| history target | measured | met |", "|---|---|---|"]
    lines.append(
        f"| lateness p99 with history ≤ {targets_.get('lateness_p99_ratio_max')}× empty | "
        f"{_ratio_cell(p99_ratio)} | "
        f"{_check(None if p99_ratio is None else p99_ratio <= targets_['lateness_p99_ratio_max'])} |"
    )
    lines.append(
        f"| `schedlock status` with history < {_num(targets_.get('status_s_max'), ' s')} | "
        f"{_seconds(loaded.get('status_cli'))} | "
        f"{_check(None if status_s is None else not status_capped and status_s < targets_['status_s_max'])} |"
    )
    prune = h.get("prune") or {}
    if prune.get("skipped"):
        lines.append(f"| prune backlog | {prune['skipped']} | – |")
    elif prune:
        limit, late_max = targets_["prune_s_max"], targets_["prune_lateness_p99_ms_max"]
        late = _get(prune, "lateness_ms", "p99")
        lines.append(
            f"| {prune['expired_at_start']:,} expired rows cleared within {_num(limit, ' s')} | "
            f"{'' if prune['cleared'] else '≥ '}{_num(prune['seconds'], ' s')} "
            f"({prune['rows_deleted']:,} deleted) | "
            f"{_check(prune['cleared'] and prune['seconds'] <= limit)} |"
        )
        lines.append(
            f"| … lateness p99 during the prune < {_num(late_max, ' ms')} | "
            f"{_num(late, ' ms')} (p50 {_num(_get(prune, 'lateness_ms', 'p50'), ' ms')}, "
            f"{_get(prune, 'lateness_ms', 'n')} rows) | {_check(None if late is None else late < late_max)} |"
        )
    return "\n".join(lines)


TENANCY_MODES = (
    ("owner", "the schema's owner (no row-level security)"),
    ("every_namespace", "a role granted every namespace (`*`)"),
    ("namespace", "a role granted one namespace"),
)


def tenancy_table(doc: dict[str, Any]) -> str:
    """The ``tenancy`` scenario: one key as the owner and under row-level security."""
    t = doc.get("tenancy")
    if not t:
        return ""
    modes, ratio = t.get("modes") or {}, t.get("ratio") or {}
    header = "| one key led by a real sidecar | lateness p50 | lateness p99 | throughput, fires/s |"
    lines = [header, "|---|---|---|---|"]
    for mode, label in TENANCY_MODES:
        entry, r = modes.get(mode) or {}, ratio.get(mode) or {}

        def cell(value: Any, unit: str, factor: Any) -> str:
            return _num(value, unit) + (f" ({_ratio_cell(factor)})" if factor is not None else "")

        lines.append(
            f"| {label} | {cell(_get(entry, 'lateness_ms', 'p50'), ' ms', r.get('lateness_p50'))} "
            f"| {cell(_get(entry, 'lateness_ms', 'p99'), ' ms', r.get('lateness_p99'))} "
            f"| {cell(_get(entry, 'throughput', 'fires_per_s'), '', r.get('throughput'))} |"
        )
    targets_ = t.get("targets") or {}
    cost = targets_.get("max_cost")
    rows = t.get("rows") or {}
    lines += [
        "",
        f"{t.get('trials')} trials of the three modes side by side, in turns at a fine grain; "
        f"per trial and mode {rows.get('lateness')} rows for lateness (the modes' rows "
        f"interleaved, at one mode's rate in all) and {rows.get('throughput')} for throughput "
        f"(in {rows.get('bursts')} bursts, the modes' bursts one after another, the order "
        "rotating; the median burst is shown). "
        "Ratios are over the owner's (throughput: the median of each burst's rate over the "
        "owner's burst of the same round). Target: either role costs at most "
        f"{_num((cost or 0) * 100, ' %')} (lateness ≤ {_num(1 + (cost or 0))}×, throughput ≥ "
        f"{_num(1 - (cost or 0))}×): {_check(targets_.get('met'))}.",
    ]
    return "\n".join(lines)


ScaleColumn = tuple[str, Callable[[dict[str, Any]], str]]
SCALE_COLUMNS: tuple[ScaleColumn, ...] = (
    ("sessions held", lambda r: _num(r["sessions_held"]["median"])),
    ("new connections/s at start", lambda r: _num(r["at_start"]["new_connections_per_s"])),
    (
        "new connections/s settled",
        lambda r: _num(r["settled"]["new_connections_per_s"]) if r.get("settled") else "–",
    ),
    ("statements/s", lambda r: _num(r["statements_per_s"])),
    ("SIGKILL failover p99, ms", lambda r: _num(r["failover_sigkill_ms"]["p99"])),
    ("connections refused", lambda r: str(r["refused_connections"])),
    ("replicas not ready", lambda r: str(r["not_ready"])),
)


def scale_table(sc: dict[str, Any] | None) -> list[str]:
    """The connection budget: per replica count, each figure as bounded / baseline."""
    if not sc or not sc.get("designs"):
        return []
    bounded, baseline = sc["designs"]["bounded"], sc["designs"]["baseline"]
    header = ["replicas (2 keys)", *(name for name, _ in SCALE_COLUMNS)]
    lines = [
        "",
        f"Connection budget at max_connections {sc['max_connections']}: each cell is "
        f"bounded (SCHEDLOCK_STANDBYS {sc.get('standbys', STANDBYS)}) / baseline (a session per "
        "replica).",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for mine, old in zip(bounded, baseline, strict=True):
        cells = [f"{value(mine)} / {value(old)}" for _, value in SCALE_COLUMNS]
        lines.append(f"| {mine['replicas']} | " + " | ".join(cells) + " |")
    return lines


def _measured(entry: dict[str, Any], doc: dict[str, Any]) -> dict[str, Any]:
    """When, on which commit and profile a scenario's entry was measured."""
    stamp = entry.get("measured") or {}
    return {
        "when": stamp.get("when", doc.get("when")),
        "commit": stamp.get("commit", _get(doc, "machine", "commit")),
        "profile": stamp.get("profile", _get(doc, "machine", "profile")),
    }


def _skipped(entry: dict[str, Any]) -> str:
    n = entry.get("skipped") or 0
    return f"; {n} trial{'' if n == 1 else 's'} skipped (no leader delivering)" if n else ""


def _scale_targets_row(label: str, r: dict[str, Any]) -> str:
    s, sizing = r["sessions"], r["sizing"]
    kill, both = r["failover_sigkill_ms"], r["failover_both_killed_ms"]
    needed = sizing["sessions_needed"]
    per3, operator = sizing["per_target_at_3_replicas"], sizing["operator_sessions"]
    cells = [
        label,
        f"{_num(s['total']['median'])} ({_num(s['per_target']['median'])} per target, "
        f"{_num(s['per_target']['min'])}–{_num(s['per_target']['max'])})",
        f"{s['free_slots']}; {'opens' if r['app_can_connect'] else 'refused'}",
        f"{s['keys_led']} of {s['keys']}; {s['targets_with_standby']} of {r['targets']}",
        _num(r["new_connections_per_s"]),
        f"{r['refused_total']} ({r['refused_in_window']} in the window)",
        f"{_dist(kill)}; {kill['with_standby']} with a session waiting on its locks{_skipped(kill)}",
        _dist(both) + _skipped(both),
        *(f"{needed[key]:,} ({_num(per3)} per target + {operator})" for key in ("100x3", "1000x3")),
    ]
    return "| " + " | ".join(cells) + " |"


def scale_targets_table(doc: dict[str, Any], before: dict[str, Any] | None = None) -> str:
    """The ``scale_targets`` scenario: the stored "before" figures and the latest run's."""
    if before is None and SCALE_TARGETS_BEFORE.exists():
        before = json.loads(SCALE_TARGETS_BEFORE.read_text())
    latest = doc.get("scale_targets")
    setup = latest or before
    if not setup:
        return ""
    header = [
        "code (commit, profile)",
        "sidecar sessions",
        "ordinary slots free; the app's next connection",
        "keys led; targets with a standby",
        "new connections/s",
        "connections refused",
        "SIGKILL of a key's leader, gap ms",
        "SIGKILL of both replicas (leader and standby), gap ms",
        "sessions for 100 × 3",
        "sessions for 1,000 × 3",
    ]
    lines = [
        f"{setup['targets']} targets × {setup['replicas']} replicas on one database at "
        f"max_connections {setup['max_connections']}, next to an app pool of "
        f"{setup['app_pool']} idle connections; gaps p50 / p99 / max.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    if before:
        m = before.get("measured") or {}
        label = f"before: {before.get('code', '')} ({m.get('commit')}, {m.get('profile')})"
        lines.append(_scale_targets_row(label, before))
    if latest and (
        not before or _measured(latest, doc)["when"] != _get(before, "measured", "when")
    ):
        m = _measured(latest, doc)
        lines.append(_scale_targets_row(f"after ({m['commit']}, {m['profile']})", latest))
    else:
        lines.append(
            "| after | not measured yet: `.venv/bin/python -m bench run --only scale_targets "
            "--docs` once one session per sidecar is merged |" + " |" * (len(header) - 2)
        )
    return "\n".join(lines)


def machine_line(doc: dict[str, Any]) -> str:
    m = doc.get("machine") or {}
    return (
        f"{m.get('cpus')} CPUs ({m.get('cpu_model')}), {m.get('memory_gb')} GB RAM, "
        f"Linux {m.get('kernel')}, Python {m.get('python')}, PostgreSQL {m.get('postgres')}, "
        f"{m.get('kube_apiserver') or 'kube-apiserver'}; load average at start "
        f"{m.get('load_average_at_start')}; profile `{m.get('profile')}`, "
        f"{_num((m.get('run_seconds') or 0) / 60)} min, commit {m.get('commit')}"
    )


# -- files ------------------------------------------------------------------------------------------


def write(
    out: Path,
    doc: dict[str, Any],
    table_md: str,
    series: dict[str, dict[str, list[float]]],
    censored: dict[str, dict[str, list[bool]]],
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "latest.json").write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    plots = _plots(out, series, censored) + _scale_plot(out, doc.get("scale"))
    text = [
        f"# schedlock benchmark — {_get(doc, 'machine', 'profile')} run, {doc['when']}",
        "",
        f"Machine: {machine_line(doc)}.",
        "",
        table_md,
        "",
        history_table(doc),
        "",
        tenancy_table(doc),
        "",
        scale_targets_table(doc),
        "",
        "`≥` marks a distribution with capped trials (the run stopped waiting): its values are "
        "lower bounds. See docs/performance.md for what each number means and what bounds it.",
    ]
    if plots:
        text += ["", *(f"![{p.stem}]({p.name})" for p in plots)]
    (out / "latest.md").write_text("\n".join(text) + "\n")


def _replace_block(text: str, begin: str, end: str, body: str) -> str:
    if begin not in text or end not in text:
        raise RuntimeError(f"{DOCS} lacks the markers {begin!r} … {end!r}")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return head + "\n".join([begin, "", body, "", end]) + tail


def write_docs(doc: dict[str, Any], table_md: str) -> None:
    body = f"Measured {doc['when']} on {machine_line(doc)}.\n\n{table_md}"
    DOCS.write_text(_replace_block(DOCS.read_text(), BEGIN, END, body))


def operator_10k_table(doc: dict[str, Any]) -> str:
    """The ``operator_10k`` scenario: a restart with the objects present, a pass, a burst."""
    o = doc.get("operator_10k")
    if not o:
        return ""
    resume, burst, ingest = o.get("resume") or {}, o.get("burst") or {}, o.get("ingest") or {}
    reassert, goal = o.get("reassert") or {}, o.get("targets") or {}
    rss = max(resume.get("peak_rss_mb") or 0, burst.get("rss_mb") or 0) or None
    p50, p99 = _get(burst, "cr_to_row_ms", "p50"), _get(burst, "cr_to_row_ms", "p99")
    capped = "≥ " if resume.get("capped") else ""

    def met(value: Any, limit: Any, ok: Callable[[float, float], bool]) -> str:
        return _check(None if value is None or limit is None else ok(float(value), limit))

    def at_most(value: float, limit: float) -> bool:
        return value <= limit

    resumed = met(resume.get("resume_s"), goal.get("resume_s"), at_most)
    lines = [
        f"| {o['objects']:,} objects in {o['namespaces']} namespaces | measured | target | met |",
        "|---|---|---|---|",
        f"| restart: spawn → steady state | {capped}{_num(resume.get('resume_s'), ' s')} "
        f"(`/readyz` {_num(resume.get('ready_s'), ' s')}, {_num(resume.get('resume_cpu_s'), ' s')}"
        f" CPU) | ≤ {_num(goal.get('resume_s'), ' s')} | "
        f"{_check(False) if resume.get('capped') else resumed} |",
        f"| API writes of the restart (objects, status, Events) | {resume.get('api_writes')} "
        f"(rows written: {sum((resume.get('row_writes') or {}).values())}) | "
        f"{goal.get('api_writes')} | {met(resume.get('api_writes'), goal.get('api_writes'), at_most)} |",
        f"| operator RSS: restart's peak, after the burst | "
        f"{_num(resume.get('peak_rss_mb'), ' MB')}, {_num(burst.get('rss_mb'), ' MB')} (the "
        f"first operator after the ingest: {_num(ingest.get('rss_mb'), ' MB')}) | "
        f"≤ {_num(goal.get('rss_mb'), ' MB')} | "
        f"{met(rss, goal.get('rss_mb'), at_most)} |",
        f"| one re-assertion pass, nothing to write | {_num(reassert.get('steady_pass_ms'), ' ms')}"
        f" | ≤ {_num(goal.get('steady_pass_ms'), ' ms')} | "
        f"{met(reassert.get('steady_pass_ms'), goal.get('steady_pass_ms'), at_most)} |",
        f"| … every row lost (each written again) | "
        f"{_num(reassert.get('all_rows_lost_pass_ms'), ' ms')} | | |",
        f"| burst of {burst.get('objects')} new objects: cr_to_row p50 / p99 | "
        f"{_num(p50, ' ms')} / {_num(p99, ' ms')} | p99 ≤ {_num(goal.get('burst_p99_ms'), ' ms')} "
        f"| {met(p99, goal.get('burst_p99_ms'), at_most)} |",
        "",
        f"Ingest of the {o['objects']:,} objects by the first operator: created at "
        f"{_num(ingest.get('creates_per_s'))}/s, all reconciled after "
        f"{_num(ingest.get('handled_s'), ' s')}, {_num(ingest.get('operator_cpu_ms_per_object'))}"
        " ms of operator CPU per object.",
    ]
    return "\n".join(lines)


# Scenarios whose table has a block of its own in docs/performance.md (each may run alone):
# key -> (begin marker, end marker, table).
OWN_BLOCKS: dict[str, tuple[str, str, Callable[[dict[str, Any]], str]]] = {
    "history": (HISTORY_BEGIN, HISTORY_END, history_table),
    "tenancy": (TENANCY_BEGIN, TENANCY_END, tenancy_table),
    "scale_targets": (SCALE_TARGETS_BEGIN, SCALE_TARGETS_END, scale_targets_table),
    "operator_10k": (OPERATOR_10K_BEGIN, OPERATOR_10K_END, operator_10k_table),
}


def write_own_block(doc: dict[str, Any], key: str) -> None:
    """Scenario ``key``'s block of docs/performance.md, stamped with when and on what it was
    measured (its own run's, when merged into an earlier run's results)."""
    begin, end, render = OWN_BLOCKS[key]
    measured = (doc.get(key) or {}).get("measured") or {}
    when = measured.get("when", doc["when"])
    machine = measured.get("machine_line") or machine_line(doc)
    body = f"Measured {when} on {machine}.\n\n{render(doc)}"
    DOCS.write_text(_replace_block(DOCS.read_text(), begin, end, body))


def merge_partial(previous: dict[str, Any], doc: dict[str, Any], only: list[str]) -> dict[str, Any]:
    """A run of some scenarios written over the results of an earlier run: the keys it ran
    replace theirs, each stamped with when and on what it was measured; ``machine`` and
    ``when`` stay the earlier run's (they describe the other keys)."""
    merged = {key: previous.get(key) for key in ("machine", "when", *KEYS)}
    for key in only:
        entry = doc.get(key)
        if isinstance(entry, dict):
            entry = {
                **entry,
                "measured": {
                    "when": doc["when"],
                    "machine_line": machine_line(doc),
                    "commit": _get(doc, "machine", "commit"),
                    "profile": _get(doc, "machine", "profile"),
                    "load_average_at_start": _get(doc, "machine", "load_average_at_start"),
                },
            }
        merged[key] = entry
    return merged


def _plots(
    out: Path, series: dict[str, dict[str, list[float]]], censored: dict[str, dict[str, list[bool]]]
) -> list[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        print("matplotlib is not installed: no plots")
        return []
    written: list[Path] = []
    colors = {
        "schedlock": "tab:green",
        "seed_tick": "tab:orange",
        "k8s_lease": "tab:blue",
        "river": "tab:red",
        "procrastinate": "tab:purple",
    }
    panels = [
        k
        for k in ("failover_sigkill_ms", "failover_sigstop_ms", "handover_sigterm_ms")
        if series.get(k)
    ]
    if panels:
        fig, axes = plt.subplots(
            1, len(panels), figsize=(5 * len(panels), 4), squeeze=False, sharey=True
        )
        for ax, key in zip(axes[0], panels, strict=True):
            longest = max(len(v) for v in series[key].values())
            ax.set_xlim(0.5, longest + 0.5)
            for system, values in series[key].items():
                xs = list(range(1, len(values) + 1))
                ys = [max(v, 0.1) for v in values]
                color = colors.get(system)
                ax.plot(xs, ys, "o-", ms=4, lw=1, label=system, color=color)
                capped = censored.get(key, {}).get(system) or []
                cx = [x for x, c in zip(xs, capped, strict=False) if c]
                cy = [y for y, c in zip(ys, capped, strict=False) if c]
                if cx:
                    ax.plot(cx, cy, "^", ms=9, mfc="none", color=color, label=f"{system} (capped)")
            ax.set_yscale("log")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_title(key.removesuffix("_ms").replace("_", " "))
            ax.set_xlabel("trial")
            ax.set_ylabel("gap at the receiver, ms")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
        fig.tight_layout()
        path = out / "failover_gaps.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    for key, title, name in (
        ("lateness_ms", "lateness CDF", "lateness_cdf.png"),
        (
            "history_lateness_ms",
            "lateness CDF, schedlock: empty, history, prune",
            "history_cdf.png",
        ),
    ):
        if not series.get(key):
            continue
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for system, values in series[key].items():
            if not values:
                continue
            flags = censored.get(key, {}).get(system) or [False] * len(values)
            ordered = sorted(max(v, 0.01) for v in values)
            fractions = [(i + 1) / len(ordered) for i in range(len(ordered))]
            missing = sum(flags)
            label = f"{system} ({missing} not delivered: lower bounds)" if missing else system
            ax.step(ordered, fractions, where="post", label=label, color=colors.get(system))
        ax.set_xscale("log")
        ax.set_xlabel("lateness (arrival − due), ms")
        ax.set_ylabel("fraction of rows")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3)
        fig.tight_layout()
        path = out / name
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        written.append(path)
    return written


def _scale_plot(out: Path, sc: dict[str, Any] | None) -> list[Path]:
    """Sessions held against replicas, bounded and baseline, with the server's limit."""
    if not sc or not sc.get("designs"):
        return []
    designs, limit = sc["designs"], sc["max_connections"]
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    fig, ax = plt.subplots(figsize=(6, 4))
    styles = {
        "bounded": ("tab:green", f"schedlock (standbys {sc.get('standbys', STANDBYS)})"),
        "baseline": ("tab:red", ""),
    }
    for design, results in designs.items():
        color, label = styles.get(design, ("tab:gray", design))
        xs = [r["replicas"] for r in results]
        ys = [r["sessions_held"]["median"] for r in results]
        ax.plot(xs, ys, "o-", color=color, label=label or "a session per replica")
    ax.axhline(limit, ls="--", color="gray", lw=1, label=f"max_connections {limit}")
    ax.set_xlabel("replicas of one target (2 lock keys)")
    ax.set_ylabel("database sessions held")
    ax.set_title("sessions against replicas")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "scale_sessions.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]
