"""``torch.distributed.elastic.multiprocessing.errors``: a worker's ``@record`` writes the
exception that ended it into its error file (``TORCHELASTIC_ERROR_FILE``, which the
launcher sets), and the launcher (``distributed/run.py``) puts that traceback into its
failure report instead of "To enable traceback see ...".

::

    from distgrad.distributed.elastic.multiprocessing.errors import record

    @record
    def main():
        ...

    if __name__ == "__main__":
        main()

The file is PyTorch's JSON (``{"message": {"message": "<type>: <text>", "extraInfo":
{"py_callstack": <traceback>, "timestamp": <seconds>}}}``), so either launcher reads
the other's workers' files.
"""
import faulthandler
import functools
import json
import logging
import os
import time
import traceback
import warnings

from ...workers import ChildFailedError

__all__ = ["ChildFailedError", "record", "ErrorHandler", "get_error_handler"]

log = logging.getLogger("distgrad.distributed")

ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"


class ErrorHandler:
    """Writes the exception that ends a process into its error file (PyTorch's class)."""

    def _get_error_file_path(self):
        return os.environ.get(ERROR_FILE_ENV)

    def initialize(self):
        """Before the code whose errors are recorded: tracebacks of faults (SIGSEGV...) too."""
        try:
            faulthandler.enable(all_threads=True)
        except Exception as e:  # noqa: BLE001 - e.g. no usable stderr
            warnings.warn(f"Unable to enable fault handler. {type(e).__name__}: {e}",
                          stacklevel=2)

    def record_exception(self, e):
        """Write ``e`` (being handled) into the error file, if the launcher named one."""
        path = self._get_error_file_path()
        if not path:
            return
        data = {"message": {"message": f"{type(e).__name__}: {e}",
                            "extraInfo": {"py_callstack": traceback.format_exc(),
                                          "timestamp": str(int(time.time()))}}}
        with open(path, "w") as fh:
            json.dump(data, fh)

    def dump_error_file(self, rootcause_error_file, error_code=0):
        """A launcher inside a launcher: hand the first failed worker's error file on as
        this process's own."""
        with open(rootcause_error_file) as fh:
            rootcause = json.load(fh)
        if error_code and isinstance(rootcause.get("message"), dict):
            rootcause["message"].setdefault("errorCode", error_code)
        path = self._get_error_file_path()
        if path:
            with open(path, "w") as fh:
                json.dump(rootcause, fh)
        else:
            log.error("no error file defined for parent, to copy child error file (%s)",
                      rootcause_error_file)


def get_error_handler():
    return ErrorHandler()


def record(fn, error_handler=None):
    """Record the exception that escapes ``fn`` in the error file, then let it go on (a
    ``SystemExit(0)`` returns None, as in PyTorch)."""
    handler = error_handler or get_error_handler()

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        handler.initialize()
        try:
            return fn(*args, **kwargs)
        except SystemExit as e:
            if e.code == 0:
                return None
            raise
        except ChildFailedError as e:
            _, failure = e.get_first_failure()
            if failure.message is not None:
                handler.dump_error_file(failure.error_file, failure.exitcode)
            raise
        except Exception as e:
            handler.record_exception(e)
            raise
    return wrapper
