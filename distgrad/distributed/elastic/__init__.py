"""``torch.distributed.elastic``: what distgrad's one-node launcher (``distributed/run.py``)
shares with it, its workers' error reports (``elastic.multiprocessing.errors``)."""
