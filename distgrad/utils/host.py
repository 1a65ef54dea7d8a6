"""Which boot of which host this process runs on, and which network it sees."""
import os
import socket

__all__ = ["boot_id", "network_id"]


def boot_id():
    """This boot of this host: processes that share it share the kernel (their pids name
    the same processes, a unix socket path reaches the same socket)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip() or "unknown"
    except OSError:
        return f"host-{socket.gethostname()}"


def network_id():
    """This boot of this host and the network namespace this process sees: processes of
    one machine in different namespaces (containers, simulated hosts) are apart as hosts
    on a network are, so no same-host shortcut is taken between them."""
    try:
        ns = os.stat("/proc/self/ns/net").st_ino
    except OSError:
        ns = 0
    return f"{boot_id()}/{ns}"
