def __getattr__(name):
    # ``torch.utils.data`` and ``torch.utils.checkpoint`` are reachable as attributes after
    # ``import torch``; they load on first use so that ``import distgrad`` stays cheap.
    if name in ("data", "checkpoint"):
        import importlib
        module = importlib.import_module(f".{name}", __name__)
        globals()[name] = module
        return module
    raise AttributeError(f"module 'distgrad.utils' has no attribute {name!r}")
