"""What the children of the shared-memory tests run (imported by name in spawned children)."""
import os
import signal

import distgrad


def add_one(tensors, done, lock):
    """Add 1 in place to each tensor, then report back by setting ``done``. The children
    add under ``lock``: an in-place add reads, then writes, so two at once on the same
    shared memory can lose one of the updates (Hogwild's races, not what is tested)."""
    with lock, distgrad.no_grad():
        for t in tensors:
            t.add_(1.0)
    done.set()


def write_through_view(whole, part, done):
    """``part`` is a view of ``whole`` in the parent: writing it must show in ``whole``."""
    part.fill_(7.0)
    done.put([whole.tolist(), part.is_shared(), whole.is_shared()])


def send_new_tensor(queue, release):
    """Make a tensor here and send it; stay alive until the parent has received it (the
    parent fetches the segment's descriptor from this process, as with PyTorch)."""
    t = distgrad.arange(4.0)
    queue.put(t)
    release.wait(60)
    queue.put(t.tolist())  # the parent's writes, seen here


def update_then_die(model, done):
    """Update the shared parameters, then die without any cleanup."""
    with distgrad.no_grad():
        for p in model.parameters():
            p.mul_(0.0)
    done.set()
    os.kill(os.getpid(), signal.SIGKILL)


def hogwild_sgd(rank, model, steps, xs, ys):
    """Each process runs its own optimizer on the shared model (the Hogwild pattern)."""
    distgrad.manual_seed(rank)
    opt = distgrad.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
    for step in range(steps):
        opt.zero_grad()
        loss = distgrad.nn.functional.mse_loss(model(xs), ys)
        loss.backward()
        opt.step()
