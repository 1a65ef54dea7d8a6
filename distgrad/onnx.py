"""``distgrad.onnx``: importable, so programs that mention it load; exporting is not supported.

distgrad records no graph that an ONNX exporter could trace, so ``export``
raises ``RuntimeError`` instead of writing a file that would be wrong.
"""
__all__ = ["export", "is_in_onnx_export"]


def export(model, args=(), f=None, *positional, **options):
    raise RuntimeError("distgrad.onnx.export is not supported: distgrad has no ONNX exporter "
                       "(export the model with PyTorch instead)")


def is_in_onnx_export():
    return False
