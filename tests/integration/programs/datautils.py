"""The data set of `ddp_torchrun.py` (pytorch/examples `distributed/ddp-tutorial-series/
datautils.py`): `MyTrainDataset`, its samples drawn from a seeded NumPy generator instead
of `torch.rand` (so both libraries see the same numbers), with class labels for the
four-way classifier the port trains."""
import numpy as np
import torch
from torch.utils.data import Dataset


class MyTrainDataset(Dataset):
    def __init__(self, size):
        self.size = size
        rng = np.random.default_rng(0)
        features = rng.random((size, 20), dtype=np.float32)
        labels = (features[:, :4].argmax(axis=1)).astype(np.int64)
        self.data = [(torch.from_numpy(features[i]), torch.tensor(labels[i]))
                     for i in range(size)]

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        return self.data[index]
