"""``torch.distributed.elastic``: the parts of distgrad's torchrun (``distributed/run.py``):
its agent's loop (``agent``), a node's workers (``workers``), how the agents of several
nodes meet (``rendezvous``), and the workers' error reports
(``elastic.multiprocessing.errors``)."""
