"""A broken or hostile app costs bounded time and memory and is recorded as a failed attempt."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed.pg import free_port
from testbed.rows import fetch, insert_rows
from testbed.sidecars import SidecarProcess, wait_for

HUGE = 50 * 1024 * 1024  # 50 MiB: never read into memory


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    request_line = (await reader.readline()).decode(errors="replace")
    path = request_line.split(" ")[1] if " " in request_line else "/"
    while (await reader.readline()) not in (b"\r\n", b""):
        pass  # headers; the body is small and ignored
    try:
        if path == "/garbage":
            writer.write(b"\x00\xffthis is not HTTP at all\r\n\r\n")
        elif path == "/escapes":  # an answer that would clear a terminal and forge lines
            body = b"\x1b[2J\x07boom\x1b]0;owned\x07\rforged\x9b"
            writer.write(
                b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: "
                + str(len(body)).encode()
                + b"\r\n\r\n"
                + body
            )
        elif path == "/redirect":
            writer.write(
                b"HTTP/1.1 302 Found\r\nLocation: http://example.invalid/\r\nContent-Length: 0\r\n\r\n"
            )
        elif path in ("/huge-error", "/huge-ok"):
            status = b"500 Internal Server Error" if path == "/huge-error" else b"200 OK"
            writer.write(
                b"HTTP/1.1 " + status + b"\r\nContent-Length: " + str(HUGE).encode() + b"\r\n\r\n"
            )
            chunk = b"x" * 65536
            for _ in range(HUGE // len(chunk)):
                writer.write(chunk)
                await writer.drain()
        elif path == "/drip":  # the headers never finish: only the timeout ends it
            writer.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
            for _ in range(100000):
                writer.write(b"x")
                await writer.drain()
                await asyncio.sleep(0.05)
        await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


@pytest.fixture(scope="module")
def hostile_port() -> Iterator[int]:
    port = free_port()
    loop = asyncio.new_event_loop()
    server = loop.run_until_complete(asyncio.start_server(handle, "127.0.0.1", port))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield port
    loop.call_soon_threadsafe(server.close)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


def final_state(url: str, uid: str) -> tuple[str, int, str | None, int | None] | None:
    found = fetch(
        url,
        "SELECT state, attempts, last_error, last_status FROM schedlock_publishes "
        "WHERE uid = %s AND state NOT IN ('scheduled', 'firing')",
        uid,
    )
    return None if not found else (found[0][0], found[0][1], found[0][2], found[0][3])


@pytest.mark.parametrize(
    ("path", "state", "error_part", "status"),
    [
        ("/garbage", "failed", "gave up after 2 attempts", None),
        ("/redirect", "failed", "HTTP 302", 302),
        ("/huge-error", "failed", "HTTP 500", 500),
        (
            "/escapes",
            "failed",
            "HTTP 500 from app: \\x1b[2J\\x07boom\\x1b]0;owned\\x07",
            500,
        ),
        ("/huge-ok", "published", None, 200),
        ("/drip", "failed", "timeout after 1s", None),
    ],
)
def test_hostile_answers_are_bounded_and_recorded(
    tmp_path: Path,
    migrated_database: str,
    hostile_port: int,
    path: str,
    state: str,
    error_part: str | None,
    status: int | None,
) -> None:
    sidecar = SidecarProcess(
        "victim",
        tmp_path,
        {
            "SCHEDLOCK_DATABASE_URL": migrated_database,
            "SCHEDLOCK_TARGET": "demo",
            "SCHEDLOCK_TARGET_URL": f"http://127.0.0.1:{hostile_port}{path}",
            "SCHEDLOCK_REQUEST_TIMEOUT_SECONDS": "1",
            # the text format, where a raw control character would reach a terminal
            "SCHEDLOCK_LOG_FORMAT": "text" if path == "/escapes" else "json",
        },
    ).start()
    try:
        [uid] = insert_rows(
            migrated_database,
            1,
            start_in=0.1,
            prefix="hostile",
            max_attempts=2,
            backoff_seconds=0.1,
        )
        began = time.monotonic()
        result = wait_for(
            lambda: final_state(migrated_database, uid),
            timeout=30,
            what=f"the row to finish against {path}",
        )
        assert time.monotonic() - began < 30
        assert result[0] == state, result
        assert result[3] == status, result
        if error_part:
            assert result[2] is not None and error_part in result[2], result
            assert result[2].count("from app") <= 1, result  # said once, not twice
        if path == "/escapes":  # the sidecar's own log line says it escaped, too
            logged = sidecar.log_text()
            assert "\\x1b[2J\\x07boom" in logged and "\x1b" not in logged and "\x07" not in logged
            assert not any(c in result[2] for c in "\x1b\x07\r\n\x9b"), result
        rss_kb = int(
            next(
                line.split()[1]
                for line in Path(f"/proc/{sidecar.pid}/status").read_text().splitlines()
                if line.startswith("VmRSS:")
            )
        )
        assert rss_kb < 150 * 1024, f"sidecar RSS grew to {rss_kb // 1024} MiB"
        assert sidecar.alive()
    finally:
        sidecar.stop()
