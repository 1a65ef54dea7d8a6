"""Simulated hosts: several "machines" on one Linux machine, for multi-host tests and trials.

    with SimulatedHosts(2, bandwidth="1Gbit/s", private_shm=True) as hosts:
        a, b = hosts
        server = a.popen(["python", "-m", "http.server", "8000"])
        b.run(["python", "-c", f"import urllib.request as u; u.urlopen('http://{a.address}:8000')"])
        proc = b.spawn(mylib.train, 1, 2)       # a function, by reference, in a process there
        proc.result(timeout=30)

Each host is a network namespace with its own loopback and one interface (``eth0``)
with an address on a private subnet; the interfaces hang on one bridge (a switch) in
a namespace of its own, so the hosts reach each other only through it, as machines on
a LAN. What a process on a host sees:

* its own ``127.0.0.1``, and ``eth0`` with :attr:`Host.address` (and
  :attr:`Host.address6`, an IPv6 address, with ``ipv6=True``);
* host names: ``/etc/hosts`` maps every host's :attr:`Host.name` (``host0``,
  ``host1``, ...) to its address, but the machine's host name is the same on every host
  (as often in containers), so code that trusts it goes wrong here as it would there;
* with ``private_shm=True``, a ``/dev/shm`` of the host's own (shared by its processes,
  apart from the other hosts'): a same-host shortcut through shared memory cannot be
  taken between hosts;
* with ``bandwidth`` (``"1Gbit/s"``), ``tc ... tbf`` on ``eth0`` limits what the host
  sends. Delay is not simulated here (``netem`` is missing from many kernels): use the
  transport's ``simulated_link``.

``attach_caller=True`` also joins the calling process's own namespace to the switch
(address :attr:`SimulatedHosts.caller_address`), so a test process can be one member of
a world whose other members run on the hosts.

Everything made is removed on :meth:`SimulatedHosts.close` (and on leaving the ``with``),
its processes killed and reaped; if this process dies without closing (a test killed by
a timeout, SIGKILL), a guardian process that waits on a pipe from it removes it all, and
whatever a guardian could not remove (the machine lost power) is swept when hosts are
next made. Making hosts needs the capability to make namespaces (root, or
``CAP_SYS_ADMIN`` and ``CAP_NET_ADMIN``): :func:`unavailable` says why not where it
is missing, and the pytest fixture ``simulated_hosts`` then skips with that reason.

By hand (the namespaces stay until ``down``)::

    distgrad hosts up 2 --bandwidth 1Gbit/s     # host0 10.x.y.1, host1 10.x.y.2
    distgrad hosts exec host1 -- python train.py
    distgrad hosts down
"""
import contextlib
import functools
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading

from .host_records import guard_in_background, ip as _ip, listed, registry_dir, remove, sweep
from ..utils.processes import die_with_parent

__all__ = ["SimulatedHosts", "Host", "HostProcess", "HostCallError", "unavailable",
           "parse_rate", "sweep", "listed"]

_SHM_ROOT = "/dev/shm"
_counter = iter(range(1, 1 << 30))
_counter_lock = threading.Lock()

# bandwidth in text -> bits per second
_RATE = re.compile(r"^\s*([0-9.]+)\s*([kmgt]?)(bit|b)(?:/s|ps)?\s*$", re.I)
_RATE_SCALE = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


def parse_rate(text):
    """``"1Gbit/s"`` -> 1e9 (bits per second); also ``"100Mbit"``, ``"10gbit"``, ``"125MB/s"``.

    >>> parse_rate("10Gbit/s"), parse_rate("125MB/s")
    (10000000000.0, 1000000000.0)
    """
    m = _RATE.match(str(text))
    if not m:
        raise ValueError(f"a bandwidth is a number and a unit such as '1Gbit/s', '100Mbit/s' "
                         f"or '125MB/s', not {text!r}")
    number, scale, unit = m.groups()
    bits = float(number) * _RATE_SCALE[scale.lower()] * (8 if unit == "B" else 1)
    if bits <= 0:
        raise ValueError(f"bandwidth {text!r} must be above 0")
    return bits


# ---------------------------------------------------------------------- capability
def unavailable():
    """Why simulated hosts cannot be made here (None: they can)."""
    if not sys.platform.startswith("linux"):
        return f"simulated hosts need Linux network namespaces (this is {sys.platform})"
    if shutil.which("ip") is None:
        return "simulated hosts need the 'ip' command (iproute2) on PATH"
    if os.geteuid() != 0:
        return ("simulated hosts need root (or CAP_SYS_ADMIN and CAP_NET_ADMIN) to make "
                "network namespaces; this process runs as uid %d" % os.geteuid())
    probe = f"dgprobe{os.getpid()}x{_next_id()}"
    made = _ip(["netns", "add", probe], check=False)
    if made.returncode != 0:
        return f"'ip netns add' fails here: {made.stderr.strip() or made.returncode}"
    _ip(["netns", "del", probe], check=False)
    return None


def _next_id():
    with _counter_lock:
        return next(_counter)


# ---------------------------------------------------------------------- one host
class HostCallError(RuntimeError):
    """A function run on a simulated host raised; the message carries its traceback."""


class HostProcess:
    """A process on a host running a function (see :meth:`Host.spawn`)."""

    def __init__(self, popen, result_path, what):
        self.popen, self._result_path, self.what = popen, result_path, what

    @property
    def pid(self):
        return self.popen.pid

    def poll(self):
        return self.popen.poll()

    def kill(self):
        with contextlib.suppress(ProcessLookupError):
            self.popen.kill()

    def result(self, timeout):
        """The function's return value (JSON), once it returned; raises
        :class:`HostCallError` with its traceback if it raised, ``TimeoutError`` if it
        is still running after ``timeout`` s (it is then killed)."""
        try:
            out, err = self.popen.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            out, err = self.popen.communicate()
            raise TimeoutError(f"{self.what} still ran after {timeout:g} s (killed); its "
                               f"output:\n{_tail(out)}{_tail(err)}") from None
        try:
            with open(self._result_path) as fh:
                outcome = json.load(fh)
        except (OSError, ValueError):
            raise HostCallError(f"{self.what} ended with status {self.popen.returncode} "
                                f"without a result; its output:\n{_tail(out)}{_tail(err)}") \
                from None
        finally:
            with contextlib.suppress(OSError):
                os.unlink(self._result_path)
        if "error" in outcome:
            raise HostCallError(f"{self.what} raised {outcome['error']}\n{outcome['traceback']}"
                                f"{_tail(err)}")
        return outcome["value"]


def _tail(text, n=4000):
    if not text:
        return ""
    text = text if isinstance(text, str) else text.decode(errors="replace")
    return text[-n:] + ("" if text.endswith("\n") else "\n")


class Host:
    """One simulated host: a network namespace with ``eth0`` on the hosts' switch."""

    def __init__(self, hosts, index, name, netns, address, address6, shm_dir):
        self._hosts = hosts
        self.index, self.name, self.netns = index, name, netns
        self.address, self.address6 = address, address6
        self.interface = "eth0"
        self.shm_dir = shm_dir  # None: the machine's /dev/shm
        self._firewalled = False

    def __repr__(self):
        return f"Host({self.name}, {self.address})"

    def command(self, argv):
        """``argv`` as a command that runs on this host (what ``popen`` runs)."""
        argv = [str(a) for a in argv]
        prefix = ["ip", "netns", "exec", self.netns]
        if self.shm_dir is None:
            return prefix + argv
        # ip netns exec runs the command in a mount namespace of its own: binding the
        # host's directory over /dev/shm there hides the machine's from it
        return prefix + ["sh", "-c", 'mount --bind "$0" /dev/shm && exec "$@"',
                         self.shm_dir] + argv

    def popen(self, argv, env=None, **kwargs):
        """Start ``argv`` on this host (``subprocess.Popen`` arguments); it dies with this
        process, and is killed when the hosts are closed."""
        full_env = dict(os.environ if env is None else env)
        proc = subprocess.Popen(self.command(argv), env=full_env,
                                preexec_fn=_die_with(os.getpid()), **kwargs)
        self._hosts._started(proc)
        return proc

    def run(self, argv, timeout=60, check=True, env=None, **kwargs):
        """Run ``argv`` on this host to its end; its ``CompletedProcess`` (text output)."""
        if kwargs.pop("capture_output", True):
            kwargs.setdefault("stdout", subprocess.PIPE)
            kwargs.setdefault("stderr", subprocess.PIPE)
        kwargs.setdefault("text", True)
        proc = self.popen(argv, env=env, **kwargs)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            raise TimeoutError(f"`{' '.join(map(str, argv))}` on {self.name} still ran after "
                               f"{timeout:g} s (killed); its output:\n{_tail(out)}{_tail(err)}") \
                from None
        done = subprocess.CompletedProcess(argv, proc.returncode, out, err)
        if check and proc.returncode != 0:
            raise subprocess.CalledProcessError(proc.returncode, argv, out, err)
        return done

    def spawn(self, fn, *args, env=None, cwd=None):
        """Run ``fn(*args)`` in a new Python process on this host; ``fn`` travels by
        reference (a module-level function of an importable module, this process's
        ``sys.path`` is the child's), ``args`` and the result as JSON."""
        ref = f"{fn.__module__}:{fn.__qualname__}" if callable(fn) else str(fn)
        fd, result_path = tempfile.mkstemp(prefix="call-", suffix=".json",
                                           dir=self._hosts.calls_dir)
        os.close(fd)
        os.unlink(result_path)
        child_env = dict(os.environ if env is None else env)
        paths = [p for p in sys.path if p and os.path.isdir(p)]
        child_env["PYTHONPATH"] = os.pathsep.join(
            paths + [p for p in child_env.get("PYTHONPATH", "").split(os.pathsep) if p])
        proc = self.popen([sys.executable, "-m", "distgrad.testing.host_call", ref, result_path,
                           json.dumps(list(args))], env=child_env, cwd=cwd,
                          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
        return HostProcess(proc, result_path, f"{ref} on {self.name}")

    # faults
    def link_down(self):
        """Cut this host's link (its processes keep running, unreachable)."""
        _ip(["link", "set", self.interface, "down"], netns=self.netns)

    def link_up(self):
        _ip(["link", "set", self.interface, "up"], netns=self.netns)

    def drop_port(self, port):
        """A firewall on this host that silently drops connections to its ``port`` (TCP):
        a client's connection attempts go unanswered, as behind a firewall that drops
        rather than rejects. (It drops what the host sends from that port: this kernel
        offers no tc drop action on ingress.)"""
        if not self._firewalled:
            _tc(self.netns, ["qdisc", "replace", "dev", self.interface, "root", "handle", "1:",
                             "htb", "default", "10", "r2q", "100000"])
            rate = f"{int(self._hosts.rate)}bit" if self._hosts.rate else "100gbit"
            _tc(self.netns, ["class", "add", "dev", self.interface, "parent", "1:", "classid",
                             "1:10", "htb", "rate", rate])
            _tc(self.netns, ["class", "add", "dev", self.interface, "parent", "1:", "classid",
                             "1:20", "htb", "rate", "8kbit", "quantum", "1514"])
            _tc(self.netns, ["qdisc", "add", "dev", self.interface, "parent", "1:20", "handle",
                             "20:", "pfifo", "limit", "0"])
            self._firewalled = True
        for prio, (protocol, u32) in enumerate((("ip", "ip"), ("ipv6", "ip6")), 1):
            _tc(self.netns, ["filter", "add", "dev", self.interface, "parent", "1:", "protocol",
                             protocol, "prio", str(prio), "u32", "match", u32, "protocol", "6",
                             "0xff", "match", u32, "sport", str(int(port)), "0xffff",
                             "flowid", "1:20"])

    def pids(self):
        """The processes running on this host."""
        out = _ip(["netns", "pids", self.netns], check=False).stdout
        return [int(p) for p in out.split()]

    def kill_all(self):
        """SIGKILL every process on this host (as if it lost power)."""
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _die_with(owner):
    # (a preexec_fn: runs in the child before exec, with the parent's pid as it was)
    return functools.partial(die_with_parent, owner)


# ---------------------------------------------------------------------- the hosts
class SimulatedHosts:
    """``n`` simulated hosts (see the module's docstring); iterable and indexable.

    ``bandwidth``: what each host may send (``"1Gbit/s"``, via tbf), None for no limit;
    ``private_shm``: a ``/dev/shm`` per host; ``ipv6``: IPv6 addresses too;
    ``attach_caller``: the calling process's namespace on the switch as well;
    ``prefix``: the namespaces' name prefix (default: made from this process's pid, so
    a crashed owner's hosts are swept); ``guard``: start the guardian that cleans up
    if this process dies (off for hosts made to outlive their maker: the CLI's);
    ``owner``: the pid whose end makes them stale (default: this process when guarded,
    else none: they stay until removed).
    """

    def __init__(self, n, *, bandwidth=None, private_shm=False, ipv6=False,
                 attach_caller=False, prefix=None, guard=True, owner=None):
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 250:
            raise ValueError(f"the number of simulated hosts must be 1-250, not {n!r}")
        self.rate = parse_rate(bandwidth) if bandwidth is not None else None
        self.bandwidth = bandwidth
        why = unavailable()
        if why is not None:
            raise OSError(why)
        sweep()
        self.prefix = prefix or f"dg{os.getpid()}x{_next_id()}"
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{0,31}", self.prefix):
            raise ValueError(f"simulated hosts prefix {self.prefix!r}: letters, digits, _ "
                             "and -, at most 32")
        self.switch = f"{self.prefix}-sw"
        self._procs = []
        self._lock = threading.Lock()
        self._record = {"owner": owner or (os.getpid() if guard else None), "namespaces": [],
                        "shm": [], "etc": [], "tmp": [], "root_link": None, "hosts": [],
                        "caller_address": None, "bandwidth": bandwidth}
        self._closed = False
        self._guardian = None
        self.hosts = []
        self.caller_address = None
        try:
            self._subnet = _claim_subnet(self.prefix)
            self._record["subnet"] = str(self._subnet)
            # results of Host.spawn's calls, removed with the hosts (a call whose result
            # nobody reads, a bench stopped midway, leaves none behind)
            self.calls_dir = tempfile.mkdtemp(prefix=f"distgrad-hostcalls-{self.prefix}-")
            self._record["tmp"].append(self.calls_dir)
            self._save()
            if guard:
                self._guardian = guard_in_background(self._record_path())
            self._build(n, private_shm, ipv6, attach_caller)
        except BaseException:
            self.close()
            raise

    # -- building
    def _record_path(self):
        return os.path.join(registry_dir(), f"{self.prefix}.json")

    def _save(self):
        path = self._record_path()
        with open(path + ".tmp", "w") as fh:
            json.dump(self._record, fh)
        os.replace(path + ".tmp", path)

    def _add_netns(self, name):
        _ip(["netns", "add", name])
        self._record["namespaces"].append(name)
        self._save()
        _ip(["link", "set", "lo", "up"], netns=name)

    def _build(self, n, private_shm, ipv6, attach_caller):
        net = self._subnet
        net6 = _subnet6(net)
        self._add_netns(self.switch)
        _ip(["link", "add", "br0", "type", "bridge"], netns=self.switch)
        _ip(["link", "set", "br0", "up"], netns=self.switch)
        names = [f"host{i}" for i in range(n)]
        addresses = [str(net.network_address + i + 1) for i in range(n)]
        addresses6 = [str(net6.network_address + i + 1) for i in range(n)] if ipv6 else [None] * n
        hosts_file = "".join(f"{a} {name}\n" for a, name in zip(addresses, names))
        hosts_file += "".join(f"{a} {name}\n" for a, name in zip(addresses6, names) if a)
        for i, (name, address, address6) in enumerate(zip(names, addresses, addresses6)):
            netns = f"{self.prefix}-{name}"
            self._add_netns(netns)
            # one end (eth0) in the host, the other on the switch's bridge
            _ip(["link", "add", f"p{i}", "type", "veth", "peer", "name", "eth0", "netns",
                 netns], netns=self.switch)
            _ip(["link", "set", f"p{i}", "master", "br0", "up"], netns=self.switch)
            _ip(["addr", "add", f"{address}/{net.prefixlen}", "dev", "eth0"], netns=netns)
            if address6:
                _ip(["addr", "add", f"{address6}/64", "dev", "eth0", "nodad"], netns=netns)
            _ip(["link", "set", "eth0", "up"], netns=netns)
            if self.rate is not None:
                _shape(netns, "eth0", self.rate)
            etc = os.path.join("/etc/netns", netns)
            os.makedirs(etc, exist_ok=True)
            self._record["etc"].append(etc)
            with open(os.path.join(etc, "hosts"), "w") as fh:
                fh.write(f"127.0.0.1 localhost\n::1 localhost ip6-localhost\n{hosts_file}")
            shm_dir = None
            if private_shm:
                shm_dir = os.path.join(_SHM_ROOT, f"{netns}-shm")
                os.makedirs(shm_dir, mode=0o1777, exist_ok=True)
                os.chmod(shm_dir, 0o1777)
                self._record["shm"].append(shm_dir)
            self._record["hosts"].append([name, netns, address, address6, shm_dir])
            self._save()
            self.hosts.append(Host(self, i, name, netns, address, address6, shm_dir))
        if attach_caller:
            link = self.prefix[:13] + "c"
            self._record["root_link"] = link
            self._save()
            _ip(["link", "add", link, "type", "veth", "peer", "name", "pc", "netns",
                 self.switch])
            _ip(["link", "set", "pc", "master", "br0", "up"], netns=self.switch)
            self.caller_address = str(net.broadcast_address - 1)
            _ip(["addr", "add", f"{self.caller_address}/{net.prefixlen}", "dev", link])
            _ip(["link", "set", link, "up"])
            self._record["caller_address"] = self.caller_address
            self._save()
        self._wait_reachable()

    @classmethod
    def existing(cls, prefix):
        """The hosts made earlier under ``prefix`` (by ``distgrad hosts up``), to run
        commands on; closing them removes them."""
        path = os.path.join(registry_dir(), f"{prefix}.json")
        try:
            with open(path) as fh:
                record = json.load(fh)
        except (OSError, ValueError):
            raise LookupError(f"no simulated hosts named {prefix!r} (made with `distgrad hosts "
                              f"up --name {prefix}`?); there are: {listed() or 'none'}") from None
        self = cls.__new__(cls)
        self.prefix, self.switch, self.bandwidth = prefix, f"{prefix}-sw", record.get("bandwidth")
        self.rate = parse_rate(self.bandwidth) if self.bandwidth else None
        self._procs, self._lock, self._record = [], threading.Lock(), record
        self._closed, self._guardian = False, None
        self.caller_address = record.get("caller_address")
        self.calls_dir = (record.get("tmp") or [tempfile.gettempdir()])[0]
        self.hosts = [Host(self, i, *h) for i, h in enumerate(record.get("hosts", []))]
        return self

    def _wait_reachable(self, timeout=10.0):
        """Return once the bridge forwards (its ports leave the learning state at once
        with STP off, but the first packets can race the links coming up)."""
        if len(self.hosts) < 2:
            return
        a, b = self.hosts[0], self.hosts[-1]
        script = ("import socket,sys,time\n"
                  "end=time.monotonic()+%r\n"
                  "while True:\n"
                  "  s=socket.socket(); s.settimeout(0.2)\n"
                  "  try: s.connect((sys.argv[1], 9)); break\n"
                  "  except ConnectionRefusedError: break\n"
                  "  except OSError:\n"
                  "    if time.monotonic()>end: sys.exit('unreachable')\n"
                  "  finally: s.close()\n" % timeout)
        a.run([sys.executable, "-c", script, b.address], timeout=timeout + 5)

    # -- using
    def __iter__(self):
        return iter(self.hosts)

    def __len__(self):
        return len(self.hosts)

    def __getitem__(self, i):
        return self.hosts[i]

    def host(self, name):
        for h in self.hosts:
            if h.name == name or h.netns == name:
                return h
        raise KeyError(f"no simulated host {name!r} (there are {[h.name for h in self.hosts]})")

    def _started(self, proc):
        with self._lock:
            if self._closed:
                proc.kill()
                raise RuntimeError("these simulated hosts are closed")
            self._procs = [p for p in self._procs if p.poll() is None] + [proc]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        """Kill and reap every process started on the hosts, remove every namespace,
        link, file and directory made for them. Safe to call twice."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            procs, self._procs = self._procs, []
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.kill()
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(10)
        remove(self._record)
        with contextlib.suppress(OSError):
            os.unlink(self._record_path())
        if self._guardian is not None:
            self._guardian.stdin.close()  # nothing left for it: it exits
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._guardian.wait(10)


def _tc(netns, args):
    done = subprocess.run(["tc", "-n", netns, *args], capture_output=True, text=True,
                          timeout=30)
    if done.returncode != 0:
        raise OSError(f"simulated hosts: `tc {' '.join(args)}` failed: {done.stderr.strip()}")


def _shape(netns, dev, bits_per_s):
    """tbf on ``dev``: ``bits_per_s``, with a bucket of a few ms of traffic (at least 64 KB
    plus a frame, so segmentation offload's large packets pass)."""
    burst = max(int(bits_per_s / 8 / 250), 65536 + 1514)
    _ip(["link", "set", dev, "txqueuelen", "10000"], netns=netns)
    _tc(netns, ["qdisc", "add", "dev", dev, "root", "tbf", "rate", f"{int(bits_per_s)}bit",
                "burst", str(burst), "latency", "50ms"])


def _subnet6(net):
    a, b = net.network_address.packed[1:3]
    return ipaddress.ip_network(f"fd00:d9:{a:x}:{b:x}::/64")


def _claim_subnet(prefix):
    """A /24 of 10.0.0.0/8 that no other live simulated hosts (nor the caller's namespace's
    routes) use: only hosts attached to the caller's namespace could clash, but a distinct
    subnet each keeps addresses telling in logs."""
    used = set()
    root = registry_dir()
    for name in os.listdir(root):
        if name.endswith(".json"):
            with contextlib.suppress(OSError, ValueError):
                with open(os.path.join(root, name)) as fh:
                    used.add(json.load(fh).get("subnet"))
    routes = _ip(["-4", "route", "show", "table", "all"], check=False).stdout
    start = int.from_bytes(os.urandom(2), "big")
    for k in range(4096):
        third = (start + k) % 4096
        net = ipaddress.ip_network(f"10.{200 + third // 256 % 50}.{third % 256}.0/24")
        if str(net) not in used and str(net.network_address)[:-2] not in routes:
            return net
    raise OSError("simulated hosts: no free subnet in 10.200.0.0/13")
