"""The processes of an experiment: one per ``[[run]]``, in lockstep, and the store they share.

The parent (:func:`run_experiment`) starts every run's process with
``python -m distgrad.offload.experiment.runner CONFIG.json INDEX [STORE]``, and an
activation store (``distgrad store``) when a run asks for ``store = "local"``; the
child (:func:`main`) builds the model, its forward (checkpointed or not, in distgrad or
PyTorch: :mod:`.methods`) and its hook object, then serves measured steps (see
:mod:`distgrad.offload.harness`). Every process is reaped and the store
stopped when the experiment ends, also when it fails.
"""
import json
import os
import sys
import tempfile
from contextlib import nullcontext

from ..harness import Lockstep, serve_training
from .config import offload_table, uses_local_store

__all__ = ["run_experiment", "main"]

#: where ``distgrad`` is imported from: the children import the same one
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))


def _child(config, index, endpoint):
    from distgrad.offload import hooks_from_config
    from .methods import build
    run = config["run"][index]
    model, x, forward = build(config["model"], run)
    table = offload_table(run)
    store = endpoint if uses_local_store(run) else None
    if store is not None:
        table.pop("store", None)
    hooks = hooks_from_config(table, f"run {run['name']!r}", model=model, store=store)
    serve_training(model, x, hooks, config["experiment"]["timeline_interval"], forward)


def run_experiment(config, progress=iter):
    """Run every ``[[run]]`` of ``config`` (as :func:`~.config.load_config` returns it, or
    changed since); returns ``{run name: measurements}`` (see
    :class:`~distgrad.offload.harness.Lockstep`) with each run's offload counters under
    ``"stats"``. ``progress(rounds)`` wraps the rounds (a progress bar)."""
    env = {"PYTHONPATH": os.pathsep.join(p for p in (_ROOT, os.environ.get("PYTHONPATH"))
                                         if p)}
    with tempfile.TemporaryDirectory(prefix="offload-experiment-") as tmp:
        # the children read this checked copy: the config they run is the parent's
        path = os.path.join(tmp, "config.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(config, f)
        from ..store.command import spawn_store
        st = config["store"]
        bind = f"ipc://{tmp}/store.sock" if st["bind"] == "ipc" else "tcp://127.0.0.1:0"
        needs_store = any(uses_local_store(run) for run in config["run"])
        store = spawn_store("--bind", bind, "--memory-bytes", str(st["memory_bytes"])) \
            if needs_store else nullcontext((None, None))
        with store as (endpoint, _):
            argvs = {}
            for i, run in enumerate(config["run"]):
                argv = [sys.executable, "-m", __name__, path, str(i)]
                argvs[run["name"]] = argv + ([endpoint] if uses_local_store(run) else [])
            with Lockstep(argvs, env=env) as lockstep:
                for _ in progress(range(config["experiment"]["steps"])):
                    lockstep.round()
                results = lockstep.summary()
                for name, final in lockstep.finish().items():
                    results[name]["stats"] = final.get("stats")
    return results


def main(argv=None):
    """The child: ``CONFIG.json INDEX [STORE ENDPOINT]`` (the parent's checked config)."""
    argv = sys.argv[1:] if argv is None else argv
    with open(argv[0], encoding="utf-8") as f:
        config = json.load(f)
    _child(config, int(argv[1]), argv[2] if len(argv) > 2 else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
