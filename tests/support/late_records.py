"""A type registered with the codec by the module of the function that receives it: a
worker that has not imported this module yet meets the type's extension code before the
call's target, and imports the target's module to learn it (``rpc/dispatch.py``)."""
from distgrad import codec


class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y


codec.register(Point, 99, lambda p, enc: [p.x, p.y], lambda payload, dec: Point(*payload))


def norm2(p):
    return p.x * p.x + p.y * p.y


def imported_here():
    import sys
    return __name__ in sys.modules
