"""What the tests of deferred weight gradients in distributed backward passes run on a
worker: a stage of Linear + Tanh layers, its gradients in a context, the worker's count
of deferred gradients, a hook on a weight, and a stage whose backward fails."""
import distgrad
from distgrad import nn
from distgrad.autograd.function import Function
from distgrad.distributed import autograd as dist_autograd
from distgrad.rpc import current_agent

_stage = {}
_hook_calls = []


def make_stage(seed, d, layers):
    """This worker's stage (seeded: the test builds the same one); returns its parameters."""
    distgrad.manual_seed(seed)
    _stage["model"] = nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(d, d),
                                                                          nn.Tanh())])
    _hook_calls.clear()
    return [p.detach().numpy() for p in _stage["model"].parameters()]


def forward(x):
    return _stage["model"](x)


class _FailInBackward(Function):
    @staticmethod
    def forward(ctx, x):
        return x * 1.0

    @staticmethod
    def backward(ctx, g):
        raise ValueError("the stage's backward failed on purpose")


def forward_failing_after_the_layers(x):
    """The stage behind a node whose backward raises: the layers' backward runs first."""
    return _stage["model"](_FailInBackward.apply(x))


def grads(context_id):
    """The stage's parameters' gradients in ``context_id`` (None where it has none)."""
    g = dist_autograd.get_gradients(context_id)
    return [g[p].numpy() if p in g else None for p in _stage["model"].parameters()]


def deferred_count():
    return current_agent().stats["weight_grads_deferred"]


def hook_first_weight():
    """A hook on the first layer's weight: it wants one gradient per pass."""
    _stage["model"][0].weight.register_hook(lambda g: _hook_calls.append(g.shape))


def hook_calls():
    return len(_hook_calls)


def run_nodes_on_handlers():
    """Every run of a pass's nodes on a handler thread, as heavy work goes (only there does
    a part defer: what runs on the I/O thread is short)."""
    from distgrad.distributed.autograd import engine
    engine._ON_ARRIVAL_BUDGET = -1.0


def forward_under_saved_tensor_hooks(x):
    """The stage with its saved tensors packed by hooks (as offloading packs them)."""
    from distgrad.autograd.graph import saved_tensors_hooks
    with saved_tensors_hooks(lambda t: t, lambda t: t):
        return _stage["model"](x)


def run_nodes_where_they_arrive():
    """Every run of a pass's nodes on the I/O thread, however long it took."""
    from distgrad.distributed.autograd import engine
    engine._ON_ARRIVAL_BUDGET = 1e9


def handed_off():
    """(runs of nodes, ends of parts) this worker handed to a handler thread."""
    s = current_agent().stats
    return s["backward_runs_handed_off"], s["backward_ends_handed_off"]
