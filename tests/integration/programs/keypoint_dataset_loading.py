"""A map-style ``Dataset`` of images with annotated keypoints, composable transforms and a
multi-process ``DataLoader``, written as a top-level script the way the data-loading
tutorial's readers write one.

The data: a folder of microscope "slides" (random RGB arrays of varying size saved as
``.npy``) and a CSV that lists, per slide, the centres of 12 marked cells. The
``Dataset`` reads the CSV once and loads each slide only when it is indexed (accepting a
tensor index, as samplers may hand one); samples are dicts. The transforms are plain
callables (``Resize`` to a fixed shape, ``RandomCrop``, ``ToTensor`` moving channels
first) chained by a small ``Chain``; each keeps the keypoints in step with the pixels.
The loader batches dicts of tensors with ``shuffle=True`` and ``num_workers=2``, from
module level without a ``__main__`` guard (workers are forked on Linux). Crops and the
shuffle are random, so only what does not depend on them is reported. Plain PyTorch.
"""
import csv
import json
import os

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

CELLS = 12
folder = os.path.join("data", "slides")  # in the working directory
os.makedirs(folder, exist_ok=True)
maker = np.random.default_rng(17)
annotation_file = os.path.join(folder, "cells.csv")
with open(annotation_file, "w", newline="") as handle:
    table = csv.writer(handle)
    table.writerow(["file"] + [f"cell{i}_{axis}" for i in range(CELLS) for axis in "xy"])
    for number in range(18):
        height, width = maker.integers(36, 56, 2)
        name = f"slide_{number:02d}.npy"
        np.save(os.path.join(folder, name), maker.integers(0, 256, (height, width, 3), np.uint8))
        centres = np.column_stack([maker.uniform(0, width, CELLS), maker.uniform(0, height, CELLS)])
        table.writerow([name] + [f"{v:.2f}" for v in centres.ravel()])


class CellSlides(Dataset):
    """One sample per CSV row: {"image": H x W x 3 uint8 array, "cells": CELLS x 2 (x, y)}."""

    def __init__(self, annotations, root, transform=None):
        with open(annotations, newline="") as handle:
            self.rows = list(csv.reader(handle))[1:]
        self.root, self.transform = root, transform

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, index):
        if torch.is_tensor(index):
            index = index.tolist()
        name, *coordinates = self.rows[index]
        sample = {"image": np.load(os.path.join(self.root, name)),
                  "cells": np.asarray(coordinates, dtype=np.float64).reshape(-1, 2)}
        return self.transform(sample) if self.transform else sample


class Chain:
    def __init__(self, *steps):
        self.steps = steps

    def __call__(self, sample):
        for step in self.steps:
            sample = step(sample)
        return sample


class Resize:
    """Nearest-neighbour resampling to (rows, cols); pixel values scaled to [0, 1]."""

    def __init__(self, rows, cols):
        self.rows, self.cols = rows, cols

    def __call__(self, sample):
        image = sample["image"]
        height, width = image.shape[:2]
        pick_rows = np.arange(self.rows) * height // self.rows
        pick_cols = np.arange(self.cols) * width // self.cols
        resized = image[pick_rows][:, pick_cols] / 255.0
        # keypoints are (x, y): x follows the columns, y the rows
        scale = [self.cols / width, self.rows / height]
        return {"image": resized, "cells": sample["cells"] * scale}


class RandomCrop:
    def __init__(self, side):
        self.side = side

    def __call__(self, sample):
        image = sample["image"]
        top = np.random.randint(0, image.shape[0] - self.side + 1)
        left = np.random.randint(0, image.shape[1] - self.side + 1)
        window = image[top:top + self.side, left:left + self.side]
        return {"image": window, "cells": sample["cells"] - [left, top]}


class ToTensor:
    def __call__(self, sample):
        # arrays are H x W x C; torch images are C x H x W
        return {"image": torch.from_numpy(sample["image"].transpose(2, 0, 1).copy()),
                "cells": torch.from_numpy(sample["cells"])}


raw = CellSlides(annotation_file, folder)
first_shapes = [[list(raw[i]["image"].shape), list(raw[i]["cells"].shape)] for i in range(3)]
probe = raw[torch.tensor(7)]
print("slide 7:", probe["image"].shape, "first cells", probe["cells"][:2].tolist())

one_by_one = [list(step(probe)["image"].shape)
              for step in (Resize(30, 40), RandomCrop(20), Chain(Resize(30, 40), RandomCrop(24)))]

ready = CellSlides(annotation_file, folder, transform=Chain(Resize(30, 30), RandomCrop(24),
                                                            ToTensor()))
single = ready[0]
loader = DataLoader(ready, batch_size=5, shuffle=True, num_workers=2)
batches, seen = [], 0
for number, batch in enumerate(loader):
    print(number, tuple(batch["image"].size()), tuple(batch["cells"].size()))
    batches.append([list(batch["image"].size()), list(batch["cells"].size()),
                    batch["image"].dtype == torch.float64, batch["cells"].dtype == torch.float64])
    seen += batch["image"].size(0)

print("RESULT " + json.dumps({"raw": first_shapes, "cells_7": probe["cells"].tolist(),
                              "transformed": one_by_one, "single": list(single["image"].shape),
                              "batches": batches, "seen": seen}))
