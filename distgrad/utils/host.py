"""Which boot of which host this process runs on."""
import socket

__all__ = ["boot_id"]


def boot_id():
    """This boot of this host: processes that share it share the kernel (ipc:// works, and
    their pids name the same processes)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip() or "unknown"
    except OSError:
        return f"host-{socket.gethostname()}"
