"""``distgrad.backends.cudnn``: settable flags with PyTorch's defaults; cuDNN is never available."""
__all__ = ["is_available", "version", "enabled", "benchmark", "deterministic", "allow_tf32"]

enabled = True
benchmark = False
deterministic = False
allow_tf32 = True


def is_available():
    return False


def version():
    return None
