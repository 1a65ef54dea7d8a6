"""The ``distgrad`` console command (also ``python -m distgrad``).

    distgrad worker --name worker1 --rank 1 --world-size 2 --master-addr 127.0.0.1 --master-port 29500

Each subcommand is a module with ``HELP``, ``add_arguments(parser)`` and
``run(args, parser)``; it is imported only when its command runs, so
``distgrad --help`` stays fast.
"""
import argparse
import importlib
import sys

#: subcommand -> module implementing it
COMMANDS = {
    "worker": "distgrad.worker",
    "launch": "distgrad.launch.command",
    "offload": "distgrad.offload.experiment.command",
    "store": "distgrad.offload.store.command",
    "hosts": "distgrad.testing.hosts_command",
}


def _version():
    from distgrad import __version__
    return __version__


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="distgrad", description="distgrad command line")
    parser.add_argument("--version", action="version", version=f"distgrad {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = next((a for a in argv if a in COMMANDS), None)
    subparsers = {}
    for name, module_name in COMMANDS.items():
        if name == chosen:  # only the chosen command's module is imported
            module = importlib.import_module(module_name)
            sp = sub.add_parser(name, help=module.HELP, description=module.HELP)
            module.add_arguments(sp)
            subparsers[name] = (module, sp)
        else:
            sub.add_parser(name, help=_help_of(module_name))
    args = parser.parse_args(argv)
    module, sp = subparsers[args.command]
    return module.run(args, sp)


def _help_of(module_name):
    """A command's one-line help without importing what it runs (its HELP constant)."""
    import ast
    spec = importlib.util.find_spec(module_name)
    try:
        with open(spec.origin, encoding="utf-8") as fh:
            tree = ast.parse(fh.read())
    except (OSError, AttributeError, TypeError, SyntaxError):
        return None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "HELP" for t in node.targets) \
                and isinstance(node.value, ast.Constant):
            return node.value.value
    return None


if __name__ == "__main__":
    sys.exit(main())
