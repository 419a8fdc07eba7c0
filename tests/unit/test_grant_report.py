"""What `schedlock migrate --grant-…` and `schedlock status` say of the namespaces a role serves."""

from __future__ import annotations

from schedlock.cli.admin import grant_report, hidden_keys_note
from schedlock.store import GrantReport, ServedNamespaces


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


def test_status_says_which_keys_row_level_security_hides() -> None:
    scoped = hidden_keys_note(ServedNamespaces("tenant_a", ("billing", "shop")))
    assert scoped.startswith(
        "role tenant_a may serve namespaces billing, shop only: keys of other namespaces are "
        "not shown; as the schema owner run `schedlock migrate --grant-operator tenant_a`"
    )
    one = hidden_keys_note(ServedNamespaces("tenant_b", ("shop",)))
    assert one.startswith("role tenant_b may serve namespace shop only:")
    assert hidden_keys_note(ServedNamespaces("nobody", ())).startswith(
        "role nobody may serve no namespace: row-level security hides every key;"
    )
    assert ServedNamespaces("admin", ("*",)).every
    assert ServedNamespaces("x", ("a",)).covers("a") and not ServedNamespaces("x", ("a",)).covers(
        "*"
    )
