"""Delivery policy with a real sidecar and a real app: retries, failures, deadlines, signatures."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from schedlock.operator.injection import InjectionConfig, inject_pod
from testbed.rows import fetch, insert_rows
from testbed.sidecars import SidecarGroup, wait_for

SECRET = b"s3cret-signing-key"


@pytest.fixture
def app(tmp_path: Path, migrated_database: str) -> Iterator[SidecarGroup]:
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET + b"\n")
    group = SidecarGroup(
        tmp_path,
        migrated_database,
        replicas=1,
        extra_env={
            "SCHEDLOCK_REQUEST_TIMEOUT_SECONDS": "0.5",
            "SCHEDLOCK_SIGNING_SECRET_FILE": str(secret),
        },
    ).start()
    try:
        yield group
    finally:
        group.stop()


def states(url: str, prefix: str) -> dict[str, tuple[str, int, str | None, int | None]]:
    rows = fetch(
        url,
        "SELECT uid, state, attempts, last_error, last_status FROM schedlock_publishes "
        "WHERE uid LIKE %s",
        prefix + "-%",
    )
    return {r[0]: (r[1], r[2], r[3], r[4]) for r in rows}


def settled(
    url: str, prefix: str, count: int, timeout: float
) -> dict[str, tuple[str, int, str | None, int | None]]:
    """The states of the ``count`` rows of ``prefix`` once none is still scheduled or firing."""

    def finished() -> dict[str, tuple[str, int, str | None, int | None]] | None:
        got = states(url, prefix)
        done = len(got) == count and all(s[0] not in ("scheduled", "firing") for s in got.values())
        return got if done else None

    settled: dict[str, tuple[str, int, str | None, int | None]] = wait_for(
        finished, timeout=timeout, what=f"the {count} rows {prefix}-* to finish"
    )
    return settled


def test_success_is_published_once_and_signed(app: SidecarGroup, migrated_database: str) -> None:
    insert_rows(migrated_database, 5, start_in=0.2, spacing=0.05, prefix="ok")
    assert {s[0] for s in settled(migrated_database, "ok", 5, timeout=20).values()} == {"published"}
    assert app.receiver is not None
    entries = app.receiver.entries()
    assert len(entries) == 5
    for entry in entries:
        assert str(entry["key"]).startswith(f"{entry['uid']}/")
        signature = str(entry["signature"])
        timestamp, mac = dict(p.split("=", 1) for p in signature.split(",")).values()
        assert timestamp.isdigit()
        assert len(mac) == 64


SIDECAR_UID = 65532  # the injected sidecar's runAsUser and runAsGroup


def project_like_the_kubelet(root: Path, value: bytes, fs_group: int | None = None) -> Path:
    """The signing key where an injected sidecar reads it, laid out below ``root`` as the kubelet
    projects a secret volume: the file ``SCHEDLOCK_SIGNING_SECRET_FILE`` names, in the sidecar's
    mount, behind the ``..data`` symlinks, with the volume's mode, owned by root and, when the
    pod has an fsGroup, by that group with group read added (what the kubelet does)."""
    metadata = {
        "annotations": {"schedlock.dev/signing-secret": "hmac"},
        "labels": {"schedlock.dev/inject": "true", "app.kubernetes.io/name": "demo"},
    }
    spec: dict[str, object] = {"containers": [{"name": "app", "image": "app:1"}]}
    if fs_group is not None:
        spec["securityContext"] = {"fsGroup": fs_group}
    injected = inject_pod(metadata, spec, InjectionConfig())
    assert injected is not None
    [sidecar] = injected[1]["initContainers"]
    [volume] = injected[1]["volumes"]
    [mount] = sidecar["volumeMounts"]
    [item] = volume["secret"]["items"]
    env = {e["name"]: e.get("value") for e in sidecar["env"]}
    mount_dir = root / mount["mountPath"].lstrip("/")
    timestamped = mount_dir / "..2026_01_01_00_00_00.000000001"
    timestamped.mkdir(parents=True)
    (timestamped / item["path"]).write_bytes(value)
    mode = volume["secret"]["defaultMode"]
    if fs_group is not None:
        os.chown(timestamped / item["path"], -1, fs_group)
        mode |= 0o440
    (timestamped / item["path"]).chmod(mode)
    (mount_dir / "..data").symlink_to(timestamped.name)
    (mount_dir / item["path"]).symlink_to(f"..data/{item['path']}")
    return root / str(env["SCHEDLOCK_SIGNING_SECRET_FILE"]).lstrip("/")


@pytest.mark.skipif(os.geteuid() != 0, reason="reads as the sidecar's uid: needs root")
@pytest.mark.parametrize("fs_group", [None, 2000], ids=["no-fsGroup", "fsGroup"])
def test_the_sidecar_user_can_read_the_key_the_injector_mounts(fs_group: int | None) -> None:
    root = Path(tempfile.mkdtemp())
    root.chmod(0o755)  # a mount point the sidecar can traverse

    def read_as_sidecar(path: Path) -> subprocess.CompletedProcess[bytes]:
        # The kubelet adds the pod's fsGroup to every container's groups.
        groups = [] if fs_group is None else [fs_group]
        return subprocess.run(
            ["cat", str(path)],
            user=SIDECAR_UID,
            group=SIDECAR_UID,
            extra_groups=groups,
            capture_output=True,
            check=False,
        )

    try:
        path = project_like_the_kubelet(root, SECRET, fs_group)
        read = read_as_sidecar(path)
        assert (read.returncode, read.stdout) == (0, SECRET), read.stderr
        if fs_group is None:
            path.chmod(0o440)  # what a "tighter" mode would give: root's alone without fsGroup
            assert read_as_sidecar(path).returncode != 0
    finally:
        shutil.rmtree(root)


def test_signature_verifies_with_the_documented_scheme(
    tmp_path: Path, migrated_database: str
) -> None:
    """t=<unix>,v1=hex(HMAC-SHA256(secret, "<t>." + raw body)) — recomputed from the raw body,
    by a sidecar that reads its key where and as the injector mounts it."""
    import asyncio
    import threading

    from aiohttp import web  # a custom app that sees the raw body

    from testbed.pg import free_port
    from testbed.sidecars import SidecarProcess

    port = free_port()
    seen: list[bool] = []
    loop = asyncio.new_event_loop()

    async def hook(request: web.Request) -> web.Response:
        body = await request.read()
        parts = dict(p.split("=", 1) for p in request.headers["X-Schedlock-Signature"].split(","))
        expected = hmac.new(SECRET, f"{parts['t']}.".encode() + body, hashlib.sha256).hexdigest()
        seen.append(hmac.compare_digest(expected, parts["v1"]))
        json.loads(body)
        return web.Response(text="ok")

    async def serve() -> web.AppRunner:
        application = web.Application()
        application.router.add_post("/schedlock", hook)
        runner = web.AppRunner(application)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        return runner

    runner = loop.run_until_complete(serve())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    secret = project_like_the_kubelet(tmp_path / "pod", SECRET)
    sidecar = SidecarProcess(
        "signer",
        tmp_path,
        {
            "SCHEDLOCK_DATABASE_URL": migrated_database,
            "SCHEDLOCK_TARGET": "demo",
            "SCHEDLOCK_TARGET_URL": f"http://127.0.0.1:{port}/schedlock",
            "SCHEDLOCK_SIGNING_SECRET_FILE": str(secret),
        },
    ).start()
    try:
        insert_rows(migrated_database, 3, start_in=0.1, prefix="sig")
        wait_for(lambda: len(seen) == 3, timeout=20, what="three signed deliveries")
        assert all(seen)
    finally:
        sidecar.stop()
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


def test_5xx_is_retried_with_the_same_key(app: SidecarGroup, migrated_database: str) -> None:
    assert app.receiver is not None
    app.receiver.control(fail_first=2)
    insert_rows(
        migrated_database, 3, start_in=0.2, prefix="retry", max_attempts=5, backoff_seconds=0.1
    )
    for state, attempts, _, status in settled(migrated_database, "retry", 3, timeout=30).values():
        assert (state, attempts, status) == ("published", 3, 200)
    by_uid: dict[str, list[dict[str, object]]] = {}
    for entry in app.receiver.entries():
        by_uid.setdefault(str(entry["uid"]), []).append(entry)
    for got in by_uid.values():
        assert [e["status"] for e in got] == [503, 503, 200]
        assert [e["attempt"] for e in got] == [1, 2, 3]
        assert len({e["key"] for e in got}) == 1


@pytest.mark.parametrize(
    ("answer", "max_attempts", "tried", "says"),
    [
        pytest.param(404, 5, 1, "HTTP 404", id="other-4xx-fails-at-once"),
        pytest.param(503, 3, 3, "gave up after 3 attempts", id="retries-give-up-at-the-limit"),
    ],
)
def test_a_refused_fire_fails_after_its_attempts(
    app: SidecarGroup, migrated_database: str, answer: int, max_attempts: int, tried: int, says: str
) -> None:
    assert app.receiver is not None
    app.receiver.control(status=answer)
    prefix = f"answered-{answer}"
    insert_rows(
        migrated_database,
        2,
        start_in=0.2,
        prefix=prefix,
        max_attempts=max_attempts,
        backoff_seconds=0.05,
    )
    for state, attempts, error, status in settled(
        migrated_database, prefix, 2, timeout=30
    ).values():
        assert (state, attempts, status) == ("failed", tried, answer)
        assert error is not None and says in error


def test_a_hanging_app_times_out_and_is_retried(app: SidecarGroup, migrated_database: str) -> None:
    assert app.receiver is not None
    app.receiver.control(hang=True)
    insert_rows(
        migrated_database, 1, start_in=0.1, prefix="hang", max_attempts=2, backoff_seconds=0.05
    )
    [(state, attempts, error, status)] = settled(migrated_database, "hang", 1, timeout=30).values()
    assert (state, attempts, status) == ("failed", 2, None)
    assert error is not None and "timeout after 0.5s" in error


def test_past_the_starting_deadline_is_missed_not_fired(
    app: SidecarGroup, migrated_database: str
) -> None:
    insert_rows(migrated_database, 2, start_in=-30, prefix="late", deadline_seconds=5)
    insert_rows(migrated_database, 1, start_in=-3, prefix="intime", deadline_seconds=60)
    late = settled(migrated_database, "late", 2, timeout=20)
    assert [s[0] for s in settled(migrated_database, "intime", 1, timeout=20).values()] == [
        "published"
    ]
    for state, attempts, error, _ in late.values():
        assert (state, attempts) == ("missed", 0)
        assert error is not None and "starting deadline of 5s passed" in error
    assert app.receiver is not None
    assert {str(e["uid"]).split("-")[0] for e in app.receiver.entries()} == {"intime"}


WEIRD = (
    'it\'s "quoted" — ünïcødé 🚀; DROP TABLE schedlock_publishes;-- \\n {"json": [1]} %s %(x)s $1'
)


def test_metacharacters_round_trip_intact(app: SidecarGroup, migrated_database: str) -> None:
    import asyncio
    from datetime import UTC, datetime, timedelta

    from schedlock.store import PublishSpec, open_store

    payload = {WEIRD: WEIRD, "nested": {"list": [WEIRD, None, 1.5, True]}, "empty": ""}
    spec = PublishSpec(
        namespace="default",
        name=WEIRD,
        uid="weird-" + "ü" * 3,
        target="demo",
        due_at=datetime.now(UTC) + timedelta(seconds=0.2),
        payload=payload,
    )
    asyncio.run(open_store(migrated_database).upsert_publish(spec))
    receiver = app.receiver
    assert receiver is not None
    [entry] = wait_for(
        lambda: [e for e in receiver.entries() if e["uid"] == spec.uid],
        timeout=15,
        what="the weird row",
    )
    assert entry["payload"] == payload
    assert entry["name"] == WEIRD
    assert entry["key"].startswith(spec.uid + "/")
