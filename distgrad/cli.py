"""The ``distgrad`` console command.

    distgrad worker --name worker1 --rank 1 --world-size 2 --master-addr 127.0.0.1 --master-port 29500
"""
import argparse
import sys


def main(argv=None):
    parser = argparse.ArgumentParser(prog="distgrad")
    sub = parser.add_subparsers(dest="command", required=True)
    from workers import worker
    worker.build_parser(sub.add_parser("worker", help="run an RPC worker until the world shuts down"))
    args = parser.parse_args(argv)
    if args.command == "worker":
        return worker.run(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
