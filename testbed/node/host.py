"""The host state the node changes, captured before it changes anything and put back after.

Invariant: whatever the node adds (sysctls, iptables/nftables rules, links, mounts, cgroups, host
paths, processes) ``restore_host`` removes or resets to the capture, also for a run that
crashed: the capture is on disk, and leftover processes are found by what names the workdir.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import json
import os
import re
import shutil
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from testbed import procs
from testbed.node.commands import run
from testbed.node.errors import ClusterError
from testbed.node.plan import HOST_REGISTRY, SHORT_SOCKET_DIR
from testbed.procs import Proc

# Host paths a node component may create outside the workdir (containerd 1.6 hard-codes
# /run/containerd/{s,fifo}; kubelet /var/lib/kubelet/device-plugins and /var/log/containers;
# the CNI library /var/lib/cni/results; mount(8) /run/mount; the rest are defaults moved away,
# listed as a guard).
HOST_PATHS = (
    "/run/containerd",
    "/run/mount",
    "/run/netns",
    "/run/kubernetes",
    "/var/lib/cni",
    "/var/lib/kubelet",
    "/var/lib/containerd",
    "/var/log/containers",
    "/var/log/pods",
    "/usr/libexec/kubernetes",
    "/etc/kubernetes",
    "/etc/cni",
    "/opt/cni",
    "/opt/containerd",
    str(SHORT_SOCKET_DIR),
    str(HOST_REGISTRY),
)
# Mounts below these (and below the workdir) are the node's: kubelet volumes, containerd
# rootfs overlays and shm, network namespaces.
_MOUNT_ROOTS = ("/run/containerd", "/run/netns", "/var/lib/kubelet", "/var/lib/containerd")
_SYSCTLS = (
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
    "net.ipv4.ip_forward",
)
# Whole sysctl directories captured too (writable entries only): forwarding and route_localnet
# per interface, br_netfilter, conntrack tuning.
_SYSCTL_DIRS = ("net/ipv4/conf", "net/ipv6/conf/all", "net/ipv6/conf/default", "net/bridge")
_SYSCTL_GLOBS = ("net/netfilter/nf_conntrack_*",)
MNT_DETACH = 2


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _sysctl_path(key: str) -> Path:
    return Path("/proc/sys") / key.replace(".", "/")


def write_sysctl(key: str, value: str) -> None:
    with contextlib.suppress(OSError):  # an interface or module gone since the capture
        _sysctl_path(key).write_text(value)


def _unescape(text: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal (\\040…)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), text)


def _mountinfo() -> list[tuple[str, str, str, str]]:
    """(mount point, root, fs type, source) of every mount, octal escapes decoded."""
    entries = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        before, _, after = line.partition(" - ")
        fields, tail = before.split(), after.split()
        entries.append((_unescape(fields[4]), _unescape(fields[3]), tail[0], tail[1]))
    return entries


def _under(path: str, roots: Iterable[str]) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def _strip_counters(text: str) -> str:
    """Saved rule sets without comment lines and packet/byte counters (they always change)."""
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    text = "\n".join(lines)
    text = re.sub(r"\[\d+:\d+\]", "[0:0]", text)
    return re.sub(r"counter packets \d+ bytes \d+", "counter", text)


@dataclass(frozen=True)
class HostState:
    """What the node changes on the host, captured so that it can be put back exactly."""

    sysctls: dict[str, str]
    """Sysctl values by dotted name (the fixed list plus whole directories, writable only)."""
    iptables: dict[str, str]
    """``iptables-save`` / ``ip6tables-save`` output without comments and counters."""
    nft_tables: list[str]
    """``family name`` of every nftables table (iptables-nft creates tables, never drops)."""
    nft_ruleset: str
    """``nft list ruleset`` without counters."""
    links: dict[str, str]
    """Network interfaces by name, with their kind (``bridge``, ``veth``, "" for plain)."""
    mounts: list[str]
    """``mount-point root fs-type source`` of every mount."""
    cgroups: dict[str, list[str]]
    """Top-level cgroup directories by hierarchy mount point."""
    paths: dict[str, bool]
    """Whether each of ``HOST_PATHS`` exists."""

    @classmethod
    def capture(cls) -> HostState:
        mounts = _mountinfo()
        cgroup_mounts = [point for point, _, fstype, _ in mounts if fstype in ("cgroup", "cgroup2")]
        return cls(
            sysctls=_capture_sysctls(),
            iptables={
                tool: _strip_counters(run([tool], check=False).stdout)
                for tool in ("iptables-save", "ip6tables-save")
            },
            nft_tables=_nft_tables(),
            nft_ruleset=_strip_counters(run(["nft", "list", "ruleset"], check=False).stdout),
            links=links(),
            mounts=sorted(" ".join(entry) for entry in mounts),
            cgroups={point: sorted(_cgroup_children(Path(point))) for point in cgroup_mounts},
            paths={path: os.path.lexists(path) for path in HOST_PATHS},
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> HostState:
        return cls(**data)


def host_state_differences(before: HostState, after: HostState) -> list[str]:
    """What differs between two captures, one line each; empty when the host is as it was.

    Sysctls compare on the keys captured BEFORE: a kernel module loaded on the way
    (nf_conntrack) adds keys of its own but changes none.
    """
    diffs = [
        f"sysctl {key}: {value} -> {after.sysctls.get(key)}"
        for key, value in before.sysctls.items()
        if after.sysctls.get(key) != value
    ]
    for name in ("iptables", "links", "cgroups", "paths"):
        old, new = getattr(before, name), getattr(after, name)
        diffs += [
            f"{name} {key}: {old.get(key)!r} -> {new.get(key)!r}"
            for key in sorted(set(old) | set(new))
            if old.get(key) != new.get(key)
        ]
    for name in ("nft_tables", "mounts"):
        old, new = set(getattr(before, name)), set(getattr(after, name))
        diffs += [f"{name} gone: {entry}" for entry in sorted(old - new)]
        diffs += [f"{name} left: {entry}" for entry in sorted(new - old)]
    if before.nft_ruleset != after.nft_ruleset:
        diffs.append(f"nft ruleset:\n{before.nft_ruleset}\n--- now\n{after.nft_ruleset}")
    return diffs


def _capture_sysctls() -> dict[str, str]:
    paths = [_sysctl_path(key) for key in _SYSCTLS]
    root = Path("/proc/sys")
    for directory in _SYSCTL_DIRS:
        paths.extend(p for p in (root / directory).rglob("*") if p.is_file())
    for pattern in _SYSCTL_GLOBS:
        paths.extend(root.glob(pattern))
    values = {}
    for path in paths:
        with contextlib.suppress(OSError):
            if path.stat().st_mode & 0o200:  # read-only entries are state, not settings
                values[".".join(path.relative_to(root).parts)] = path.read_text().strip()
    return values


def _nft_tables() -> list[str]:
    output = run(["nft", "list", "tables"], check=False).stdout
    return sorted(line.removeprefix("table ").strip() for line in output.splitlines() if line)


def links() -> dict[str, str]:
    data = json.loads(run(["ip", "-d", "-j", "link", "show"]).stdout or "[]")
    return {link["ifname"]: link.get("linkinfo", {}).get("info_kind", "") for link in data}


def _cgroup_children(hierarchy: Path) -> list[str]:
    with contextlib.suppress(OSError):
        return [entry.name for entry in hierarchy.iterdir() if entry.is_dir()]
    return []


def _parse_save(text: str) -> dict[str, tuple[dict[str, str], list[str]]]:
    """iptables-save text -> {table: ({chain: policy}, [rule without "-A "])}."""
    tables: dict[str, tuple[dict[str, str], list[str]]] = {}
    chains: dict[str, str] = {}
    rules: list[str] = []
    for line in text.splitlines():
        if line.startswith("*"):
            chains, rules = {}, []
            tables[line[1:]] = (chains, rules)
        elif line.startswith(":"):
            name, policy = line[1:].split()[:2]
            chains[name] = policy
        elif line.startswith("-A "):
            rules.append(line[3:])
    return tables


def _iptables_undo(before: str, now: str) -> str:
    """An ``iptables-restore --noflush`` script that turns rule set NOW back into BEFORE."""
    old, new = _parse_save(before), _parse_save(now)
    script = []
    for table, (chains, rules) in new.items():
        old_chains, old_rules = old.get(table, ({}, []))
        remaining = collections.Counter(old_rules)
        extra = []
        for rule in rules:
            if remaining[rule] > 0:
                remaining[rule] -= 1
            else:
                extra.append(rule)
        added = [chain for chain in chains if chain not in old_chains]
        lines = [f"-D {rule}" for rule in reversed(extra) if rule.split()[0] not in added]
        lines += [f"-F {chain}" for chain in added] + [f"-X {chain}" for chain in added]
        lines += [f"-N {chain}" for chain in old_chains if chain not in chains]
        lines += [f"-A {rule}" for rule, count in remaining.items() for _ in range(count)]
        lines += [
            f"-P {chain} {policy}"
            for chain, policy in old_chains.items()
            if policy != "-" and chains.get(chain, policy) != policy
        ]
        if lines:
            script += [f"*{table}", *lines, "COMMIT"]
    return "\n".join(script) + "\n" if script else ""


def _leftovers(workdir: Path) -> list[Proc]:
    """The processes a node run left: pods (in kubepods cgroups) and anything whose command
    line or working directory names the workdir (containerd shims, components of a crashed run)."""
    # The shims name containerd's socket, which is not under the workdir when it had to move
    # to SHORT_SOCKET_DIR; they also run in a directory of the workdir's containerd state.
    markers = [f"{workdir}/", f"{SHORT_SOCKET_DIR}/"]

    def named(pid: int, args: list[str]) -> bool:
        if str(workdir) in args or any(m in arg for m in markers for arg in args):
            return True
        return os.readlink(f"/proc/{pid}/cwd").startswith(f"{workdir}/")

    found = procs.find(named)
    spare = procs.ancestors() | {proc.pid for proc in found}
    for point, _, fstype, _ in _mountinfo():
        if fstype not in ("cgroup", "cgroup2"):
            continue
        for pids in Path(point, "kubepods").rglob("cgroup.procs"):
            with contextlib.suppress(OSError):
                pods = [Proc.of("pod", int(pid)) for pid in pids.read_text().split()]
                found += [pod for pod in pods if pod is not None and pod.pid not in spare]
    return found


def _unmount_below(roots: Sequence[str], before: set[str]) -> None:
    """Detach every mount under ROOTS that the capture did not have, deepest first."""
    libc = ctypes.CDLL(None, use_errno=True)
    points = {point for point, *_ in _mountinfo() if _under(point, roots)}
    for point in sorted(points - before, key=lambda p: p.count("/"), reverse=True):
        libc.umount2(point.encode(), MNT_DETACH)


def _remove_cgroups(before: Mapping[str, Sequence[str]], deadline: float) -> list[str]:
    """rmdir (bottom-up) the top-level cgroups that are new; returns those that stayed."""
    stuck = []
    for hierarchy, children in before.items():
        for name in set(_cgroup_children(Path(hierarchy))) - set(children):
            top = Path(hierarchy, name)
            while True:
                for directory, _, _ in sorted(os.walk(top), key=lambda w: -len(w[0])):
                    with contextlib.suppress(OSError):
                        os.rmdir(directory)
                if not top.exists():
                    break
                if time.monotonic() > deadline:
                    stuck.append(str(top))
                    break
                time.sleep(0.1)
    return stuck


def restore_host(before: HostState, workdir: Path, timeout: float = 30) -> None:
    """Put the host back as BEFORE: processes, mounts, links, rules, cgroups, paths, sysctls."""
    deadline = time.monotonic() + timeout
    procs.sweep(_leftovers(workdir), deadline - time.monotonic())
    before_points = {entry.split(" ", 1)[0] for entry in before.mounts}
    _unmount_below([str(workdir), *_MOUNT_ROOTS], before_points)
    for name, kind in links().items():
        if name not in before.links and kind in ("bridge", "veth"):
            run(["ip", "link", "delete", name], check=False)
    for save, restore in (
        ("iptables-save", "iptables-restore"),
        ("ip6tables-save", "ip6tables-restore"),
    ):
        now = _strip_counters(run([save], check=False).stdout)
        script = _iptables_undo(before.iptables.get(save, ""), now)
        if script:
            run([restore, "-w", "--noflush"], input=script, check=False)
    for table in set(_nft_tables()) - set(before.nft_tables):
        run(["nft", "delete", "table", *table.split()], check=False)
    stuck = _remove_cgroups(before.cgroups, deadline)
    for path, existed in before.paths.items():
        if not existed and os.path.lexists(path):
            if Path(path).is_dir() and not Path(path).is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                Path(path).unlink(missing_ok=True)
    # ip_forward first: writing it resets every interface's forwarding, which comes after.
    order = lambda key: (key != "net.ipv4.ip_forward", ".all." not in key, key)  # noqa: E731
    for key in sorted(before.sysctls, key=order):
        if _read(_sysctl_path(key)) not in (None, before.sysctls[key]):
            write_sysctl(key, before.sysctls[key])
    if stuck:
        raise ClusterError(f"cgroups still in use after the node stopped: {', '.join(stuck)}")
