"""Hosts for the multi-host tests, made of Linux network namespaces (as root, with iproute2):
each host a namespace of its own with one address on 198.18.0.0/24 (a range reserved for
benchmarking, RFC 2544) and its own loopback, all joined by a bridge that lives in a namespace
of its own. Nothing is added to the root namespace (no interface, no route) and no host has a
default route, so nothing a test starts can reach past the bridge, nor anything outside
reach in; a service bound to a host's 127.0.0.1 is that host's alone.

Namespaces share the filesystem (and the process table): a folder is one every host mounts,
and the test process reaches the head host's PostgreSQL and Redis through their Unix
sockets, since the root namespace has no address on the bridge.

Names carry the creating process's id (`rfthosts-<pid>-<host>`): a later run removes the
namespaces of one that died without its teardown (`stale_remove`), and two runs at once
(pytest-xdist) never share one."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

PREFIX = "rfthosts-"
SUBNET = "198.18.0"
# What a namespace command may take; iproute2 answers in milliseconds.
IP_TIMEOUT_S = 20


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True, timeout=IP_TIMEOUT_S)


@dataclass(frozen=True)
class Host:
    """One host: its namespace, its name and its address on the bridge."""

    name: str
    ns: str
    address: str

    def wrap(self) -> list[str]:
        """The prefix that runs a command on this host."""
        return ["ip", "netns", "exec", self.ns]

    def pids(self) -> list[int]:
        """Every process on this host (`ip netns pids`)."""
        out = _ip("netns", "pids", self.ns, check=False).stdout
        return [int(p) for p in out.split()]

    def kill_everything(self) -> int:
        """SIGKILL to every process on this host, as a host that loses its power; how many."""
        pids = self.pids()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return len(pids)

    def reaches(self, address: str, port: int, *, timeout: float = 2.0) -> bool:
        """Whether a TCP connection from this host to address:port is accepted."""
        probe = ("import socket, sys\ntry:\n    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3]))"
                 "\nexcept OSError:\n    sys.exit(1)")
        done = subprocess.run([*self.wrap(), sys.executable, "-c", probe, address, str(port), str(timeout)],
                              capture_output=True, timeout=timeout + IP_TIMEOUT_S)
        return done.returncode == 0


@dataclass(frozen=True)
class Network:
    """The hosts and the bridge's namespace; `cut` and `mend` a host's link to the others."""

    hosts: dict[str, Host]
    bridge_ns: str

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def cut(self, name: str) -> None:
        """The host's cable pulled: its port on the bridge down (no reset is sent either way;
        connections across it stall as they would on a real switch)."""
        _ip("-n", self.bridge_ns, "link", "set", _port(name), "down")

    def mend(self, name: str) -> None:
        _ip("-n", self.bridge_ns, "link", "set", _port(name), "up")


def _port(name: str) -> str:
    return f"b-{name}"[:15]  # an interface name is at most 15 characters


def unavailable() -> str | None:
    """Why namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "the multi-host tests make network namespaces, which needs root"
    if shutil.which("ip") is None:
        return "the multi-host tests need iproute2's `ip` to make network namespaces"
    probe = f"{PREFIX}{os.getpid()}-probe"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"cannot make a network namespace here: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _remove(ns: str) -> None:
    host = Host(name=ns, ns=ns, address="")
    deadline = time.monotonic() + IP_TIMEOUT_S
    while host.kill_everything() and time.monotonic() < deadline:
        time.sleep(0.1)
    _ip("netns", "del", ns, check=False)


def stale_remove() -> list[str]:
    """Remove the namespaces (and every process in them) of earlier runs whose process is
    gone (a crashed run left them); the names removed."""
    gone = []
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        ns = line.split()[0] if line.split() else ""
        owner = ns[len(PREFIX):].split("-")[0] if ns.startswith(PREFIX) else ""
        if owner.isdigit() and not _alive(int(owner)):
            _remove(ns)
            gone.append(ns)
    return gone


@contextmanager
def network(*names: str) -> Iterator[Network]:
    """Hosts `names` (the first at 198.18.0.1, the next at .2, ...) on one bridge for the
    block; every namespace, and every process still in one, removed after it whatever happened."""
    stale_remove()
    base = f"{PREFIX}{os.getpid()}-"
    bridge_ns = f"{base}bridge"
    made: list[str] = []
    try:
        _ip("netns", "add", bridge_ns)
        made.append(bridge_ns)
        _ip("-n", bridge_ns, "link", "add", "br0", "type", "bridge")
        _ip("-n", bridge_ns, "link", "set", "br0", "up")
        hosts = {}
        for k, name in enumerate(names, start=1):
            host = Host(name=name, ns=f"{base}{name}", address=f"{SUBNET}.{k}")
            _ip("netns", "add", host.ns)
            made.append(host.ns)
            _ip("-n", host.ns, "link", "set", "lo", "up")
            # Made inside the bridge's namespace with its peer placed straight into the host's:
            # the pair never passes through the root namespace.
            _ip("-n", bridge_ns, "link", "add", _port(name), "type", "veth", "peer", "name", "eth0", "netns", host.ns)
            _ip("-n", bridge_ns, "link", "set", _port(name), "master", "br0", "up")
            _ip("-n", host.ns, "addr", "add", f"{host.address}/24", "dev", "eth0")
            _ip("-n", host.ns, "link", "set", "eth0", "up")
            hosts[name] = host
        yield Network(hosts=hosts, bridge_ns=bridge_ns)
    finally:
        for ns in reversed(made):
            _remove(ns)
