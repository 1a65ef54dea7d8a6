"""``torch.distributed.launch``, the legacy launcher: ``python -m distgrad.distributed.launch``
(and ``python -m torch.distributed.launch`` under ``distgrad.compat.as_torch``).

::

    python -m distgrad.distributed.launch --nproc-per-node 2 train.py --epochs 3
    python -m distgrad.distributed.launch --use-env --nproc-per-node 2 train.py

The same launcher as ``distgrad.distributed.run`` (our torchrun: its arguments, its
workers' environment, its restarts and reports), with PyTorch's two legacy
differences: unless ``--use-env`` is given, each worker gets ``--local-rank=<local
rank>`` as its first argument after the script (``LOCAL_RANK`` is set as well), and
``--no-python`` needs ``--use-env``. Like PyTorch's, it warns (``FutureWarning``) that
it is deprecated in favour of torchrun.
"""
import warnings

from .run import get_args_parser, run

__all__ = ["parse_args", "launch", "main"]

_DEPRECATION = (
    "The module torch.distributed.launch is deprecated\n"
    "and will be removed in future. Use torchrun.\n"
    "Note that --use-env is set by default in torchrun.\n"
    "If your script expects `--local-rank` argument to be set, please\n"
    "change it to read from `os.environ['LOCAL_RANK']` instead. See \n"
    "https://pytorch.org/docs/stable/distributed.html#launch-utility for \n"
    "further instructions\n")


def parse_args(args):
    """torchrun's command line and ``--use-env``."""
    parser = get_args_parser()
    parser.add_argument("--use-env", "--use_env", default=False, action="store_true",
                        help="Use environment variable to pass 'local rank'. For legacy "
                             "reasons, the default value is False. If set to True, the "
                             "script will not pass --local-rank as argument, and will "
                             "instead set LOCAL_RANK.")
    return parser.parse_args(args)


def launch(args):
    if args.no_python and not args.use_env:
        raise ValueError("When using the '--no-python' flag, you must also set the "
                         "'--use-env' flag.")
    run(args)


def main(args=None):
    warnings.warn(_DEPRECATION, FutureWarning, stacklevel=2)
    launch(parse_args(args))


if __name__ == "__main__":
    main()
