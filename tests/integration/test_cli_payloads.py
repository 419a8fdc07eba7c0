"""The CLI's ``--payload`` goes through the one payload check (``schedlock.core.payloads``), the
webhook's and the database's: each refusal is one line and exit 2, never a traceback or a raw
database message; and the database's own bound (migration 0007) holds for a writer that is
not the CLI."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from tests.integration.test_cli import run

CASES = [
    ('{"a": ' * 900 + "1" + "}" * 900, "payload nests deeper than 32 levels"),
    (json.dumps({"blob": "x" * 120_000}), "payload is 120012 bytes as JSON; at most 16384 bytes"),
    ('{"a": "\\u0000"}', "payload string holds a NUL character"),
    ('{"a": NaN}', "payload holds NaN, which JSON cannot carry"),
    ('{"\\udc80": 1}', "payload key holds a lone UTF-16 surrogate"),
    ('{"n": ' + "7" * 5_000 + "}", "payload cannot be read: Exceeds the limit (4300 digits)"),
    ("[1]", "payload must be a JSON object, got array"),
]


@pytest.mark.parametrize(("payload", "said"), CASES, ids=[c[1][:30] for c in CASES])
def test_a_bad_payload_is_one_line_and_exit_2(tmp_path: Path, payload: str, said: str) -> None:
    env = {"SCHEDLOCK_DATABASE_URL": f"sqlite:///{tmp_path / 'cli.db'}"}
    result = run("publish", "--target", "billing", "--at", "now", "--payload", payload, env=env)
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("schedlock publish: error: --payload: " + said), line


def test_the_database_refuses_what_bypasses_the_cli(tmp_path: Path) -> None:
    """SQLite (migration 0007's triggers): an INSERT, or an UPDATE of the payload, over the
    bound is refused; a row's other updates are not (a grandfathered row still moves)."""
    path = tmp_path / "bound.db"
    env = {"SCHEDLOCK_DATABASE_URL": f"sqlite:///{path}"}
    assert run("migrate", env=env).returncode == 0
    small = run("publish", "--target", "billing", "--at", "+1h", "--payload", '{"a": 1}', env=env)
    assert small.returncode == 0, small.stderr
    uid = json.loads(small.stdout)["uid"]
    conn = sqlite3.connect(path)
    try:
        big = json.dumps({"blob": "x" * 17_000}, ensure_ascii=False)
        with pytest.raises(sqlite3.IntegrityError, match="payload over 16384 bytes"):
            conn.execute(
                "INSERT INTO schedlock_publishes (namespace, name, uid, target, due_at, "
                "next_attempt_at, payload, created_at, updated_at) "
                "VALUES ('default', 'x', 'x', 'billing', 'now', 'now', ?, 'now', 'now')",
                (big,),
            )
        with pytest.raises(sqlite3.IntegrityError, match="payload over 16384 bytes"):
            conn.execute("UPDATE schedlock_publishes SET payload = ? WHERE uid = ?", (big, uid))
        conn.execute("UPDATE schedlock_publishes SET state = 'cancelled' WHERE uid = ?", (uid,))
    finally:
        conn.close()
