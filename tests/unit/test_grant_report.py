"""What `schedlock migrate --grant-…` says: every role's namespaces, the single-tenant form."""

from __future__ import annotations

from schedlock.cli.admin import grant_report
from schedlock.store import GrantReport


def test_the_plain_grant_says_it_serves_every_namespace() -> None:
    lines = grant_report(GrantReport(serves={"app": ("*",)}, revoked_public_create="public"))
    assert lines == [
        "granted runtime privileges to app",
        "app may serve every namespace: single-tenant; use --namespace to scope it "
        "(with --only to drop every other namespace)",
        "revoked CREATE on schema public from PUBLIC: no runtime role may create tables or "
        "functions there",
    ]


def test_a_scoped_grant_names_its_namespaces() -> None:
    lines = grant_report(GrantReport(serves={"a": ("billing", "shop"), "b": ("*", "shop")}))
    assert "a may serve namespaces billing, shop only (row-level security)" in lines
    assert any(line.startswith("b may serve every namespace (also listed: shop;") for line in lines)
