"""Which address of this host a process binds and advertises, so that the others reach it.

A process of a world is reached at the address it advertises, so it advertises one the
others can reach: by default the local address of the route toward the rendezvous host
(what a UDP socket "connected" there reports: no packet is sent), which is 127.0.0.1
when the rendezvous is on this host's loopback, and never what this host's name resolves
to (Debian-like hosts map it to 127.0.1.1; containers and namespaces often share one
name). Explicit settings win, in this order:

==========================  =============================================================
``DISTGRAD_BIND_ADDR``      an address of this host (IPv4 or IPv6), or a wildcard
                            (``0.0.0.0``, ``::``: bind every interface, advertise the
                            route's address)
``DISTGRAD_SOCKET_IFNAME``  an interface name (``eth0``): its address
``TP_SOCKET_IFNAME``        PyTorch's, for RPC (TensorPipe); ``GLOO_SOCKET_IFNAME`` for
                            process groups (gloo); a list takes its first name
==========================  =============================================================

>>> endpoint("10.0.0.2", 5000), endpoint("fd00::2", 5000)
('tcp://10.0.0.2:5000', 'tcp://[fd00::2]:5000')
>>> host_port("tcp://[fd00::2]:5000")
('fd00::2', 5000)
"""
import fcntl
import ipaddress
import os
import socket
import struct

__all__ = ["Choice", "choose", "resolve", "route_source", "interface_address", "endpoint",
           "host_port", "endpoint_host", "diagnose", "is_ipv6", "is_loopback", "is_wildcard", "is_local",
           "listen_address", "reached_from_this_host_only",
           "host_address", "AddressError", "OVERRIDES"]

#: environment variables, in the order they win, for each purpose
OVERRIDES = {
    "rpc": ("DISTGRAD_BIND_ADDR", "DISTGRAD_SOCKET_IFNAME", "TP_SOCKET_IFNAME"),
    "pg": ("DISTGRAD_BIND_ADDR", "DISTGRAD_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"),
}
_SIOCGIFADDR = 0x8915


class AddressError(ValueError):
    """An address setting or a rendezvous host that cannot be used; the message names it."""


class Choice:
    """What to bind (``bind``) and what to tell the others (``advertise``), and why."""

    def __init__(self, bind, advertise, why):
        self.bind, self.advertise, self.why = bind, advertise, why

    def __repr__(self):
        return f"Choice(bind={self.bind!r}, advertise={self.advertise!r}, why={self.why!r})"


def is_loopback(ip):
    try:
        return ipaddress.ip_address(ip).is_loopback
    except ValueError:
        return False


def reached_from_this_host_only(address):
    """Whether a server at ``address`` (an endpoint, ``ipc://``, ``tcp://host:port``, or a
    host) can be reached from this host only: an ipc path, or a loopback address. None (not
    known) is not."""
    if not address:
        return False
    if address.startswith(("ipc://", "inproc://")):
        return True
    try:
        host = host_port(address)[0] if address.startswith("tcp://") else address
        return is_loopback(resolve(host))
    except (AddressError, OSError, ValueError):
        return False


def is_wildcard(ip):
    return ip in ("0.0.0.0", "::", "*")


def _family(ip):
    return socket.AF_INET6 if ":" in ip else socket.AF_INET


def resolve(host, what="host"):
    """The IP address ``host`` (a name or an address, IPv6 in brackets or not) stands
    for; IPv4 first where a name has both. ``what`` names it in the error."""
    host = host.strip().strip("[]")
    if not host:
        raise AddressError(f"{what} is empty")
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise AddressError(f"{what} {host!r} does not resolve ({e.strerror}): give an address "
                           "or a name this host can look up") from None
    infos.sort(key=lambda info: info[0] != socket.AF_INET)
    return infos[0][4][0]


def route_source(ip):
    """The address of this host on the route toward ``ip`` (None: no route)."""
    s = socket.socket(_family(ip), socket.SOCK_DGRAM)
    try:
        s.connect((ip, 9))  # UDP: nothing is sent; the kernel picks the route
        return s.getsockname()[0]
    except OSError:
        return None
    finally:
        s.close()


def interface_address(name, family=None, what=None):
    """The address of interface ``name`` (IPv4 unless ``family`` is AF_INET6 or it has
    none); ``what`` names the setting in the error."""
    what = what or f"interface {name!r}"
    names = [n for _, n in socket.if_nameindex()]
    if name not in names:
        raise AddressError(f"{what}: this host has no interface {name!r} (it has "
                           f"{', '.join(names)})")
    v6 = _ipv6_of(name)
    if family != socket.AF_INET6:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR,
                                 struct.pack("256s", name.encode()[:15]))
            return socket.inet_ntoa(packed[20:24])
        except OSError:
            pass
        finally:
            s.close()
    if v6:
        return v6
    raise AddressError(f"{what}: interface {name!r} has no address (is it up?)")


def _ipv6_of(name):
    """The first global IPv6 address of interface ``name``, or None."""
    try:
        with open("/proc/net/if_inet6") as fh:
            for line in fh:
                fields = line.split()
                if len(fields) >= 6 and fields[5] == name and fields[3] == "00":
                    return str(ipaddress.ip_address(bytes.fromhex(fields[0])))
    except OSError:
        pass
    return None


def is_local(ip):
    """Whether ``ip`` is an address of this host (binding it works)."""
    s = socket.socket(_family(ip), socket.SOCK_DGRAM)
    try:
        s.bind((ip, 0))
        return True
    except OSError:
        return False
    finally:
        s.close()


def choose(toward=None, purpose="rpc", env=None):
    """The :class:`Choice` of address for a process whose world meets at ``toward`` (a
    host name or address; None: no rendezvous host, e.g. ``file://``: loopback unless
    a setting says otherwise)."""
    env = os.environ if env is None else env
    target = resolve(toward, "the rendezvous host") if toward else None
    for var in OVERRIDES[purpose]:
        value = (env.get(var) or "").strip()
        if not value:
            continue
        if var == "DISTGRAD_BIND_ADDR":
            ip = value.strip("[]")
            try:
                ipaddress.ip_address(ip)
            except ValueError:
                if not is_wildcard(ip):
                    raise AddressError(f"{var}={value!r} is not an IP address of this host "
                                       "(for an interface name, set DISTGRAD_SOCKET_IFNAME)") \
                        from None
            if is_wildcard(ip):
                wildcard = "::" if target and ":" in target else "0.0.0.0"
                advertised = (route_source(target) if target else None) or "127.0.0.1"
                return Choice(wildcard, advertised, f"{var}={value} (every interface)")
            if not is_local(ip):
                raise AddressError(f"{var}={value!r} is not an address of this host")
            return Choice(ip, ip, f"{var}={value}")
        name = value.split(",")[0].strip()
        family = socket.AF_INET6 if target and ":" in target else None
        ip = interface_address(name, family, what=f"{var}={value!r}")
        return Choice(ip, ip, f"{var}={value}")
    if target is None or is_loopback(target):
        lo = "::1" if target and ":" in target else "127.0.0.1"
        return Choice(lo, lo, "no rendezvous host" if target is None
                      else "the rendezvous is on this host's loopback")
    source = route_source(target)
    if source is None:
        raise AddressError(f"this host has no route to the rendezvous host {toward!r} "
                           f"({target}): check the address, or set DISTGRAD_SOCKET_IFNAME")
    return Choice(source, source, f"the route toward the rendezvous host {toward} ({target})")


def host_address(family=socket.AF_INET):
    """This host's address for others when no rendezvous host tells which: the source of
    its default route, else the first address of an interface that is up and not the
    loopback, else the loopback (a server bound to every interface advertises it)."""
    probe = "2001:db8::1" if family == socket.AF_INET6 else "192.0.2.1"  # documentation nets
    source = route_source(probe)
    if source is not None:
        return source
    for _, name in socket.if_nameindex():
        if name == "lo":
            continue
        try:
            return interface_address(name, family)
        except AddressError:
            continue
    return "::1" if family == socket.AF_INET6 else "127.0.0.1"


def listen_address(host):
    """The address a server at ``host`` (MASTER_ADDR: a name or an address) binds: the
    address itself where it is one of this host's (loopback stays loopback), else every
    interface of its family (a name another host resolves differently, such as a
    Debian-style 127.0.1.1 entry for this host's own name, or an address that is not this
    host's own: a service or NAT address in front of it), as PyTorch's store does."""
    raw = host.strip().strip("[]")
    ip = resolve(raw, "the rendezvous host")
    literal_or_localhost = raw == "localhost" or raw == ip
    if is_loopback(ip) and literal_or_localhost:
        return ip
    if not is_loopback(ip) and is_local(ip):
        return ip
    return "::" if ":" in ip else "0.0.0.0"


def is_ipv6(endpoint):
    """Whether ``endpoint`` is a tcp:// address in IPv6. A ZeroMQ socket must be told
    (``sock.ipv6``) before it binds or connects one, and only then: an IPv6 socket
    reports the IPv4 address it bound in the mapped form (``[::ffff:10.0.0.1]``)."""
    return endpoint.startswith("tcp://[")


def diagnose(address, timeout=1.0):
    """Why nobody answers at ``tcp://host:port``, as far as one TCP connection attempt
    tells: for the error of a wait that timed out."""
    try:
        host, port = host_port(address)
        ip = resolve(host, "host")
    except (AddressError, ValueError) as e:
        return str(e)
    where = f"{host}:{port}" if host == ip else f"{host} ({ip}) port {port}"
    try:
        with socket.create_connection((ip, port), timeout=timeout):
            return f"{where} accepts connections but did not answer in time"
    except ConnectionRefusedError:
        return f"nothing listens at {where} (connection refused)"
    except socket.timeout:
        return (f"no answer from {where} within {timeout:g} s: a firewall drops the "
                "connection, or the host is down")
    except OSError as e:
        return f"{where} cannot be reached ({e.strerror or e})"


def endpoint(ip, port, scheme="tcp"):
    """``tcp://ip:port``, with IPv6 addresses in brackets."""
    ip = ip.strip("[]")
    return f"{scheme}://[{ip}]:{port}" if ":" in ip else f"{scheme}://{ip}:{port}"


def endpoint_host(address):
    """The host address of a ``tcp://`` endpoint; None for others (``ipc://``: this host)."""
    return host_port(address)[0] if address.startswith("tcp://") else None


def host_port(address):
    """(host, port) of ``tcp://host:port`` (IPv6 in brackets)."""
    rest = address.split("://", 1)[-1]
    host, _, port = rest.rpartition(":")
    return host.strip("[]"), int(port)
