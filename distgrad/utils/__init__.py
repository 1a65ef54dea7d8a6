def __getattr__(name):
    # ``torch.utils.data`` is reachable as an attribute after ``import torch``; the
    # data package loads on first use so that ``import distgrad`` stays cheap.
    if name == "data":
        import importlib
        module = importlib.import_module(".data", __name__)
        globals()[name] = module
        return module
    raise AttributeError(f"module 'distgrad.utils' has no attribute {name!r}")
