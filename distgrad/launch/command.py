"""``distgrad launch CONFIG [KEY=VALUE ...]``: train across worker processes.

    distgrad launch configs/quickstart.toml
    distgrad launch configs/quickstart.toml optim.lr=0.003 world.workers=3 --trace t.json
    distgrad launch configs/quickstart.toml --resume          # this config's run, on from
                                                              # its last checkpoint
    distgrad launch configs/ddp_quickstart.toml               # data parallel: 2 replicas

Exit status: 0 when training finished (or --resume found the run complete); 2 for a
config or command-line error, or a --resume that fits no run (nothing was started);
128+N when stopped by signal N (Ctrl-C: 130); otherwise the exit status of the first
process that failed (128+N if a signal killed it), or 1 when a worker raised or
stopped answering.
"""
import argparse
import json
import os
import signal
import sys

from distgrad.utils.cli import PrintAndExit, env

from . import checkpoint as ckpt
from . import environment, resume
from .config import ConfigError, describe_schema, error_for, load_config

__all__ = ["HELP", "add_arguments", "run", "main"]

HELP = "train a model across worker processes from a TOML config"


def _ranks(text):
    try:
        ranks = {int(part) for part in text.split(",") if part.strip()}
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of ranks "
                                         "(e.g. 0,2)") from None
    if not ranks or min(ranks) < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: ranks are integers >= 0")
    return ranks


def add_arguments(p, rest=argparse.REMAINDER):
    p.add_argument("config", help="the TOML config of the run (see configs/*.toml and "
                                  "--help-config)")
    # REMAINDER, read again by _intermixed: argparse alone would not take overrides that
    # follow an option (`cfg.toml --trace t.json optim.lr=0.1`)
    p.add_argument("overrides", nargs=rest, metavar="KEY=VALUE",
                   help="replace config values, e.g. optim.lr=0.01 world.workers=3 "
                        "(values are TOML; a bare word is a string)")
    p.add_argument("--resume", action="store_true",
                   default=env("DISTGRAD_RESUME", "0") not in ("0", "false", "no"),
                   help="continue the run in --run-dir, or the newest run of this config's "
                        "name that is this config's training (same model, layout, optimizer, "
                        "data, seed), from its last complete checkpoint; losses are the same, "
                        "bit for bit, as a run that never stopped; a run already complete is "
                        "said so and nothing starts (default: off, or run.resume; env: "
                        "DISTGRAD_RESUME=1)")
    p.add_argument("--run-dir", metavar="DIR", default=env("DISTGRAD_RUN_DIR"),
                   help="the run directory (default: <run.dir>/<run.name>-<date>-<time>; "
                        "env: DISTGRAD_RUN_DIR)")
    p.add_argument("--trace", metavar="FILE", default=env("DISTGRAD_TRACE"),
                   help="write a Chrome trace (open it in ui.perfetto.dev) of every process "
                        "to FILE (default: none; env: DISTGRAD_TRACE)")
    p.add_argument("--show", metavar="RANKS", type=_ranks, default=env("DISTGRAD_SHOW"),
                   help="print only these ranks' output, e.g. 0,2; all of it is in the run "
                        "directory's logs (default: every rank; env: DISTGRAD_SHOW)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar or progress lines (default: a tqdm bar on a "
                        "terminal, a line per tenth of the run otherwise)")
    p.add_argument("--no-plot", action="store_true",
                   help="skip the loss curve (default: loss.png in the run directory when "
                        "matplotlib is installed)")
    p.add_argument("--local", action="store_true",
                   help="start every process here even when Slurm or torchrun variables "
                        "(SLURM_PROCID, RANK, ...) are set (default: follow them)")
    p.add_argument("--check", action="store_true",
                   help="check the config and print it resolved, with defaults; start nothing")
    p.add_argument("--help-config", action=PrintAndExit, lines=describe_schema,
                   help="list every config key with its meaning and default, and exit")
    return p


def _intermixed(args):
    """Options and overrides in any order after the config (see add_arguments)."""
    parser = add_arguments(argparse.ArgumentParser(prog="distgrad launch", description=HELP),
                           rest="*")
    # the options given before the config stay; the positionals are parsed anew (a
    # namespace that already holds them makes argparse warn "Do not expect overrides")
    given = argparse.Namespace(**{k: v for k, v in vars(args).items()
                                  if k not in ("config", "overrides")})
    return parser.parse_intermixed_args([args.config, *args.overrides], namespace=given)


def _fail(message):
    print(f"distgrad launch: error: {message}", file=sys.stderr)
    return 2


def _prepare(args):
    """(config, plan, layout) or ConfigError/ValueError, before anything starts."""
    from .resolve import plan
    config = load_config(args.config, args.overrides)
    resolved = plan(config, lambda key, message: error_for(args.config, key, message,
                                                           args.overrides))
    layout = environment.detect(config["world"]["workers"], force_local=args.local,
                                port=config["world"]["rendezvous_port"])
    _check_restarts(config, layout)
    return config, resolved, layout


def _check_restarts(config, layout):
    """Under torchrun its agent restarts a failed world (its --max-restarts), and each
    restart continues from the last checkpoint: run.max_restarts may not promise more
    restarts than the agent makes."""
    wanted = config["run"]["max_restarts"]
    if layout.engine_restarts is None:
        return
    if wanted > layout.engine_restarts:
        raise ValueError(f"run.max_restarts={wanted}, but torchrun restarts this launch at most "
                         f"{layout.engine_restarts} times (TORCHELASTIC_MAX_RESTARTS): under "
                         f"torchrun its agent restarts the world; give it --max-restarts "
                         f"{wanted}, or run.max_restarts={layout.engine_restarts}")


def _blas_threads(config, layout):
    value = config["world"]["blas_threads"]
    if value != "auto":
        return value
    local = len(layout.ranks) - (1 if 0 in layout.ranks else 0) or 1
    return max(1, environment.cpu_count() // local)


def run(args, parser=None):
    from distgrad import __version__
    from .console import Console, plot_loss
    from .supervisor import Supervisor

    args = _intermixed(args)
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # user modules named in the config
    try:
        config, resolved, layout = _prepare(args)
        meeting = None if layout.local else environment.check_addresses(
            layout, layout.bind_addr or config["world"]["bind_addr"])
    except (ConfigError, ValueError) as e:
        return _fail(e)
    if args.check:
        print(json.dumps(config, indent=2))
        print(f"# {_stages(resolved)}{_replicas(config)}, layers per stage "
              f"{resolved.balance}, parameters per stage {resolved.stage_parameters}; "
              f"{layout.kind} launch of {layout.world_size} processes", file=sys.stderr)
        return 0
    console = Console(show=args.show, progress=not args.no_progress)
    if meeting:
        console.note(meeting)
    if layout.group_size < layout.world_size:
        console.note(f"{layout.kind}'s group has {layout.group_size} processes for a world of "
                     f"{layout.world_size}: this one starts {_span(layout.ranks)}")
    if layout.agent_store:  # the run's name and where rank 0 listens, via torchrun's store
        try:
            environment.torchrun_rendezvous(layout,
                                            timeout=config["world"]["rendezvous_timeout"])
        except Exception as e:  # noqa: BLE001 - the store's errors: RuntimeError and kin
            console.close()
            print(f"distgrad launch: error: torchrun's store at {os.environ.get('MASTER_ADDR')}:"
                  f"{os.environ.get('MASTER_PORT')} did not give the rendezvous: {e}",
                  file=sys.stderr)
            return 1
    # a restart by the engine (torchrun's agent) continues the run from its last checkpoint
    again = layout.restart > 0
    try:
        where = resume.place(config, resolved,
                             resume=args.resume or config["run"]["resume"] or again,
                             run_dir=args.run_dir, run_id=layout.run_id, note=console.note)
    except resume.ResumeError as e:
        return _fail(e)
    run_dir, resume_from = where.run_dir, where.resume_from
    if where.complete is not None:
        console.note(f"{run_dir} is complete: it finished at step {where.complete}, all this "
                     f"config asks for (give more run.steps to go on); nothing to do")
        print(f"run directory: {run_dir}", flush=True)
        return 0
    launch = {"version": __version__, "command": sys.argv, "config_file":
              os.path.abspath(args.config), "overrides": list(args.overrides),
              "config": config, "trace": os.path.abspath(args.trace) if args.trace else None}
    console.note(f"run directory {run_dir}; {layout.kind} launch, "
                 f"{_span(layout.ranks)} of {layout.world_size}; model "
                 f"{resolved.parameters:,} parameters in {_stages(resolved)} "
                 f"(layers {resolved.balance}){_replicas(config)}")
    attempt, restarts = 0, config["run"]["max_restarts"]
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        while True:
            supervisor = Supervisor(run_dir, layout, launch, console,
                                    resolved.worker_modules(), _blas_threads(config, layout))
            for s in previous:
                signal.signal(s, supervisor.on_signal)
            supervisor.start(resume_from, attempt)
            outcome = supervisor.run()
            if outcome.failed and not layout.local and restarts and 0 in layout.ranks \
                    and layout.engine_restarts is None:
                outcome.message += (f"; not restarted (run.max_restarts={restarts}): the "
                                    f"launchers of this {layout.kind} launch start only their own "
                                    f"ranks and cannot restart the world on what remains; "
                                    f"start it again with --resume (it continues from its last "
                                    f"checkpoint), or run it under torchrun with --max-restarts "
                                    f"and an elastic --nnodes MIN:MAX")
            if outcome.failed and attempt < restarts and layout.local and not supervisor.signals:
                found = ckpt.latest(run_dir)
                resume_from = found[0] if found else None
                attempt += 1
                console.note(f"{outcome.message}; restart {attempt} of {restarts} from "
                             + (f"step {found[1]['step']}" if found else "the beginning"))
                continue
            break
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        console.close()
    return _report(outcome, run_dir, supervisor.records, console,
                   None if args.no_plot else plot_loss, 0 in layout.ranks)


def _stages(resolved):
    n = len(resolved.layers)
    return f"{n} stage{'s' if n > 1 else ''}"


def _replicas(config):
    replicas = config["world"]["replicas"]
    return f" x {replicas} data-parallel replicas" if replicas > 1 else ""


def _span(ranks):
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(map(str, ranks))


def _report(outcome, run_dir, records, console, plot_loss, coordinator_here):
    if outcome.status == "finished" and coordinator_here:
        if plot_loss is not None:
            path, note = plot_loss(run_dir, records)
            console.note(note or f"loss curve: {path}")
        final = next((r for r in reversed(records) if "eval_loss" in r), None)
        if final:
            console.note("held-out loss {:.4f}".format(final["eval_loss"])
                         + (f", accuracy {final['eval_accuracy']:.4f}"
                            if "eval_accuracy" in final else ""))
    elif outcome.status == "stopped":
        console.note(outcome.message + "; continue with --resume")
    elif outcome.failed:
        console.note(f"FAILED: {outcome.message} (exit status {outcome.code})")
        if outcome.root_cause:
            console.note("root cause:")
            for line in outcome.root_cause.rstrip().splitlines():
                console.note("  " + line)
    print(f"run directory: {run_dir}", flush=True)
    return outcome.code


def main(argv=None):
    parser = add_arguments(argparse.ArgumentParser(prog="distgrad launch", description=HELP))
    return run(parser.parse_args(argv), parser)


if __name__ == "__main__":
    sys.exit(main())
