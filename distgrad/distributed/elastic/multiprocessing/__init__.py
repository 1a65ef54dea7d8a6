"""``torch.distributed.elastic.multiprocessing``: its ``errors`` (the workers are started by
``distributed/run.py``)."""
