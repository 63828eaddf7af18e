"""Where other hosts reach this worker: its advertised address, the interface that
address belongs to, and the ports it opens to peers for distributed jobs.

Only gangs need it: the control plane never connects to a worker, but the ranks of
a distributed job connect to each other. Node 0's worker is the rendezvous
(``MASTER_ADDR`` is its advertised address, ``MASTER_PORT`` one of its rendezvous
ports), and the collective backend (gloo, NCCL) of every rank listens on the
interface named by ``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME``, which the worker
sets from :attr:`Network.interface` (a job's own ``env`` wins). Without them gloo
picks the address its hostname resolves to, which on many machines is a loopback
or an address the peers cannot reach.

By default the address is the local IP this machine uses to reach the control
plane (127.0.0.1 when the control plane is on this machine) and the interface is
the one holding it; ``gpulayer join --interface IF`` takes the address of ``IF``,
and ``--advertise-address A`` overrides the address (e.g. behind NAT, where the
peers reach the machine at an address it does not hold).
"""

import ipaddress
import logging
import socket
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

from gpulayer.errors import ConfigError

log = logging.getLogger(__name__)

#: The variables that name the interface of the collective backend.
SOCKET_IFNAME_ENV = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
_EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")


@dataclass(frozen=True)
class Network:
    """What this worker tells its peers (through the control plane)."""

    address: str
    interface: str | None
    rendezvous_ports: tuple[int, int] | None = None

    def socket_env(self, job_env: dict[str, str]) -> dict[str, str]:
        """``GLOO_SOCKET_IFNAME`` and ``NCCL_SOCKET_IFNAME`` for a rank, except those the
        job sets itself."""
        if self.interface is None:
            return {}
        return {var: self.interface for var in SOCKET_IFNAME_ENV if var not in job_env}


def resolve(
    url: str,
    *,
    address: str | None = None,
    interface: str | None = None,
    rendezvous_ports: tuple[int, int] | None = None,
) -> Network:
    """The worker's network: ``interface`` and ``address`` as given, the rest found.

    Raises
    ------
    ConfigError
        When ``interface`` does not exist here or holds no IPv4 address.
    """
    if interface is not None:
        held = address_of(interface)
        if held is None:
            names = ", ".join(sorted(psutil.net_if_addrs())) or "none"
            raise ConfigError(
                f"--interface {interface}: no such interface with an IPv4 address here"
                f" (interfaces: {names})"
            )
        address = address or held
    else:
        reach = route_source(url)
        address = address or reach
        interface = interface_of(address) or interface_of(reach)
    return Network(address, interface, rendezvous_ports)


def route_source(url: str) -> str:
    """The local IP this machine uses to reach the control plane at ``url``: 127.0.0.1
    when the control plane is on this machine (the hostname when it cannot tell)."""
    host = httpx.URL(url).host or "127.0.0.1"
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
        if any(ipaddress.ip_address(i[4][0]).is_loopback for i in infos):
            return "127.0.0.1"
        with socket.socket(infos[0][0], socket.SOCK_DGRAM) as s:
            s.connect((infos[0][4][0], 9))  # a UDP connect sends nothing
            return str(s.getsockname()[0])
    except (OSError, ValueError):
        return socket.gethostname()


def interface_of(address: str) -> str | None:
    """The interface that holds ``address`` (None when none here does)."""
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address.split("%")[0] == address for a in addrs):
            return str(name)
    return None


def address_of(interface: str) -> str | None:
    """The first IPv4 address of ``interface`` (None when it has none)."""
    for a in psutil.net_if_addrs().get(interface, []):
        if a.family == socket.AF_INET:
            return str(a.address)
    return None


def parse_ports(text: str) -> tuple[int, int]:
    """``"29500-29599"`` → ``(29500, 29599)``.

    Raises
    ------
    ValueError
        Unless it is ``LO-HI`` with 1024 ≤ LO ≤ HI ≤ 65535.
    """
    lo_text, sep, hi_text = text.partition("-")
    try:
        lo, hi = int(lo_text), int(hi_text if sep else lo_text)
    except ValueError:
        raise ValueError(f"{text!r} is not a port range like 29500-29599") from None
    if not 1024 <= lo <= hi <= 65535:
        raise ValueError(f"{text!r}: ports must be 1024-65535, low to high")
    return lo, hi


def ephemeral_ports() -> tuple[int, int] | None:
    """This network namespace's ephemeral port range (``net.ipv4.ip_local_port_range``),
    where gloo and NCCL listen; None where it cannot be read."""
    try:
        lo, hi = _EPHEMERAL.read_text().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return None


def describe(net: Network) -> str:
    """One line for the worker's log: where peers reach it, and on which ports."""
    where = f"peers reach this worker at {net.address}" + (
        f" ({net.interface})" if net.interface else ""
    )
    ports = net.rendezvous_ports
    rendezvous = (
        f"rendezvous ports {ports[0]}-{ports[1]}" if ports else "rendezvous port as assigned"
    )
    eph = ephemeral_ports()
    backend = (
        f"; the collective backend listens on ephemeral ports {eph[0]}-{eph[1]}"
        " (net.ipv4.ip_local_port_range)"
        if eph
        else ""
    )
    return f"{where}; {rendezvous}{backend}"
