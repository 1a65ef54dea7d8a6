"""Where each worker of a launch sits: its pipeline stage and its data-parallel replica.

A launch's workers form a grid of ``stages x replicas`` (``world.workers`` in all):
``world.strategy = "pipeline"`` splits the model into ``world.workers /
world.replicas`` stages, ``"ddp"`` keeps it whole (one stage) on every worker.
Workers are numbered replica by replica, so worker ``w`` is stage ``w % stages`` of
replica ``w // stages``; its RPC rank is ``w + 1`` (the coordinator is rank 0) and
its rank in the workers' process group is ``w``.

>>> g = Grid(workers=4, replicas=2)
>>> g.stages, g.place(3), g.index(replica=1, stage=0), g.describe(3)
(2, (1, 1), 2, 'stage 1, replica 1')
>>> Grid(2, 1).describe(1), Grid(2, 2).describe(1)
('stage 1', 'replica 1')
"""

__all__ = ["Grid"]


class Grid:
    """``workers`` processes holding ``replicas`` copies of a pipeline of ``stages`` stages."""

    def __init__(self, workers, replicas=1):
        if workers % replicas:
            raise ValueError(f"{workers} workers cannot hold {replicas} equal replicas")
        self.workers, self.replicas = workers, replicas
        self.stages = workers // replicas

    @classmethod
    def of(cls, config):
        """The grid of a checked config (see :mod:`distgrad.launch.config`)."""
        world = config["world"]
        return cls(world["workers"], world["replicas"])

    def place(self, worker):
        """``(replica, stage)`` of worker index ``worker``."""
        return divmod(worker, self.stages)

    def index(self, replica, stage):
        return replica * self.stages + stage

    def stage_peers(self, stage):
        """The worker indices holding ``stage``, one per replica (its averaging group)."""
        return [self.index(r, stage) for r in range(self.replicas)]

    def describe(self, worker):
        """``stage 1``, ``replica 1`` or ``stage 1, replica 0``: for messages and traces."""
        replica, stage = self.place(worker)
        if self.replicas == 1:
            return f"stage {stage}"
        if self.stages == 1:
            return f"replica {replica}"
        return f"stage {stage}, replica {replica}"
