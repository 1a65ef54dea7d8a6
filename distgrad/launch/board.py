"""A launch's metrics as TensorBoard event files in its run directory, next to
``metrics.jsonl``, when the ``tensorboard`` package is installed (``pip install
'distgrad[tensorboard]'``); without it, nothing is written and nothing is said.

Every number of a record becomes a scalar of the same name at the record's step:
``loss``, ``accuracy``, ``eval_loss``, ``eval_accuracy``, ``samples_per_s``, the hooks'
per-stage values (``<key>.stage<N>``), and ``step_time`` (seconds since the previous
step finished). A resumed run hides what the interrupted one logged after its
checkpoint (``purge_step``), as ``metrics.jsonl`` drops those records.

    tensorboard --logdir runs
"""
try:
    from distgrad.utils.tensorboard import SummaryWriter
except ImportError:  # the optional extra is not installed
    SummaryWriter = None

__all__ = ["open_board", "MetricsBoard"]

_SKIP = ("step", "elapsed", "time", "total_steps")


class MetricsBoard:
    def __init__(self, writer):
        self.writer = writer
        self.last_elapsed = None

    def write(self, record):
        if "event" in record or "step" not in record:
            return
        step = int(record["step"])
        for key, value in record.items():
            if key not in _SKIP and isinstance(value, (int, float)) \
                    and not isinstance(value, bool):
                self.writer.add_scalar(key, value, step)
        elapsed = record.get("elapsed")
        if isinstance(elapsed, (int, float)):
            previous = 0.0 if self.last_elapsed is None else self.last_elapsed
            self.writer.add_scalar("step_time", elapsed - previous, step)
            self.last_elapsed = elapsed

    def close(self):
        self.writer.close()


def open_board(run_dir, start_step=0):
    """A board writing into ``run_dir`` (None without tensorboard); ``start_step``: the
    step a resumed run continues from."""
    if SummaryWriter is None:
        return None
    # flushed every few seconds: someone may be watching the run live
    return MetricsBoard(SummaryWriter(run_dir, purge_step=start_step or None, flush_secs=5))
