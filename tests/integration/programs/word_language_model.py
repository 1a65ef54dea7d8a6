"""A word-level language model (LSTM or Transformer encoder) on a tiny generated corpus.

Port of pytorch/examples `word_language_model` (`data.py`, `model.py` and `main.py`
in one file), shrunk: the corpus is a few hundred sentences of a toy grammar
written to a temporary directory, the model is small, dropout is off and the
weights start from a seeded NumPy generator so both runs see the same numbers.
The best model is saved whole with `torch.save(model, f)` and loaded back, as the
original does. Plain PyTorch.
"""
import argparse
import json
import math
import os
import random
import tempfile

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


# ----------------------------------------------------------------------------- data
class Dictionary(object):
    def __init__(self):
        self.word2idx = {}
        self.idx2word = []

    def add_word(self, word):
        if word not in self.word2idx:
            self.idx2word.append(word)
            self.word2idx[word] = len(self.idx2word) - 1
        return self.word2idx[word]

    def __len__(self):
        return len(self.idx2word)


class Corpus(object):
    def __init__(self, path):
        self.dictionary = Dictionary()
        self.train = self.tokenize(os.path.join(path, "train.txt"))
        self.valid = self.tokenize(os.path.join(path, "valid.txt"))
        self.test = self.tokenize(os.path.join(path, "test.txt"))

    def tokenize(self, path):
        """Tokenizes a text file."""
        assert os.path.exists(path)
        with open(path, "r", encoding="utf8") as f:
            for line in f:
                words = line.split() + ["<eos>"]
                for word in words:
                    self.dictionary.add_word(word)
        with open(path, "r", encoding="utf8") as f:
            idss = []
            for line in f:
                words = line.split() + ["<eos>"]
                ids = []
                for word in words:
                    ids.append(self.dictionary.word2idx[word])
                idss.append(torch.tensor(ids).type(torch.int64))
            ids = torch.cat(idss)
        return ids


def write_corpus(path, seed=0):
    """Sentences of a small grammar: enough structure for a model to learn something."""
    rnd = random.Random(seed)
    subjects = ["the cat", "a dog", "the bird", "my friend", "the teacher"]
    verbs = ["sees", "likes", "finds", "follows"]
    objects = ["the ball", "a tree", "the house", "some food", "the river"]
    tails = ["", "today", "again", "in the morning"]
    for name, n in (("train.txt", 120), ("valid.txt", 24), ("test.txt", 24)):
        with open(os.path.join(path, name), "w", encoding="utf8") as f:
            for _ in range(n):
                f.write(" ".join(w for w in (rnd.choice(subjects), rnd.choice(verbs),
                                             rnd.choice(objects), rnd.choice(tails)) if w))
                f.write("\n")


# ---------------------------------------------------------------------------- model
class RNNModel(nn.Module):
    """Container module with an encoder, a recurrent module, and a decoder."""

    def __init__(self, rnn_type, ntoken, ninp, nhid, nlayers, dropout=0.5, tie_weights=False):
        super(RNNModel, self).__init__()
        self.ntoken = ntoken
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        if rnn_type in ["LSTM", "GRU"]:
            self.rnn = getattr(nn, rnn_type)(ninp, nhid, nlayers, dropout=dropout)
        else:
            nonlinearity = {"RNN_TANH": "tanh", "RNN_RELU": "relu"}[rnn_type]
            self.rnn = nn.RNN(ninp, nhid, nlayers, nonlinearity=nonlinearity, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        if tie_weights:
            if nhid != ninp:
                raise ValueError("When using the tied flag, nhid must be equal to emsize")
            self.decoder.weight = self.encoder.weight
        self.rnn_type = rnn_type
        self.nhid = nhid
        self.nlayers = nlayers

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        output = self.drop(output)
        decoded = self.decoder(output)
        decoded = decoded.view(-1, self.ntoken)
        return F.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        if self.rnn_type == "LSTM":
            return (weight.new_zeros(self.nlayers, bsz, self.nhid),
                    weight.new_zeros(self.nlayers, bsz, self.nhid))
        return weight.new_zeros(self.nlayers, bsz, self.nhid)


class PositionalEncoding(nn.Module):
    """Sine and cosine positions added to the token embeddings."""

    def __init__(self, d_model, dropout=0.1, max_len=5000):
        super(PositionalEncoding, self).__init__()
        self.dropout = nn.Dropout(p=dropout)
        pe = torch.zeros(max_len, d_model)
        position = torch.arange(0, max_len, dtype=torch.float).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model))
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        pe = pe.unsqueeze(0).transpose(0, 1)
        self.register_buffer("pe", pe)

    def forward(self, x):
        x = x + self.pe[:x.size(0), :]
        return self.dropout(x)


class TransformerModel(nn.Transformer):
    """Container module with an encoder, a transformer encoder and a decoder."""

    def __init__(self, ntoken, ninp, nhead, nhid, nlayers, dropout=0.5):
        super(TransformerModel, self).__init__(d_model=ninp, nhead=nhead, dim_feedforward=nhid,
                                               num_encoder_layers=nlayers, dropout=dropout)
        self.model_type = "Transformer"
        self.src_mask = None
        self.pos_encoder = PositionalEncoding(ninp, dropout, max_len=64)
        self.input_emb = nn.Embedding(ntoken, ninp)
        self.ninp = ninp
        self.decoder = nn.Linear(ninp, ntoken)

    def _generate_square_subsequent_mask(self, sz):
        return torch.log(torch.tril(torch.ones(sz, sz)))

    def forward(self, src, has_mask=True):
        if has_mask:
            if self.src_mask is None or self.src_mask.size(0) != len(src):
                self.src_mask = self._generate_square_subsequent_mask(len(src))
        else:
            self.src_mask = None
        src = self.input_emb(src) * math.sqrt(self.ninp)
        src = self.pos_encoder(src)
        output = self.encoder(src, mask=self.src_mask)
        output = self.decoder(output)
        return F.log_softmax(output, dim=-1)


# ----------------------------------------------------------------------------- main
parser = argparse.ArgumentParser(description="PyTorch RNN/LSTM/Transformer Language Model")
parser.add_argument("--model", type=str, default="LSTM",
                    help="type of network (RNN_TANH, RNN_RELU, LSTM, GRU, Transformer)")
parser.add_argument("--emsize", type=int, default=16, help="size of word embeddings")
parser.add_argument("--nhid", type=int, default=16, help="number of hidden units per layer")
parser.add_argument("--nlayers", type=int, default=2, help="number of layers")
parser.add_argument("--lr", type=float, default=5, help="initial learning rate")
parser.add_argument("--clip", type=float, default=0.25, help="gradient clipping")
parser.add_argument("--epochs", type=int, default=3, help="upper epoch limit")
parser.add_argument("--batch_size", type=int, default=8, metavar="N", help="batch size")
parser.add_argument("--bptt", type=int, default=12, help="sequence length")
parser.add_argument("--dropout", type=float, default=0.0, help="dropout applied to layers")
parser.add_argument("--tied", action="store_true",
                    help="tie the word embedding and softmax weights")
parser.add_argument("--seed", type=int, default=1111, help="random seed")
parser.add_argument("--log-interval", type=int, default=5, metavar="N", help="report interval")
parser.add_argument("--nhead", type=int, default=2, help="heads of the transformer model")


def batchify(data, bsz):
    # Work out how cleanly we can divide the dataset into bsz parts, trim the rest off
    nbatch = data.size(0) // bsz
    data = data.narrow(0, 0, nbatch * bsz)
    # Evenly divide the data across the bsz batches.
    return data.view(bsz, -1).t().contiguous()


def repackage_hidden(h):
    """Wraps hidden states in new Tensors, to detach them from their history."""
    if isinstance(h, torch.Tensor):
        return h.detach()
    return tuple(repackage_hidden(v) for v in h)


def get_batch(source, i, bptt):
    seq_len = min(bptt, len(source) - 1 - i)
    data = source[i:i + seq_len]
    target = source[i + 1:i + 1 + seq_len].view(-1)
    return data, target


def main():
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    device = torch.device("cpu")

    with tempfile.TemporaryDirectory() as tmp:
        write_corpus(tmp)
        corpus = Corpus(tmp)
        eval_batch_size = 4
        train_data = batchify(corpus.train, args.batch_size).to(device)
        val_data = batchify(corpus.valid, eval_batch_size).to(device)
        test_data = batchify(corpus.test, eval_batch_size).to(device)

        ntokens = len(corpus.dictionary)
        if args.model == "Transformer":
            model = TransformerModel(ntokens, args.emsize, args.nhead, args.nhid, args.nlayers,
                                     args.dropout).to(device)
        else:
            model = RNNModel(args.model, ntokens, args.emsize, args.nhid, args.nlayers,
                             args.dropout, args.tied).to(device)
        rng = np.random.default_rng(args.seed)  # the same start in every library
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(torch.from_numpy(rng.uniform(-0.3, 0.3, tuple(p.shape)).astype(np.float32)))
        criterion = nn.NLLLoss()

        def evaluate(data_source):
            model.eval()
            total_loss = 0.
            if args.model != "Transformer":
                hidden = model.init_hidden(eval_batch_size)
            with torch.no_grad():
                for i in range(0, data_source.size(0) - 1, args.bptt):
                    data, targets = get_batch(data_source, i, args.bptt)
                    if args.model == "Transformer":
                        output = model(data)
                        output = output.view(-1, ntokens)
                    else:
                        output, hidden = model(data, hidden)
                        hidden = repackage_hidden(hidden)
                    total_loss += len(data) * criterion(output, targets).item()
            return total_loss / (len(data_source) - 1)

        def train(epoch, lr, history):
            model.train()
            total_loss = 0.
            if args.model != "Transformer":
                hidden = model.init_hidden(args.batch_size)
            for batch, i in enumerate(range(0, train_data.size(0) - 1, args.bptt)):
                data, targets = get_batch(train_data, i, args.bptt)
                # Starting each batch, we detach the hidden state from how it was previously
                # produced; else the model would backpropagate to the start of the dataset.
                model.zero_grad()
                if args.model == "Transformer":
                    output = model(data)
                    output = output.view(-1, ntokens)
                else:
                    hidden = repackage_hidden(hidden)
                    output, hidden = model(data, hidden)
                loss = criterion(output, targets)
                loss.backward()

                # `clip_grad_norm` helps prevent the exploding gradient problem in RNNs / LSTMs.
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
                for p in model.parameters():
                    p.data.add_(p.grad, alpha=-lr)

                total_loss += loss.item()
                history.append(loss.item())
                if batch % args.log_interval == 0 and batch > 0:
                    cur_loss = total_loss / args.log_interval
                    print("| epoch {:3d} | {:5d}/{:5d} batches | lr {:02.2f} | loss {:5.2f} | "
                          "ppl {:8.2f}".format(epoch, batch, len(train_data) // args.bptt, lr,
                                               cur_loss, math.exp(cur_loss)))
                    total_loss = 0

        lr = args.lr
        best_val_loss = None
        history, val_losses = [], []
        save = os.path.join(tmp, "model.pt")
        for epoch in range(1, args.epochs + 1):
            train(epoch, lr, history)
            val_loss = evaluate(val_data)
            val_losses.append(val_loss)
            print("-" * 89)
            print("| end of epoch {:3d} | valid loss {:5.2f} | valid ppl {:8.2f}".format(
                epoch, val_loss, math.exp(val_loss)))
            print("-" * 89)
            # Save the model if the validation loss is the best we've seen so far.
            if not best_val_loss or val_loss < best_val_loss:
                with open(save, "wb") as f:
                    torch.save(model, f)
                best_val_loss = val_loss
            else:
                # Anneal the learning rate if no improvement has been seen.
                lr /= 4.0

        # Load the best saved model (a whole model: the file is trusted, it is ours).
        with open(save, "rb") as f:
            model = torch.load(f, weights_only=False)
            if args.model in ["RNN_TANH", "RNN_RELU", "LSTM", "GRU"]:
                model.rnn.flatten_parameters()

    test_loss = evaluate(test_data)
    print("=" * 89)
    print("| End of training | test loss {:5.2f} | test ppl {:8.2f}".format(
        test_loss, math.exp(test_loss)))
    print("=" * 89)
    tied = args.tied and model.decoder.weight is model.encoder.weight  # still, after loading
    print("RESULT", json.dumps({"train": history, "valid": val_losses, "test": test_loss,
                                "tied": tied}))


if __name__ == "__main__":
    main()
