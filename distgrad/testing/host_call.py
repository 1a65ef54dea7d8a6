"""``python -m distgrad.testing.host_call module:qualname RESULT_PATH ARGS`` (ARGS: a JSON
list): what :meth:`distgrad.testing.hosts.Host.spawn` runs on a simulated host.
The result (or the error, with its traceback) is written to RESULT_PATH as JSON, atomically,
so the caller can tell a function that returned from a process that died."""
import importlib
import json
import os
import sys
import traceback

from distgrad.references import lookup, split_reference


def _resolve(ref):
    return lookup(ref, importlib.import_module(split_reference(ref)[0]))


def main(argv=None):
    ref, result_path, args = (sys.argv[1:] if argv is None else argv)[:3]
    args = json.loads(args)
    try:
        outcome = {"value": _resolve(ref)(*args)}
        text = json.dumps(outcome)
    except BaseException as e:  # noqa: BLE001 - reported to the caller, with the traceback
        text = json.dumps({"error": f"{type(e).__name__}: {e}",
                           "traceback": traceback.format_exc()})
    with open(result_path + ".tmp", "w") as fh:
        fh.write(text)
    os.replace(result_path + ".tmp", result_path)


if __name__ == "__main__":
    main()
