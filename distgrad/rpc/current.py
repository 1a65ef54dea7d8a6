"""The process's RPC agent (one at a time), for the modules that need it without importing
the agent's module (RRefs are created by the agent and refer back to it)."""
import threading

__all__ = ["current_agent", "install", "uninstall"]

_agent = None
_lock = threading.Lock()


def current_agent():
    """The running agent of this process, or None."""
    return _agent


def install(agent):
    global _agent
    with _lock:
        if _agent is not None and _agent.running:
            raise RuntimeError("init_rpc was already called in this process (call shutdown first)")
        _agent = agent


def uninstall(agent):
    global _agent
    with _lock:
        if _agent is agent:
            _agent = None
