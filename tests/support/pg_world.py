"""A process-group world of spawned ranks that a test drives, case by case.

The test process serves a :class:`TCPStore`; each rank (a spawned process that dies
with the test process, ``die_with_parent``) joins the process group through it and then
runs the cases the test posts: ``world.run("case", *args)`` runs
``CASES["case"](ctx, *args)`` of the cases modules (``options["cases"]``, by default
``support.pg_cases``; the first one's ``Context``) on every rank and returns the
ranks' results (a case that raises on any rank fails the call, with the rank's
traceback). Case names are looked up in that one registry: nothing that comes
through the store is imported or evaluated, and arguments and results travel
through ``distgrad.codec``.

Every rank is reaped when the world closes, also when a test failed; a rank that
dies unexpectedly fails the waiting call at once.
"""
import multiprocessing
import os
import time
import traceback

from distgrad import codec
from distgrad.distributed import TCPStore
from distgrad.distributed.comm import IPC_DIR_PREFIX
from distgrad.utils.processes import die_with_parent, reap
from distgrad.rpc.credentials import SECRET_ENV, new_world_secret
from distgrad.utils.tempdirs import sweep_stale

__all__ = ["World", "Context", "registry"]

_POLL = 0.05


def registry():
    """A cases module's table and the decorator that fills it: ``CASES, case = registry()``."""
    cases = {}

    def case(fn):
        cases[fn.__name__] = fn
        return fn
    return cases, case


class Context:
    """What a case gets besides its arguments (a cases module may define a richer one)."""

    def __init__(self, rank, n, store, options):
        self.rank, self.n, self.store, self.options = rank, n, store, options


class World:
    def __init__(self, n, timeout=20.0, options=None):
        self.n = n
        self.timeout = timeout
        self.store = TCPStore("127.0.0.1", 0, is_master=True, timeout=timeout)
        self.count = 0
        # plain spawned processes: a world may live for a whole session, and spawn()'s
        # error-file directory would outlive the tests that check for leftovers
        ctx = multiprocessing.get_context("spawn")
        secret = new_world_secret()  # the ranks' world admits only them (members.py)
        self.processes = [ctx.Process(target=_rank_main, daemon=True,
                                      args=(r, n, self.store.port, dict(options or {}),
                                            os.getpid(), secret))
                          for r in range(n)]
        for p in self.processes:
            p.start()
        try:
            self.run("ready")
        except BaseException:
            self.close()
            raise

    def post(self, case, *args, ranks=None):
        """Post a case for ``ranks`` (default all); return its number (see :meth:`collect`)."""
        self.count += 1
        k = self.count
        self.store.set(f"cmd/{k}", codec.dumps([case, list(args),
                                                list(range(self.n)) if ranks is None
                                                else list(ranks)]))
        return k

    def collect(self, k, ranks=None, timeout=None, dead=()):
        """The results of case ``k`` from ``ranks``; ranks in ``dead`` are expected to die."""
        ranks = list(range(self.n)) if ranks is None else list(ranks)
        deadline = time.monotonic() + (timeout or self.timeout)
        keys = {r: f"res/{k}/{r}" for r in ranks}
        while True:
            done = [r for r in ranks if self.store.check([keys[r]])]
            if len(done) == len(ranks):
                break
            for r in done:  # a rank that failed: the others may wait for it forever
                ok, value = codec.loads(self.store.get(keys[r]))
                if not ok:
                    raise AssertionError(f"case failed on rank {r} (ranks "
                                         f"{sorted(set(ranks) - set(done))} still running):\n"
                                         f"{value}")
            for r, p in enumerate(self.processes):
                if not p.is_alive() and r not in dead and r in ranks and r not in done:
                    raise AssertionError(f"rank {r} died (exit code {p.exitcode}) during case "
                                         f"{k}")
            if time.monotonic() > deadline:
                raise AssertionError(f"case {k}: ranks {sorted(set(ranks) - set(done))} did "
                                     f"not answer within {timeout or self.timeout:g} s")
            time.sleep(_POLL)
        results, errors = [], []
        for r in ranks:
            ok, value = codec.loads(self.store.get(keys[r]))
            if not ok:
                errors.append(f"--- rank {r}:\n{value}")
            results.append(value)
        if errors:
            raise AssertionError("case failed:\n" + "\n".join(errors))
        return results

    def run(self, case, *args, ranks=None, timeout=None):
        return self.collect(self.post(case, *args, ranks=ranks), ranks, timeout)

    def close(self):
        try:
            self.post("stop")
            deadline = time.monotonic() + 10
            while any(p.is_alive() for p in self.processes) and time.monotonic() < deadline:
                time.sleep(_POLL)
        except Exception:  # noqa: BLE001 - reap below whatever happened
            pass
        reap(self.processes, grace_period=2.0)
        self.store.close()
        sweep_stale(IPC_DIR_PREFIX)  # the socket directories of ranks that were killed


def _rank_main(rank, n, port, options, parent, secret):
    die_with_parent(parent)
    os.environ[SECRET_ENV] = secret
    serve(rank, n, port, options)


def serve(rank, n, port, options):
    """A rank's loop: join the group, then run posted cases until told to stop. The
    cases come from ``options["cases"]`` (a module of ``support``; spawn arguments come
    from the test process itself, never from a socket)."""
    import importlib
    import distgrad.distributed as dist
    modules = [importlib.import_module(m) for m in options.get("cases", ["support.pg_cases"])]
    table = {}
    for m in modules:
        clash = set(table) & set(m.CASES)
        if clash:  # one name, two cases: the later one would silently replace the other
            raise RuntimeError(f"cases {sorted(clash)} of {m.__name__} are already defined")
        table.update(m.CASES)
    for m in modules:
        if hasattr(m, "configure"):
            m.configure(options)  # before the group forms: knobs its communicator reads
    store = TCPStore("127.0.0.1", port, timeout=3600)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=n,
                            timeout=options.get("timeout", 30))
    ctx = getattr(modules[0], "Context", Context)(rank, n, store, options)
    k = 0
    while True:
        k += 1
        case, args, ranks = codec.loads(store.get(f"cmd/{k}"))
        if case == "stop":
            break
        if rank not in ranks:
            continue
        try:
            value = [True, os.getpid() if case == "ready" else table[case](ctx, *args)]
        except BaseException:  # noqa: BLE001 - the test gets the traceback
            value = [False, traceback.format_exc()]
        store.set(f"res/{k}/{rank}", codec.dumps(value))
    if dist.is_initialized():
        dist.destroy_process_group()
    os._exit(0)  # skip interpreter teardown: the test waits for this process
