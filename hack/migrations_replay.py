#!/usr/bin/env python3
"""Check that reorganised migration files replay to the same database as a git revision's.

    .venv/bin/python hack/migrations_replay.py REV     # e.g. HEAD, origin/main, a release tag

Only migration ids, names and additive flags are recorded (schedlock.store.migrations), so the
files may be reorganised as long as every id replays to the same schema.  This migrates fresh
databases step by step with REV's sources (``git archive``) and with the working tree's: every
id up, every down step back to 0, every id up again, on PostgreSQL (an embedded server, as the
tests start one) in schedlock's schema and in a schema whose name needs quoting, and on SQLite.
After each step it records ``pg_dump`` (schema, ACLs and data but the migrations table) and
the catalog (``pg_get_functiondef`` with each function's settings and ACL, policies, tables'
row security and ACLs, column ACLs, triggers), or SQLite's ``sqlite_master``.  Between steps it
grants a role on the publishes before 0008 (which maps it to ``*``), maps roles to namespaces
after 0008 and grants a sidecar's function after 0010, so that the steps that act on roles
(0008's mapping, 0010's grants and its down step's, 0011's policies) have something to act on.

Exit status 0 when every step matches, 1 with the first differences otherwise.  Run from the
repository root; it leaves nothing running and removes what it wrote.
"""

from __future__ import annotations

import asyncio
import difflib
import os
import re
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

ROLES = ("replay_all", "replay_ns", "replay_one", "replay_side")
CATALOG = """
SELECT 'function', p.oid::regprocedure::text, pg_get_functiondef(p.oid), p.proconfig::text,
       p.proacl::text
FROM pg_proc p WHERE p.pronamespace = quote_ident(%(s)s)::regnamespace
UNION ALL
SELECT 'policy', pol.polrelid::regclass::text || ' ' || pol.polname,
       pol.polpermissive::text || pol.polcmd::text || pol.polroles::regrole[]::text,
       pg_get_expr(pol.polqual, pol.polrelid), pg_get_expr(pol.polwithcheck, pol.polrelid)
FROM pg_policy pol JOIN pg_class c ON c.oid = pol.polrelid
WHERE c.relnamespace = quote_ident(%(s)s)::regnamespace
UNION ALL
SELECT 'relation', c.oid::regclass::text, c.relkind::text,
       c.relrowsecurity::text || c.relforcerowsecurity::text || coalesce(c.reloptions::text, ''),
       c.relacl::text
FROM pg_class c WHERE c.relnamespace = quote_ident(%(s)s)::regnamespace
UNION ALL
SELECT 'trigger', tgrelid::regclass::text || ' ' || tgname, pg_get_triggerdef(oid),
       tgenabled::text, ''
FROM pg_trigger WHERE NOT tgisinternal
UNION ALL
SELECT 'column acl', attrelid::regclass::text || '.' || attname, attacl::text, '', ''
FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
WHERE c.relnamespace = quote_ident(%(s)s)::regnamespace AND attacl IS NOT NULL
ORDER BY 1, 2
"""


def steps(latest: int) -> list[tuple[str, int]]:
    up = [("up", n) for n in range(1, latest + 1)]
    return up + [("down", n) for n in range(latest - 1, -1, -1)] + [("again", n) for _, n in up]


def replay(admin: str, out: Path, bindir: str, latest: int) -> None:
    """In the sources PYTHONPATH names: every step's dump into OUT/<database>/<step>.txt."""
    import psycopg

    from schedlock.store import open_store

    def migrate(url: str, schema: str | None, to: int) -> None:
        async def go() -> None:
            store = open_store(url, schema=schema) if schema else open_store(url)
            try:
                await store.migrate(to=to, force=True)
            finally:
                await store.close()

        asyncio.run(go())

    def sql(url: str, statement: str) -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(statement)

    def dump(url: str, schema: str) -> str:
        text = subprocess.run(
            [f"{bindir}/pg_dump", "--no-owner", "--exclude-table-data=*.schedlock_migrations", url],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        text = "\n".join(s for s in text.splitlines() if not re.match(r"\\(un)?restrict ", s))
        text = re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d+)?\+00", "<timestamp>", text)
        with psycopg.connect(url) as conn:
            rows = conn.execute(CATALOG, {"s": schema}).fetchall()
            ids = conn.execute(
                f'SELECT id, name, additive FROM "{schema}".schedlock_migrations ORDER BY id'
            ).fetchall()
        return f"{text}\n=== catalog\n" + "\n".join(map(repr, rows)) + f"\n=== ids\n{ids!r}\n"

    for role in ROLES:
        sql(admin, f"DO $$ BEGIN CREATE ROLE {role}; EXCEPTION WHEN duplicate_object THEN END $$")
    for label, schema in (("postgres", "schedlock"), ("postgres-quoted-schema", "Sched Lock")):
        name = f"replay_{label.replace('-', '_')}"
        sql(admin, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        sql(admin, f'CREATE DATABASE "{name}" TEMPLATE template0')
        url = admin.rsplit("/", 1)[0] + "/" + name
        q = f'"{schema}"'
        after = {
            7: f"GRANT SELECT, INSERT, UPDATE ON {q}.schedlock_publishes TO replay_all",
            8: f"INSERT INTO {q}.schedlock_namespace_roles (role, namespace) VALUES "
            "('replay_ns', 'a'), ('replay_ns', 'b'), ('replay_one', 'a') ON CONFLICT DO NOTHING",
            10: f"GRANT EXECUTE ON FUNCTION {q}.schedlock_begin_term(text, text, text, text) "
            "TO replay_side",
        }
        (out / label).mkdir(parents=True)
        for i, (kind, n) in enumerate(steps(latest)):
            migrate(url, schema, n)
            if kind != "down" and n in after:
                sql(url, after[n])
            (out / label / f"{i:02d}-{kind}-{n:02d}.txt").write_text(dump(url, schema))
        sql(admin, f'DROP DATABASE "{name}" WITH (FORCE)')
    (out / "sqlite").mkdir(parents=True)
    path = out / "replay.db"
    for i, (kind, n) in enumerate(steps(latest)):
        migrate(f"sqlite:///{path}", None, n)
        db = sqlite3.connect(path)
        try:
            rows = db.execute("SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY 1, 2")
            text = "\n".join(map(repr, rows.fetchall()))
            ids = db.execute("SELECT id, name, additive FROM schedlock_migrations ORDER BY id")
            text += f"\n=== ids\n{ids.fetchall()!r}\n"
        finally:
            db.close()
        (out / "sqlite" / f"{i:02d}-{kind}-{n:02d}.txt").write_text(text)
    path.unlink()


def latest_id(src: Path) -> int:
    code = "from schedlock.store.migrations import latest_id; print(latest_id('postgres'))"
    found = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(src)},
        check=True,
        capture_output=True,
        text=True,
    )
    return int(found.stdout)


def main(rev: str) -> int:
    repo = Path(__file__).resolve().parent.parent
    if str(repo) not in sys.path:  # `python hack/migrations_replay.py` puts hack/ on the path
        sys.path.insert(0, str(repo))
    from testbed.pg import PostgresServer, pg_bindir

    with tempfile.TemporaryDirectory(prefix="migrations-replay-") as tmp:
        work = Path(tmp)
        (work / "rev").mkdir()
        archive = subprocess.run(
            ["git", "archive", rev, "src"], cwd=repo, check=True, capture_output=True
        )
        subprocess.run(["tar", "-x", "-C", str(work / "rev")], input=archive.stdout, check=True)
        sources = {rev: work / "rev" / "src", "working tree": repo / "src"}
        latest = {label: latest_id(src) for label, src in sources.items()}
        if len(set(latest.values())) != 1:
            print(f"the migrations differ in number: {latest}", file=sys.stderr)
            return 1
        server = PostgresServer(workdir=work / "pg")
        server.start()
        try:
            for i, src in enumerate(sources.values()):
                env = {**os.environ, "PYTHONPATH": str(src)}
                args = [server.url(), str(work / f"out{i}"), str(pg_bindir()), str(latest[rev])]
                subprocess.run([sys.executable, __file__, "--replay", *args], env=env, check=True)
        finally:
            server.stop()
            server.destroy()
        before, after = work / "out0", work / "out1"
        files = sorted(p.relative_to(before) for p in before.rglob("*.txt"))
        differing = [f for f in files if (before / f).read_text() != (after / f).read_text()]
        for f in differing[:3]:
            old, new = (before / f).read_text(), (after / f).read_text()
            diff = difflib.unified_diff(old.splitlines(), new.splitlines(), rev, "working tree")
            print(f"== {f}", *list(diff)[:60], sep="\n")
        print(f"{len(files) - len(differing)} of {len(files)} steps replay as {rev}'s")
        return 1 if differing or not files else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--replay"]:
        admin, out, bindir, latest = sys.argv[2:6]
        replay(admin, Path(out), bindir, int(latest))
    elif len(sys.argv) == 2:
        sys.exit(main(sys.argv[1]))
    else:
        sys.exit(__doc__)
