"""``distgrad launch``: multi-worker training started from a TOML config: pipeline
stages, data-parallel replicas (DDP), or pipelines replicated over the data.

    distgrad launch configs/quickstart.toml [key=value ...] [--resume] [--trace FILE]

Modules, from the outside in:

- :mod:`.command`     the ``distgrad launch`` subcommand (options, exit codes)
- :mod:`.config`      TOML configs, overrides and their checking
- :mod:`.resolve`     what a config names: model, data, optimizer, hooks, stage split
- :mod:`.environment` where the processes come from: local, Slurm, torchrun
- :mod:`.supervisor`  the process tree: start, watch, log, stop, restart
- :mod:`.console`     merged logs, the progress bar, the loss curve
- :mod:`.coordinator` rank 0: the training loop, evaluation, checkpoints, the trace
- :mod:`.stage`       a worker's pipeline stages (called by the coordinator over RPC),
                      run by ``distgrad.distributed.pipelining``'s schedules
                      (:mod:`.stage_parts`: their channel, stage class and trace spans)
- :mod:`.grid`        which stage of which replica each worker holds
- :mod:`.replicas`    the replicas' process group and gradient averaging (DDP)
- :mod:`.schedule`, :mod:`.data`, :mod:`.models`, :mod:`.hooks`, :mod:`.checkpoint`,
  :mod:`.trace`       the parts they share
"""
from .config import ConfigError, load_config

__all__ = ["ConfigError", "load_config"]
