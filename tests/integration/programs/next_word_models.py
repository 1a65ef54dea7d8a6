"""Next-word language models (an RNN family member or a causal Transformer encoder) on a
small generated corpus, trained with truncated backpropagation through time.

It exercises what a word-level language-model script does with PyTorch: a vocabulary
built while tokenising text files into one ``int64`` tensor; ``narrow``/``view``/``t``/
``contiguous`` to lay the stream out in columns; ``nn.Embedding`` into ``nn.LSTM``/
``nn.GRU``/``nn.RNN`` (picked by name with ``getattr``) with optional weight tying, or
a subclass of ``nn.Transformer`` that uses only its encoder, a registered sinusoidal
position buffer and a causal mask; hidden states detached between chunks; ``NLLLoss``
on ``log_softmax``; ``clip_grad_norm_`` and a hand-written SGD step with
``p.data.add_(p.grad, alpha=-lr)``; learning-rate annealing on a validation plateau;
and the best model pickled whole with ``torch.save(model, f)`` and loaded back with
``torch.load(f, weights_only=False)``. Dropout is off and weights come from a seeded
NumPy generator, so every library computes the same numbers. Plain PyTorch.
"""
import argparse
import json
import math
import os
import random
import tempfile

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


# ------------------------------------------------------------------------- text
def write_reports(folder, seed=3):
    """Weather reports from a tiny grammar, split into train/valid/test files."""
    pick = random.Random(seed).choice
    places = ["the harbour", "the valley", "north ridge", "the old town", "the airport"]
    states = ["is sunny", "is windy", "stays cold", "turns wet", "gets foggy"]
    times = ["at dawn", "by noon", "tonight", "all week"]
    for name, lines in (("train", 110), ("valid", 20), ("test", 20)):
        with open(os.path.join(folder, f"{name}.txt"), "w", encoding="utf8") as handle:
            for _ in range(lines):
                handle.write(f"{pick(places)} {pick(states)} {pick(times)}\n")


class Vocabulary:
    def __init__(self):
        self.index, self.words = {}, []

    def id_of(self, word):
        if word not in self.index:
            self.index[word] = len(self.words)
            self.words.append(word)
        return self.index[word]

    def __len__(self):
        return len(self.words)


def read_split(path, vocabulary):
    ids = []
    with open(path, encoding="utf8") as handle:
        for line in handle:
            ids.extend(vocabulary.id_of(word) for word in line.split() + ["<eos>"])
    return torch.tensor(ids, dtype=torch.int64)


def columns(stream, width):
    """Cut the stream into `width` equal columns (time runs down the rows)."""
    usable = stream.size(0) // width * width
    return stream.narrow(0, 0, usable).view(width, -1).t().contiguous()


def chunk(source, start, length):
    length = min(length, source.size(0) - 1 - start)
    return source[start:start + length], source[start + 1:start + 1 + length].reshape(-1)


# ----------------------------------------------------------------------- models
class RecurrentLM(nn.Module):
    def __init__(self, kind, vocab, width, layers, dropout=0.0, tie=False):
        super().__init__()
        self.kind, self.vocab, self.width, self.layers = kind, vocab, width, layers
        self.embed = nn.Embedding(vocab, width)
        self.drop = nn.Dropout(dropout)
        if kind in ("LSTM", "GRU"):
            self.rnn = getattr(nn, kind)(width, width, layers, dropout=dropout)
        else:
            self.rnn = nn.RNN(width, width, layers, nonlinearity=kind.split("_")[1].lower(),
                              dropout=dropout)
        self.project = nn.Linear(width, vocab)
        if tie:  # one matrix both embeds and scores the words
            self.project.weight = self.embed.weight

    def initial_state(self, batch):
        zeros = next(self.parameters()).new_zeros(self.layers, batch, self.width)
        return (zeros, zeros.clone()) if self.kind == "LSTM" else zeros

    def forward(self, tokens, state):
        output, state = self.rnn(self.drop(self.embed(tokens)), state)
        scores = self.project(self.drop(output)).view(-1, self.vocab)
        return F.log_softmax(scores, dim=1), state


class Positions(nn.Module):
    """Adds sin/cos features of the position (wavelengths growing geometrically)."""

    def __init__(self, width, longest=64):
        super().__init__()
        where = torch.arange(longest, dtype=torch.float).unsqueeze(1)
        rate = torch.exp(torch.arange(0, width, 2).float() * (-math.log(10000.0) / width))
        table = torch.zeros(longest, 1, width)
        table[:, 0, 0::2] = torch.sin(where * rate)
        table[:, 0, 1::2] = torch.cos(where * rate)
        self.register_buffer("table", table)

    def forward(self, x):
        return x + self.table[:x.size(0)]


class CausalTransformerLM(nn.Transformer):
    """Only the encoder stack of nn.Transformer is used (with a causal mask)."""

    def __init__(self, vocab, width, heads, feedforward, layers, dropout=0.0):
        super().__init__(d_model=width, nhead=heads, dim_feedforward=feedforward,
                         num_encoder_layers=layers, dropout=dropout)
        self.width = width
        self.embed = nn.Embedding(vocab, width)
        self.positions = Positions(width)
        self.project = nn.Linear(width, vocab)
        self.mask = None

    def forward(self, tokens):
        if self.mask is None or self.mask.size(0) != tokens.size(0):
            self.mask = nn.Transformer.generate_square_subsequent_mask(tokens.size(0))
        x = self.positions(self.embed(tokens) * math.sqrt(self.width))
        return F.log_softmax(self.project(self.encoder(x, mask=self.mask)), dim=-1)


# ------------------------------------------------------------------------- main
SETTINGS = {"width": 16, "layers": 2, "heads": 2, "lr": 4.0, "clip": 0.3, "epochs": 3,
            "batch": 8, "bptt": 10}  # each can be set with --NAME on the command line


def detached(state):
    return state.detach() if isinstance(state, torch.Tensor) else tuple(s.detach() for s in state)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="LSTM",
                        help="LSTM, GRU, RNN_TANH, RNN_RELU or Transformer")
    for name, default in SETTINGS.items():
        parser.add_argument(f"--{name}", type=type(default), default=default)
    parser.add_argument("--tied", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(5)
    transformer = args.model == "Transformer"

    with tempfile.TemporaryDirectory() as folder:
        write_reports(folder)
        vocabulary = Vocabulary()
        train, valid, test = (read_split(os.path.join(folder, f"{n}.txt"), vocabulary)
                              for n in ("train", "valid", "test"))
        train, valid, test = columns(train, args.batch), columns(valid, 4), columns(test, 4)
        vocab = len(vocabulary)
        if transformer:
            model = CausalTransformerLM(vocab, args.width, args.heads, 2 * args.width, args.layers)
        else:
            model = RecurrentLM(args.model, vocab, args.width, args.layers, tie=args.tied)
        start = np.random.default_rng(12)
        with torch.no_grad():
            for p in model.parameters():
                values = start.uniform(-0.3, 0.3, tuple(p.shape))
                p.copy_(torch.from_numpy(values.astype(np.float32)))
        nll = nn.NLLLoss()

        def run(source, learn, lr=0.0, record=None):
            model.train(learn)
            state = None if transformer else model.initial_state(source.size(1))
            total = 0.0
            with torch.set_grad_enabled(learn):
                for offset in range(0, source.size(0) - 1, args.bptt):
                    tokens, targets = chunk(source, offset, args.bptt)
                    if transformer:
                        log_probs = model(tokens).view(-1, vocab)
                    else:
                        log_probs, state = model(tokens, detached(state))
                    loss = nll(log_probs, targets)
                    total += len(tokens) * loss.item()
                    if learn:
                        model.zero_grad()
                        loss.backward()
                        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
                        for p in model.parameters():
                            if p.grad is not None:  # nn.Transformer's unused decoder has none
                                p.data.add_(p.grad, alpha=-lr)
                        record.append(loss.item())
            return total / (source.size(0) - 1)

        lr, best, steps, valid_losses = args.lr, None, [], []
        checkpoint = os.path.join(folder, "best.pt")
        for epoch in range(args.epochs):
            run(train, True, lr, steps)
            valid_losses.append(run(valid, False))
            print(f"epoch {epoch}: valid loss {valid_losses[-1]:.3f} "
                  f"(perplexity {math.exp(valid_losses[-1]):.1f}), lr {lr}")
            if best is None or valid_losses[-1] < best:
                best = valid_losses[-1]
                with open(checkpoint, "wb") as handle:
                    torch.save(model, handle)
            else:
                lr /= 4.0
        with open(checkpoint, "rb") as handle:  # our own file: safe to unpickle in full
            model = torch.load(handle, weights_only=False)
        if not transformer:
            model.rnn.flatten_parameters()
    test_loss = run(test, False)
    print(f"test loss {test_loss:.3f}")
    still_tied = (not transformer) and model.project.weight is model.embed.weight
    print("RESULT", json.dumps({"train": steps, "valid": valid_losses, "test": test_loss,
                                "tied": still_tied}))


if __name__ == "__main__":
    main()
