"""The files of a run directory, and how they are written.

    runs/<name>-<date>-<time>/
        launch.json      the resolved config, the overrides, the version, the world
        processes.json   the launcher's and its children's pids
        logs/<rank>-<name>.log   everything each process printed
        metrics.jsonl    one record per step (loss, accuracy, samples/s, hook values)
                         and per evaluation
        checkpoints/     see distgrad.launch.checkpoint
        result.json      how training ended (written by the coordinator)
        result-step<N>.json  the result of a finished run that --resume continued
        failure.json     which stage failed, at which step, with its traceback
        loss.png         the loss curve (with matplotlib)

JSON files are written whole or not at all (a temp file renamed into place), so a
reader never sees half of one.
"""
import json
import os

__all__ = ["LAUNCH", "PROCESSES", "METRICS", "RESULT", "FAILURE", "LOGS", "write_json",
           "read_json"]

LAUNCH, PROCESSES, METRICS = "launch.json", "processes.json", "metrics.jsonl"
RESULT, FAILURE, LOGS = "result.json", "failure.json", "logs"


def write_json(path, obj):
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=1)
        fh.write("\n")
    os.replace(tmp, path)


def read_json(path):
    """The object in ``path``, or None when it is missing or unreadable."""
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None
