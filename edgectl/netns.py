"""Hosts of our own on this machine: one Linux network namespace per host, each with its own IP on
a bridge we create, so that Ray nodes started in them look like separate machines (each binds
its own ports; a Serve proxy on every node listens on the same port at its own address).

`HostNetwork.create()` makes the bridge (in this namespace, holding the subnet's first address,
so this process reaches every host) and `add_host(name)` a namespace with a veth pair on it.
Names start with a prefix unique to the network; `remove()` deletes what it made and nothing
else. The namespaces have no default route and this machine forwards nothing for them: their
traffic stays between them and this process. Needs root (CAP_NET_ADMIN) and iproute2's `ip`.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import shutil
import subprocess
from dataclasses import dataclass, field

SUBNET_PREFIX_LEN = 24
# A /24 is drawn from here, avoiding any route this machine already has.
SUBNET_POOL = ipaddress.IPv4Network("10.160.0.0/11")


class NetworkUnavailable(RuntimeError):
    """This machine cannot make network namespaces for us; the message says why."""


def _ip(*args: str) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


def check_available() -> None:
    """Raise NetworkUnavailable unless `ip` exists and we may create namespaces."""
    if shutil.which("ip") is None:
        raise NetworkUnavailable("no `ip` command on this machine (apt-get install iproute2)")
    if os.geteuid() != 0:
        raise NetworkUnavailable("network namespaces need root (CAP_NET_ADMIN)")


@dataclass(frozen=True)
class Host:
    """One namespace: a command run through `command()` lives at `ip`."""

    name: str
    namespace: str
    ip: str

    def command(self, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.namespace, *argv]


@dataclass
class HostNetwork:
    prefix: str
    subnet: ipaddress.IPv4Network
    hosts: dict[str, Host] = field(default_factory=dict)

    @property
    def bridge(self) -> str:
        return f"{self.prefix}br"

    @property
    def gateway_ip(self) -> str:
        """This process's address on the bridge: where services for every host listen."""
        return str(self.subnet.network_address + 1)

    @classmethod
    def create(cls) -> HostNetwork:
        check_available()
        # Interface names are at most 15 bytes: "eh" + 6 hex + a short suffix.
        network = cls(f"eh{secrets.token_hex(3)}", _free_subnet())
        try:
            _ip("link", "add", network.bridge, "type", "bridge")
            _ip(
                "addr",
                "add",
                f"{network.gateway_ip}/{SUBNET_PREFIX_LEN}",
                "dev",
                network.bridge,
            )
            _ip("link", "set", network.bridge, "up")
        except BaseException:
            network.remove()
            raise
        return network

    def add_host(self, name: str) -> Host:
        """The host `name`, made on first use; the same one (same IP) after that."""
        if name in self.hosts:
            return self.hosts[name]
        index = len(self.hosts)
        host = Host(name, f"{self.prefix}-{name}", str(self.subnet.network_address + 2 + index))
        outside, inside = f"{self.prefix}v{index}", f"{self.prefix}p{index}"
        self.hosts[name] = host  # before making it: remove() deletes a half-made one too
        _ip("netns", "add", host.namespace)
        _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
        _ip("link", "set", outside, "master", self.bridge, "up")
        _ip("link", "set", inside, "netns", host.namespace)
        _ip("-n", host.namespace, "addr", "add", f"{host.ip}/{SUBNET_PREFIX_LEN}", "dev", inside)
        _ip("-n", host.namespace, "link", "set", inside, "up")
        _ip("-n", host.namespace, "link", "set", "lo", "up")
        return host

    def remove(self) -> None:
        """Delete our veth pairs, namespaces and bridge; no error for one never made. (A
        namespace outlives its name while a process is still in it: its veth is deleted here
        from our end, so nothing of ours stays linked.)"""
        for index, host in enumerate(self.hosts.values()):
            subprocess.run(["ip", "link", "delete", f"{self.prefix}v{index}"], capture_output=True)
            subprocess.run(["ip", "netns", "delete", host.namespace], capture_output=True)
        self.hosts.clear()
        subprocess.run(["ip", "link", "delete", self.bridge], capture_output=True)

    def leftovers(self) -> list[str]:
        """Namespaces and links of ours still on this machine (none after `remove()`)."""
        names = _ip("netns", "list").split() + _ip("-o", "link", "show").split()
        return sorted({name.split("@")[0].rstrip(":") for name in names if self.prefix in name})


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 of SUBNET_POOL no route or address on this machine overlaps, drawn at random."""
    used = [
        ipaddress.IPv4Network(word, strict=False)
        for word in (_ip("-4", "route", "show") + _ip("-4", "-o", "addr", "show")).split()
        if "/" in word and word[0].isdigit()
    ]
    candidates: list[ipaddress.IPv4Network] = list(
        SUBNET_POOL.subnets(new_prefix=SUBNET_PREFIX_LEN)
    )
    for _ in range(64):
        subnet = candidates[secrets.randbelow(len(candidates))]
        if not any(subnet.overlaps(other) for other in used):
            return subnet
    raise NetworkUnavailable(f"no free /{SUBNET_PREFIX_LEN} in {SUBNET_POOL}")
