"""The losses of a launch, computed alike by a pipeline's last stage, the autograd
strategy's coordinator and the one-process run (so their losses agree bit for bit)."""
import distgrad
from distgrad import nn

__all__ = ["LOSSES", "add_micro_batch_loss", "auxiliary_loss"]

#: names accepted by ``model.loss``
LOSSES = {"cross_entropy": nn.CrossEntropyLoss, "mse": nn.MSELoss}


def add_micro_batch_loss(out, loss_fn, y, target, total, classify):
    """The loss of one micro-batch, scaled to its share of the batch (``total`` samples),
    added to ``out["loss"]`` (and its correct predictions to ``out["correct"]``), in the
    order the one-process run adds them."""
    loss = loss_fn(y, distgrad.from_numpy(target)) * (len(target) / total)
    out["loss"] += loss.item()
    if classify:
        out["correct"] += int((y.detach().numpy().argmax(1) == target).sum())
    return loss


def auxiliary_loss(output, weight, count, total):
    """``model.aux_weight``'s loss of one micro-batch: the weighted mean square of the
    last stage's output (an activation penalty), scaled to the micro-batch's share
    (``count`` of ``total`` samples) of the batch."""
    return (output * output).mean() * (weight * count / total)
