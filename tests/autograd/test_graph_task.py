"""GraphTask as the distributed engine drives it: fed from several entry points, one
gradient at a time, in whatever order other processes deliver them."""
import numpy as np

import distgrad
from distgrad.autograd.engine import GraphTask, execute


def test_a_leafs_gradients_are_summed_in_forward_order_whatever_the_arrival_order():
    # three uses of w whose gradients, summed in another order, round differently in float32
    w = distgrad.ones(1, dtype=distgrad.float32, requires_grad=True)
    scales = [np.float32(1e8), np.float32(1.0), np.float32(-1e8)]
    ys = [w * float(s) for s in scales]  # created (and sequence-numbered) in this order
    forward_order = (scales[0] + scales[1]) + scales[2]
    arrival_order = (scales[2] + scales[0]) + scales[1]
    assert forward_order != arrival_order  # the point: the order shows in the result
    got = {}
    task = GraphTask(False, False, accumulate=lambda variable, g, owned: got.setdefault("g", g))
    task.compute_dependencies([y.grad_fn for y in ys])
    for i in (2, 0, 1):  # one at a time, as gradients arrive over the wire
        task.add_gradient(ys[i].grad_fn, 0, np.ones(1, dtype=np.float32))
        task.mark_ready(ys[i].grad_fn)
        execute(task)
    assert got["g"].dtype == np.float32
    assert got["g"][0] == forward_order
