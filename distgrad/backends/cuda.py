"""``distgrad.backends.cuda``: ``matmul.allow_tf32`` and friends, settable, with PyTorch's defaults."""
__all__ = ["is_built", "matmul"]


class _MatmulFlags:
    """``backends.cuda.matmul``: precision switches a program may set; they have no effect."""

    def __init__(self):
        self.allow_tf32 = False
        self.allow_fp16_reduced_precision_reduction = True
        self.allow_bf16_reduced_precision_reduction = True


matmul = _MatmulFlags()


def is_built():
    return False
