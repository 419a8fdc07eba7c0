"""A real Kubernetes API server for tests, started the way controller-runtime's envtest does it.

etcd and kube-apiserver run as real processes on free loopback ports, with a throwaway PKI
(CA, serving cert, admin client cert, service-account signing key) and RBAC authorization
switched on. No controller-manager, scheduler or kubelet runs: objects are stored and
validated, RBAC is evaluated, but nothing reconciles them (pods never start, namespaces never
finish terminating, service accounts get no automatic token secrets).

The point of RBAC being on is `service_account_kubeconfig()`: a test can run a component with a
bearer token for exactly the ServiceAccount the chart gives it, so a missing rule in the chart's
Role fails the test instead of passing silently with admin rights.

The constructor's other options (bind and advertise address, extra serving-cert SANs, service
CIDR, authorization modes, ServiceAccount admission, extra flags) and `issue_cert()` /
`client_kubeconfig()` serve `testbed.cluster`, which runs a real node against this same
server; the defaults keep the envtest-style bed described above.

This module has no pytest dependency so a dev-stack script can use it too.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from base64 import b64encode
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID

from testbed.certs import (
    ca_extensions,
    general_name,
    issue,
    leaf_extensions,
    new_ec_key,
    pem_cert,
    pem_key,
    write_private,
    x509_name,
)
from testbed.procs import StartStop, die_with_parent
from testbed.tools import ToolMissing, tool_dir

__all__ = [
    "KubeAPIServer",
    "KubeAPIServerError",
    "KubeToolsMissingError",
    "KubectlError",
    "resolve_tool_dir",
]

REPO_ROOT = Path(__file__).resolve().parents[1]
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
_STOP_GRACE_SECONDS = 5.0
_LOG_TAIL_LINES = 40
_BIND_RETRIES = 3

KubeManifest = str | Mapping[str, Any] | list[Mapping[str, Any]]


class KubeToolsMissingError(RuntimeError):
    """The pinned etcd / kube-apiserver / kubectl binaries are not built yet."""


class KubeAPIServerError(RuntimeError):
    """etcd or kube-apiserver did not come up; the message carries the tail of their logs."""


class _PortInUseError(KubeAPIServerError):
    """A process lost the race for a port picked as free; start() retries with new ports."""


class KubectlError(subprocess.CalledProcessError):
    """A kubectl call failed; unlike CalledProcessError, str() shows kubectl's stderr."""

    def __str__(self) -> str:
        return f"{super().__str__()}\nstderr:\n{self.stderr}\nstdout:\n{self.stdout}"


# --------------------------------------------------------------------------- binaries


def resolve_tool_dir(tool: str) -> Path:
    """Where hack/tools.sh puts TOOL, so KUBEBUILDER_ASSETS and the pinned versions apply."""
    try:
        return tool_dir(tool)
    except ToolMissing as exc:
        raise KubeToolsMissingError(str(exc)) from exc


def _binary(explicit: Path | None, tool: str) -> Path:
    """Return an executable path for TOOL or explain how to build it."""
    path = explicit if explicit is not None else resolve_tool_dir(tool) / tool
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise KubeToolsMissingError(
            f"{tool} not found at {path}. Build the pinned test tools with `make test` or "
            "`bash hack/tools.sh ensure kube-apiserver etcd kubectl` "
            "(or point KUBEBUILDER_ASSETS at a directory holding them)."
        )
    return path


# --------------------------------------------------------------------------- PKI


@dataclass(frozen=True)
class _Pki:
    """Paths of the PEM files the processes and clients need."""

    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    admin_cert: Path
    admin_key: Path
    sa_public_key: Path
    sa_private_key: Path
    kubelet_client_cert: Path
    kubelet_client_key: Path


def _generate_pki(certdir: Path, extra_sans: Sequence[str] = ()) -> _Pki:
    """Create the CA, serving, admin and kubelet-client certs and the service-account keys."""
    certdir.mkdir(parents=True, exist_ok=True)
    ca_key, ca_name = new_ec_key(), x509_name("schedlock-testbed-ca")
    ca_cert = issue(ca_name, ca_key, None, ca_extensions())
    ca = (ca_name, ca_key)

    serving_key = new_ec_key()
    sans = x509.SubjectAlternativeName(
        [general_name(host) for host in dict.fromkeys(["localhost", "127.0.0.1", *extra_sans])]
    )
    serving_extensions = [*leaf_extensions(ExtendedKeyUsageOID.SERVER_AUTH), (sans, False)]
    serving_cert = issue(x509_name("kube-apiserver"), serving_key, ca, serving_extensions)

    # O=system:masters is what makes this client cluster-admin regardless of RBAC objects.
    admin_key = new_ec_key()
    admin_extensions = leaf_extensions(ExtendedKeyUsageOID.CLIENT_AUTH)
    admin_cert = issue(x509_name("admin", "system:masters"), admin_key, ca, admin_extensions)

    # What the API server presents to kubelets (exec, logs, port-forward), as kubeadm does.
    kubelet_client_key = new_ec_key()
    kubelet_client_cert = issue(
        x509_name("kube-apiserver-kubelet-client", "system:masters"),
        kubelet_client_key,
        ca,
        admin_extensions,
    )

    # The service-account signer: RSA, as envtest and kubeadm use.
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    sa_public = sa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return _Pki(
        ca_cert=write_private(certdir / "ca.crt", pem_cert(ca_cert)),
        ca_key=write_private(certdir / "ca.key", pem_key(ca_key)),
        serving_cert=write_private(certdir / "apiserver.crt", pem_cert(serving_cert)),
        serving_key=write_private(certdir / "apiserver.key", pem_key(serving_key)),
        admin_cert=write_private(certdir / "admin.crt", pem_cert(admin_cert)),
        admin_key=write_private(certdir / "admin.key", pem_key(admin_key)),
        sa_public_key=write_private(certdir / "sa.pub", sa_public),
        sa_private_key=write_private(certdir / "sa.key", pem_key(sa_key)),
        kubelet_client_cert=write_private(
            certdir / "apiserver-kubelet-client.crt", pem_cert(kubelet_client_cert)
        ),
        kubelet_client_key=write_private(
            certdir / "apiserver-kubelet-client.key", pem_key(kubelet_client_key)
        ),
    )


def _load_ca(pki: _Pki) -> tuple[x509.Name, ec.EllipticCurvePrivateKey]:
    cert = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise KubeAPIServerError(f"{pki.ca_key} is not the EC key _generate_pki writes")
    return cert.subject, key


# --------------------------------------------------------------------------- processes


def _free_ports(count: int) -> list[int]:
    """Pick COUNT distinct free loopback ports by holding them all bound at once.

    There is a window between closing these sockets and the servers binding them; start()
    retries on "address already in use" to cover it.
    """
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]


def _tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def spawn_process(
    args: Sequence[str], log: Path, *, cwd: Path, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start a server in its own session (so its whole group can be killed), logging to LOG.

    PR_SET_PDEATHSIG kills it with the spawning thread, so a crashed test run leaves no server.
    """
    with log.open("ab") as out:
        return subprocess.Popen(
            list(args),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=None if env is None else dict(env),
            start_new_session=True,
            preexec_fn=die_with_parent(),
        )


def _stop_process(proc: subprocess.Popen[bytes], grace: float = _STOP_GRACE_SECONDS) -> None:
    """SIGTERM the process group, SIGKILL it after GRACE seconds, and reap the leader."""
    pgid = proc.pid  # start_new_session=True made the child a group leader
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, None)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, sig)
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        break
    # Whatever the leader may have forked goes too.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


_RUNNING: set[KubeAPIServer] = set()


@atexit.register
def _stop_all_at_exit() -> None:
    """Stop instances a test run forgot (or could not) stop before the interpreter exits."""
    for server in list(_RUNNING):
        server.stop()


# --------------------------------------------------------------------------- the server


class KubeAPIServer(StartStop):
    """etcd + kube-apiserver with RBAC, an admin kubeconfig and per-ServiceAccount kubeconfigs.

    Usage::

        with KubeAPIServer(tmp_dir) as kube:
            kube.apply({"apiVersion": "v1", "kind": "ConfigMap", ...})
            sa_config = kube.service_account_kubeconfig("ns", "operator")
            kube.kubectl("get", "pods", "-n", "ns", kubeconfig=sa_config, check=False)
    """

    def __init__(
        self,
        workdir: Path,
        *,
        etcd_bin: Path | None = None,
        apiserver_bin: Path | None = None,
        kubectl_bin: Path | None = None,
        bind_address: str = "127.0.0.1",
        advertise_address: str = "127.0.0.1",
        extra_sans: Sequence[str] = (),
        service_cluster_ip_range: str = SERVICE_CLUSTER_IP_RANGE,
        authorization_modes: Sequence[str] = ("RBAC",),
        service_account_admission: bool = False,
        extra_args: Sequence[str] = (),
    ) -> None:
        """The defaults are the envtest-style bed; a real node needs the other options.

        BIND_ADDRESS is where the secure port listens (``0.0.0.0`` to serve pods too; clients
        on the host keep using ``url``, 127.0.0.1). ADVERTISE_ADDRESS becomes the endpoint of
        the ``kubernetes`` Service. EXTRA_SANS are added to the serving cert (IPs or DNS
        names). SERVICE_ACCOUNT_ADMISSION turns the ServiceAccount admission plugin back on,
        which only works when a controller-manager creates the ``default`` ServiceAccounts.
        EXTRA_ARGS go last on the kube-apiserver command line.
        """
        self.workdir = Path(workdir).resolve()
        self.bind_address = bind_address
        self.advertise_address = advertise_address
        self.extra_sans = tuple(extra_sans)
        self.service_cluster_ip_range = service_cluster_ip_range
        self.authorization_modes = tuple(authorization_modes)
        self.service_account_admission = service_account_admission
        self.extra_args = tuple(extra_args)
        self.etcd_bin = _binary(etcd_bin, "etcd")
        self.apiserver_bin = _binary(apiserver_bin, "kube-apiserver")
        self.kubectl_bin = _binary(kubectl_bin, "kubectl")
        self.certdir = self.workdir / "pki"
        self.kubeconfig_dir = self.workdir / "kubeconfigs"
        self.etcd_data = self.workdir / "etcd-data"
        self.etcd_log = self.workdir / "etcd.log"
        self.apiserver_log = self.workdir / "kube-apiserver.log"
        self._pki: _Pki | None = None
        self._port: int | None = None
        self._etcd: subprocess.Popen[bytes] | None = None
        self._apiserver: subprocess.Popen[bytes] | None = None
        self._ssl_context: ssl.SSLContext | None = None

    # ----------------------------------------------------------------- properties

    @property
    def url(self) -> str:
        """https://127.0.0.1:PORT of the secure port (the only one a modern API server has)."""
        if self._port is None:
            raise KubeAPIServerError("KubeAPIServer is not started")
        return f"https://127.0.0.1:{self._port}"

    @property
    def ca_path(self) -> Path:
        """PEM of the CA that signed the serving cert (and the admin client cert)."""
        return self._require_pki().ca_cert

    @property
    def ca_key_path(self) -> Path:
        """PEM of the CA's private key (a controller-manager signs CSRs with it)."""
        return self._require_pki().ca_key

    @property
    def service_account_key_paths(self) -> tuple[Path, Path]:
        """(public, private) PEM of the service-account token signing key."""
        pki = self._require_pki()
        return pki.sa_public_key, pki.sa_private_key

    @property
    def admin_kubeconfig(self) -> Path:
        """Kubeconfig with embedded CA and the system:masters client cert/key."""
        return self.kubeconfig_dir / "admin.yaml"

    @property
    def pids(self) -> dict[str, int]:
        """PIDs of the running processes by name; empty once stopped."""
        procs = {"etcd": self._etcd, "kube-apiserver": self._apiserver}
        return {name: p.pid for name, p in procs.items() if p is not None}

    @property
    def running(self) -> bool:
        return self._apiserver is not None and self._apiserver.poll() is None

    # ----------------------------------------------------------------- lifecycle

    def start(self, timeout: float = 60) -> None:
        """Generate the PKI, start etcd and kube-apiserver, and wait until they serve.

        Ports are picked free just before launch; if a process still loses a port to someone
        else, everything is stopped and retried on fresh ports.
        """
        if self._apiserver is not None:
            raise KubeAPIServerError("KubeAPIServer is already started")
        self.workdir.mkdir(parents=True, exist_ok=True)
        # A restart gets a fresh cluster: old data would hold tokens signed by the old key.
        shutil.rmtree(self.etcd_data, ignore_errors=True)
        self._pki = _generate_pki(self.certdir, self.extra_sans)
        self._ssl_context = None  # it trusts and presents the previous PKI
        deadline = time.monotonic() + timeout
        for attempt in range(1, _BIND_RETRIES + 1):
            try:
                self._start_once(deadline)
            except _PortInUseError:
                self.stop()
                if attempt == _BIND_RETRIES:
                    raise
            except BaseException:
                self.stop()
                raise
            else:
                return

    def _start_once(self, deadline: float) -> None:
        etcd_client, etcd_peer, secure_port = _free_ports(3)
        # Logs of an earlier attempt would make this attempt's failure report misleading.
        self.etcd_log.unlink(missing_ok=True)
        self.apiserver_log.unlink(missing_ok=True)
        _RUNNING.add(self)
        self._etcd = self._spawn(self._etcd_args(etcd_client, etcd_peer), self.etcd_log)
        self._wait_for(deadline, "etcd", lambda: self._etcd_healthy(etcd_client))
        self._port = secure_port
        self._write_admin_kubeconfig()
        self._apiserver = self._spawn(
            self._apiserver_args(secure_port, etcd_client), self.apiserver_log
        )
        self._wait_for(deadline, "kube-apiserver /readyz", self._readyz_ok)
        self._wait_for(deadline, "namespace default", self._ensure_default_namespace)

    def stop(self) -> None:
        """Stop kube-apiserver, then etcd (the API server hangs on shutdown without etcd)."""
        if self._apiserver is not None:
            _stop_process(self._apiserver)
            self._apiserver = None
        if self._etcd is not None:
            _stop_process(self._etcd)
            self._etcd = None
        _RUNNING.discard(self)

    # ----------------------------------------------------------------- process plumbing

    def _etcd_args(self, client_port: int, peer_port: int) -> list[str]:
        client = f"http://127.0.0.1:{client_port}"
        peer = f"http://127.0.0.1:{peer_port}"
        return [
            str(self.etcd_bin),
            "--name=default",
            f"--data-dir={self.etcd_data}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=default={peer}",
            "--unsafe-no-fsync",
            "--log-level=warn",
        ]

    def _apiserver_args(self, secure_port: int, etcd_client_port: int) -> list[str]:
        pki = self._require_pki()
        args = [
            str(self.apiserver_bin),
            f"--etcd-servers=http://127.0.0.1:{etcd_client_port}",
            f"--secure-port={secure_port}",
            f"--bind-address={self.bind_address}",
            f"--advertise-address={self.advertise_address}",
            f"--cert-dir={self.certdir}",
            f"--tls-cert-file={pki.serving_cert}",
            f"--tls-private-key-file={pki.serving_key}",
            f"--client-ca-file={pki.ca_cert}",
            f"--kubelet-client-certificate={pki.kubelet_client_cert}",
            f"--kubelet-client-key={pki.kubelet_client_key}",
            f"--kubelet-certificate-authority={pki.ca_cert}",
            f"--authorization-mode={','.join(self.authorization_modes)}",
            f"--service-account-issuer=https://127.0.0.1:{secure_port}",
            f"--service-account-key-file={pki.sa_public_key}",
            f"--service-account-signing-key-file={pki.sa_private_key}",
            f"--service-cluster-ip-range={self.service_cluster_ip_range}",
            "--allow-privileged=true",
        ]
        if not self.service_account_admission:
            # As envtest: no controller-manager runs, so nothing would create the `default`
            # ServiceAccount and the admission plugin would reject every pod.
            args.append("--disable-admission-plugins=ServiceAccount")
        return [*args, *self.extra_args]

    def _spawn(self, args: list[str], log: Path) -> subprocess.Popen[bytes]:
        return spawn_process(args, log, cwd=self.workdir)

    def _wait_for(self, deadline: float, what: str, probe: Callable[[], bool]) -> None:
        """Poll PROBE until it is true; fail early, with logs, if a process has exited."""
        while True:
            self._raise_if_exited()
            if probe():
                return
            if time.monotonic() > deadline:
                raise KubeAPIServerError(f"timed out waiting for {what}\n{self._logs()}")
            time.sleep(0.1)

    def _raise_if_exited(self) -> None:
        for name, proc, log in (
            ("etcd", self._etcd, self.etcd_log),
            ("kube-apiserver", self._apiserver, self.apiserver_log),
        ):
            if proc is None or proc.poll() is None:
                continue
            error = _PortInUseError if "address already in use" in _tail(log) else None
            message = f"{name} exited with code {proc.returncode}\n{self._logs()}"
            raise (error or KubeAPIServerError)(message)

    def _logs(self) -> str:
        return (
            f"--- tail of {self.etcd_log}\n{_tail(self.etcd_log)}\n"
            f"--- tail of {self.apiserver_log}\n{_tail(self.apiserver_log)}"
        )

    # ----------------------------------------------------------------- HTTP probes

    def _etcd_healthy(self, client_port: int) -> bool:
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{client_port}/health", timeout=2
            ) as response:
                return bool(json.load(response).get("health") == "true")
        except (OSError, ValueError):
            return False

    def _admin_ssl_context(self) -> ssl.SSLContext:
        """TLS context trusting our CA and presenting the admin client cert."""
        if self._ssl_context is None:
            pki = self._require_pki()
            context = ssl.create_default_context(cafile=str(pki.ca_cert))
            context.load_cert_chain(str(pki.admin_cert), str(pki.admin_key))
            self._ssl_context = context
        return self._ssl_context

    def request(self, method: str, path: str, body: object | None = None) -> tuple[int, bytes]:
        """Call the API as admin; returns (status, body), raising only on transport errors."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.url}{path}", data=data, method=method)
        request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(
                request, context=self._admin_ssl_context(), timeout=5
            ) as response:
                return int(response.status), bytes(response.read())
        except urllib.error.HTTPError as error:
            return int(error.code), bytes(error.read())

    def wait_established(self, crd: str, timeout: float = 60) -> None:
        """Wait until the CustomResourceDefinition ``crd`` is Established (its kind served).

        Not ``kubectl wait --for=condition=Established``: right after the create, before the
        API server wrote a status, that fails at once ("accessor error: <nil> is of the type
        <nil>") instead of waiting.
        """
        deadline = time.monotonic() + timeout
        path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}"
        while True:
            status, body = self.request("GET", path)
            conditions = (json.loads(body).get("status") or {}).get("conditions") or []
            if status == 200 and any(
                c.get("type") == "Established" and c.get("status") == "True" for c in conditions
            ):
                return
            if time.monotonic() > deadline:
                raise KubeAPIServerError(
                    f"CRD {crd} not Established within {timeout:g} s: {status} {body[:500]!r}"
                )
            time.sleep(0.1)

    def _readyz_ok(self) -> bool:
        try:
            status, body = self.request("GET", "/readyz")
        except OSError:
            return False
        return status == 200 and body.strip() == b"ok"

    def _ensure_default_namespace(self) -> bool:
        """The API server's bootstrap controller creates `default`; create it if it lags."""
        try:
            status, _ = self.request("GET", "/api/v1/namespaces/default")
            if status == 404:
                body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}}
                status, _ = self.request("POST", "/api/v1/namespaces", body)
        except OSError:
            return False
        return status in (200, 201, 409)

    # ----------------------------------------------------------------- kubeconfigs

    def _require_pki(self) -> _Pki:
        if self._pki is None:
            raise KubeAPIServerError("KubeAPIServer is not started")
        return self._pki

    def _kubeconfig(self, user_name: str, user: dict[str, str]) -> dict[str, Any]:
        ca_data = b64encode(self.ca_path.read_bytes()).decode()
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "testbed",
                    "cluster": {"server": self.url, "certificate-authority-data": ca_data},
                }
            ],
            "users": [{"name": user_name, "user": user}],
            "contexts": [{"name": user_name, "context": {"cluster": "testbed", "user": user_name}}],
            "current-context": user_name,
        }

    def _write_kubeconfig(self, path: Path, config: dict[str, Any]) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        return write_private(path, yaml.safe_dump(config, sort_keys=False).encode())

    def _write_admin_kubeconfig(self) -> None:
        pki = self._require_pki()
        user = _cert_user(pki.admin_cert, pki.admin_key)
        self._write_kubeconfig(self.admin_kubeconfig, self._kubeconfig("admin", user))

    def issue_cert(
        self,
        name: str,
        common_name: str,
        organization: str | None = None,
        *,
        server_hosts: Sequence[str] = (),
    ) -> tuple[Path, Path]:
        """Sign a cert for COMMON_NAME (in group ORGANIZATION) with the test CA.

        A client cert by default; with SERVER_HOSTS (IPs or DNS names) a serving cert for
        them. Returns the (cert, key) PEM paths, ``pki/NAME.crt`` and ``pki/NAME.key``.
        """
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server_hosts else ExtendedKeyUsageOID.CLIENT_AUTH
        extensions = leaf_extensions(usage)
        if server_hosts:
            sans = [general_name(host) for host in server_hosts]
            extensions.append((x509.SubjectAlternativeName(sans), False))
        key = new_ec_key()
        ca = _load_ca(self._require_pki())
        cert = issue(x509_name(common_name, organization), key, ca, extensions)
        return (
            write_private(self.certdir / f"{name}.crt", pem_cert(cert)),
            write_private(self.certdir / f"{name}.key", pem_key(key)),
        )

    def client_kubeconfig(
        self, name: str, common_name: str, organization: str | None = None
    ) -> Path:
        """Write ``kubeconfigs/NAME.yaml`` authenticating by a client cert for COMMON_NAME.

        How the node's components log in (system:kube-scheduler, system:node:NAME in
        system:nodes…): the API server's built-in RBAC roles and the Node authorizer key on
        exactly these names.
        """
        user = _cert_user(*self.issue_cert(name, common_name, organization))
        path = self.kubeconfig_dir / f"{name}.yaml"
        return self._write_kubeconfig(path, self._kubeconfig(common_name, user))

    def service_account_kubeconfig(
        self, namespace: str, name: str, *, create: bool = True, duration: str = "24h"
    ) -> Path:
        """Write a kubeconfig authenticating as ServiceAccount NAMESPACE/NAME by bearer token.

        There is no client cert in it, so whatever the token's RBAC bindings allow is exactly
        what a component run with it can do. With CREATE (the default) the namespace and the
        ServiceAccount are created first if missing.
        """
        if create:
            self.apply(
                [
                    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
                    {
                        "apiVersion": "v1",
                        "kind": "ServiceAccount",
                        "metadata": {"name": name, "namespace": namespace},
                    },
                ]
            )
        token = self.kubectl(
            "create", "token", name, "-n", namespace, f"--duration={duration}"
        ).stdout.strip()
        user_name = f"system:serviceaccount:{namespace}:{name}"
        path = self.kubeconfig_dir / f"sa-{namespace}-{name}.yaml"
        return self._write_kubeconfig(path, self._kubeconfig(user_name, {"token": token}))

    # ----------------------------------------------------------------- kubectl

    def kubectl(
        self,
        *args: str,
        kubeconfig: Path | None = None,
        input: str | None = None,
        check: bool = True,
        timeout: float = 120,
    ) -> subprocess.CompletedProcess[str]:
        """Run the pinned kubectl, as admin unless KUBECONFIG is given.

        The discovery cache lives in the workdir: ports get reused across runs, and a cache
        under ~/.kube keyed by host:port would describe some earlier server's API.
        """
        config = kubeconfig if kubeconfig is not None else self.admin_kubeconfig
        command = [
            str(self.kubectl_bin),
            f"--kubeconfig={config}",
            f"--cache-dir={self.workdir / 'kubectl-cache'}",
            *args,
        ]
        result = subprocess.run(
            command, input=input, capture_output=True, text=True, check=False, timeout=timeout
        )
        if check and result.returncode != 0:
            raise KubectlError(result.returncode, command, result.stdout, result.stderr)
        return result

    def apply(
        self, manifest: KubeManifest, kubeconfig: Path | None = None, *, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """`kubectl apply -f -` of a YAML string, one object, or a list of objects."""
        return self.kubectl(
            "apply", "-f", "-", kubeconfig=kubeconfig, input=_to_yaml(manifest), check=check
        )


def _cert_user(cert: Path, key: Path) -> dict[str, str]:
    """A kubeconfig user that logs in with the client cert CERT (key KEY), both embedded."""
    return {
        "client-certificate-data": b64encode(cert.read_bytes()).decode(),
        "client-key-data": b64encode(key.read_bytes()).decode(),
    }


def _to_yaml(manifest: KubeManifest) -> str:
    if isinstance(manifest, str):
        return manifest
    documents: Iterator[Mapping[str, Any]] = (
        iter(manifest) if isinstance(manifest, list) else iter([manifest])
    )
    return yaml.safe_dump_all([dict(doc) for doc in documents], sort_keys=False)
