"""``distgrad hosts``: simulated hosts by hand (see ``distgrad/testing/hosts.py``).

    distgrad hosts up 2 --bandwidth 1Gbit/s --private-shm   # host0, host1 (prints them)
    distgrad hosts exec host1 -- python -c "import socket; print(socket.gethostname())"
    distgrad hosts list
    distgrad hosts down

Hosts made here stay until ``down`` (``--name``, or ``DISTGRAD_HOSTS_NAME``, keeps several
sets apart); with ``DISTGRAD_HOSTS_OWNER=<pid>`` they also go when that process has ended
(the next time simulated hosts are made or swept), as a test's would.
"""
import os
import sys

HELP = "make simulated hosts (network namespaces) and run commands on them"


def _default_name():
    return os.environ.get("DISTGRAD_HOSTS_NAME") or "dg"


def add_arguments(p):
    name = _default_name()
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    up = sub.add_parser("up", help="make N hosts joined by a switch")
    up.add_argument("n", type=int, help="how many hosts")
    up.add_argument("--name", default=name,
                    help="name of this set of hosts (default: %(default)s; env: "
                         "DISTGRAD_HOSTS_NAME)")
    up.add_argument("--bandwidth", default=None,
                    help="what each host may send, e.g. 1Gbit/s (tc tbf); default: no limit")
    up.add_argument("--private-shm", action="store_true", help="a /dev/shm of each host's own")
    up.add_argument("--ipv6", action="store_true", help="IPv6 addresses as well")
    up.add_argument("--attach", action="store_true",
                    help="join this machine's own network namespace to the switch too")
    ex = sub.add_parser("exec", help="run a command on a host: exec HOST -- COMMAND...")
    ex.add_argument("host", help="host0, host1, ...")
    ex.add_argument("--name", default=name, help="the set of hosts (default: %(default)s)")
    ex.add_argument("argv", nargs="+", help="the command (after --)")
    sub.add_parser("list", help="the sets of hosts on this machine, and their hosts")
    down = sub.add_parser("down", help="remove a set of hosts and everything running on it")
    down.add_argument("--name", default=name, help="the set of hosts (default: %(default)s)")


def run(args, parser):
    from . import hosts as simulated

    if args.action == "up":
        if args.name in simulated.listed():
            parser.error(f"simulated hosts {args.name!r} exist already: `distgrad hosts down "
                         f"--name {args.name}` first, or choose another --name")
        owner = os.environ.get("DISTGRAD_HOSTS_OWNER")
        try:
            made = simulated.SimulatedHosts(args.n, bandwidth=args.bandwidth,
                                            private_shm=args.private_shm, ipv6=args.ipv6,
                                            attach_caller=args.attach, prefix=args.name,
                                            guard=False, owner=int(owner) if owner else None)
        except (OSError, ValueError) as e:
            parser.error(str(e))
        _describe(made)
        return 0
    if args.action == "list":
        for prefix in simulated.listed():
            try:
                made = simulated.SimulatedHosts.existing(prefix)
            except LookupError:
                continue  # removed since it was listed (by its owner, at the same time)
            _describe(made)
        return 0
    if args.action == "down":
        removed = simulated.sweep(prefix=args.name)
        if not removed:
            parser.error(f"no simulated hosts named {args.name!r}")
        print(f"removed simulated hosts {args.name!r}")
        return 0
    try:
        host = simulated.SimulatedHosts.existing(args.name).host(args.host)
    except (LookupError, KeyError) as e:
        parser.error(str(e).strip("'\""))
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    sys.stdout.flush()
    os.execvp(host.command(argv)[0], host.command(argv))


def _describe(made):
    print(f"simulated hosts {made.prefix!r}"
          + (f" (each sends at most {made.bandwidth})" if made.bandwidth else ""))
    for h in made:
        print(f"  {h.name:8} {h.address:16} {h.address6 or ''}".rstrip())
    if made.caller_address:
        print(f"  {'(this machine)':8} {made.caller_address}")
