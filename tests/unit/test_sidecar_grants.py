"""A sidecar's grants (migration 0010): column privileges checked column by column, and what
`schedlock migrate --grant-sidecar` says about a role's table-wide writes."""

from __future__ import annotations

from schedlock.cli.admin import grant_report
from schedlock.store import GrantReport


def test_a_sidecar_grant_says_whether_its_table_wide_writes_remain() -> None:
    report = GrantReport(
        serves={"kept": ("a",), "narrowed": ("b",), "both": ("*",), "new": ("c",)},
        table_wide=["kept"],
        narrowed=["narrowed"],
        columns_only=["narrowed", "new"],
        kept_broad=["both"],
    )
    lines = grant_report(report)
    assert (
        "kept still holds the table-wide INSERT/UPDATE of an earlier release (its sidecars need "
        "them): once every sidecar under it runs this release, narrow it with "
        "`schedlock migrate --grant-sidecar kept --narrow`"
    ) in lines
    columns = (
        "may update only the columns a sidecar's loops change; slot rows and term bumps go "
        "through the schema's functions"
    )
    assert f"new {columns}" in lines
    assert f"narrowed {columns} (revoked the table-wide INSERT/UPDATE of earlier releases)" in lines
    assert not any(line.startswith(("kept may update", "both may update")) for line in lines)
    assert any(line.startswith("both is an operator's role too") for line in lines)


def test_column_privileges_are_checked_column_by_column() -> None:
    from schedlock.store.postgres import SIDECAR_GRANTS, privilege_checks

    checks = privilege_checks(
        (
            ("SELECT, UPDATE (state, term)", ("TABLE t",)),
            ("EXECUTE", ("FUNCTION f(text)",)),
        )
    )
    assert checks == [
        ("has_table_privilege", ("t", "SELECT"), "SELECT on t"),
        ("has_column_privilege", ("t", "state", "UPDATE"), "UPDATE (state) on t"),
        ("has_column_privilege", ("t", "term", "UPDATE"), "UPDATE (term) on t"),
        ("has_function_privilege", ("f(text)", "EXECUTE"), "EXECUTE on f(text)"),
    ]
    # A sidecar may update none of the columns that make a row what it is.
    updatable = {
        (args[0], args[1])
        for probe, args, _ in privilege_checks(SIDECAR_GRANTS)
        if probe == "has_column_privilege" and args[2] == "UPDATE"
    }
    for column in ("payload", "due_at", "target", "namespace", "name", "uid", "max_attempts"):
        assert ("schedlock_publishes", column) not in updatable
        assert ("schedlock_schedules", column) not in updatable
    assert ("schedlock_terms", "term") not in updatable
