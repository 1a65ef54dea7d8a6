"""Writing custom Datasets, DataLoaders and Transforms: the PyTorch tutorial, as a script.

Port of pytorch/tutorials `beginner_source/data_loading_tutorial.py`: a face-landmarks
`Dataset` that reads a CSV of annotations and loads each image on demand, the
`Rescale`, `RandomCrop` and `ToTensor` transforms, and a shuffling
`DataLoader(num_workers=...)`, all at module level without an
`if __name__ == "__main__":` guard, as the tutorial is written (on Linux PyTorch forks
its workers, so this runs). Changes: the faces data set (a download) is replaced by
small random images written as `.npy` files with a CSV of landmarks, made by the script
itself; pandas, scikit-image and torchvision's `Compose` by the csv module, a
nearest-neighbour resize and a three-line `Compose`; images of ~50 pixels rescaled to
32 and cropped to 24, two workers; no plots; the whole epoch is read. Crops and the
shuffle are random, so the run reports what does not depend on them. Plain PyTorch.
"""
from __future__ import print_function, division
import csv
import json
import os
import torch
import numpy as np
from torch.utils.data import Dataset, DataLoader

# Ignore warnings
import warnings
warnings.filterwarnings("ignore")

root = 'data/faces/'  # in the working directory, as the tutorial's download
os.makedirs(root, exist_ok=True)
rng = np.random.default_rng(0)
with open(os.path.join(root, "face_landmarks.csv"), "w", newline="") as fh:
    writer = csv.writer(fh)
    writer.writerow(["image_name"] + [f"part_{i}_{a}" for i in range(68) for a in "xy"])
    for n in range(22):
        h, w = rng.integers(40, 60, 2)
        np.save(os.path.join(root, f"face{n}.npy"), rng.integers(0, 256, (h, w, 3), np.uint8))
        points = np.stack([rng.integers(0, w, 68), rng.integers(0, h, 68)], axis=1)
        writer.writerow([f"face{n}.npy"] + points.reshape(-1).tolist())


def read_csv(path):
    with open(path) as fh:
        return list(csv.reader(fh))[1:]


def resize(image, shape):
    rows = (np.arange(shape[0]) * image.shape[0] / shape[0]).astype(int)
    cols = (np.arange(shape[1]) * image.shape[1] / shape[1]).astype(int)
    return image[rows][:, cols].astype(np.float64) / 255


class Compose:
    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, sample):
        for t in self.transforms:
            sample = t(sample)
        return sample


landmarks_frame = read_csv(os.path.join(root, "face_landmarks.csv"))

n = 15
img_name = landmarks_frame[n][0]
landmarks = np.array(landmarks_frame[n][1:])
landmarks = landmarks.astype('float').reshape(-1, 2)

print('Image name: {}'.format(img_name))
print('Landmarks shape: {}'.format(landmarks.shape))
print('First 4 Landmarks: {}'.format(landmarks[:4]))


class FaceLandmarksDataset(Dataset):
    """Face Landmarks dataset."""

    def __init__(self, csv_file, root_dir, transform=None):
        """
        Args:
            csv_file (string): Path to the csv file with annotations.
            root_dir (string): Directory with all the images.
            transform (callable, optional): Optional transform to be applied
                on a sample.
        """
        self.landmarks_frame = read_csv(csv_file)
        self.root_dir = root_dir
        self.transform = transform

    def __len__(self):
        return len(self.landmarks_frame)

    def __getitem__(self, idx):
        if torch.is_tensor(idx):
            idx = idx.tolist()

        img_name = os.path.join(self.root_dir,
                                self.landmarks_frame[idx][0])
        image = np.load(img_name)
        landmarks = self.landmarks_frame[idx][1:]
        landmarks = np.array([landmarks])
        landmarks = landmarks.astype('float').reshape(-1, 2)
        sample = {'image': image, 'landmarks': landmarks}

        if self.transform:
            sample = self.transform(sample)

        return sample


face_dataset = FaceLandmarksDataset(csv_file=os.path.join(root, 'face_landmarks.csv'),
                                    root_dir=root)

raw_shapes = []
for i in range(len(face_dataset)):
    sample = face_dataset[i]

    print(i, sample['image'].shape, sample['landmarks'].shape)
    raw_shapes.append(list(sample['image'].shape))

    if i == 3:
        break


class Rescale(object):
    """Rescale the image in a sample to a given size.

    Args:
        output_size (tuple or int): Desired output size. If tuple, output is
            matched to output_size. If int, smaller of image edges is matched
            to output_size keeping aspect ratio the same.
    """

    def __init__(self, output_size):
        assert isinstance(output_size, (int, tuple))
        self.output_size = output_size

    def __call__(self, sample):
        image, landmarks = sample['image'], sample['landmarks']

        h, w = image.shape[:2]
        if isinstance(self.output_size, int):
            if h > w:
                new_h, new_w = self.output_size * h / w, self.output_size
            else:
                new_h, new_w = self.output_size, self.output_size * w / h
        else:
            new_h, new_w = self.output_size

        new_h, new_w = int(new_h), int(new_w)

        img = resize(image, (new_h, new_w))

        # h and w are swapped for landmarks because for images,
        # x and y axes are axis 1 and 0 respectively
        landmarks = landmarks * [new_w / w, new_h / h]

        return {'image': img, 'landmarks': landmarks}


class RandomCrop(object):
    """Crop randomly the image in a sample.

    Args:
        output_size (tuple or int): Desired output size. If int, square crop
            is made.
    """

    def __init__(self, output_size):
        assert isinstance(output_size, (int, tuple))
        if isinstance(output_size, int):
            self.output_size = (output_size, output_size)
        else:
            assert len(output_size) == 2
            self.output_size = output_size

    def __call__(self, sample):
        image, landmarks = sample['image'], sample['landmarks']

        h, w = image.shape[:2]
        new_h, new_w = self.output_size

        top = np.random.randint(0, h - new_h)
        left = np.random.randint(0, w - new_w)

        image = image[top: top + new_h,
                      left: left + new_w]

        landmarks = landmarks - [left, top]

        return {'image': image, 'landmarks': landmarks}


class ToTensor(object):
    """Convert ndarrays in sample to Tensors."""

    def __call__(self, sample):
        image, landmarks = sample['image'], sample['landmarks']

        # swap color axis because
        # numpy image: H x W x C
        # torch image: C X H X W
        image = image.transpose((2, 0, 1))
        return {'image': torch.from_numpy(image),
                'landmarks': torch.from_numpy(landmarks)}


scale = Rescale(32)
crop = RandomCrop(24)
composed = Compose([Rescale(32),
                    RandomCrop(28)])

# Apply each of the above transforms on sample.
sample = face_dataset[15]
transformed_shapes = []
for i, tsfrm in enumerate([scale, crop, composed]):
    transformed_sample = tsfrm(sample)
    transformed_shapes.append(list(transformed_sample['image'].shape))

transformed_dataset = FaceLandmarksDataset(csv_file=os.path.join(root, 'face_landmarks.csv'),
                                           root_dir=root,
                                           transform=Compose([
                                               Rescale(32),
                                               RandomCrop(24),
                                               ToTensor()
                                           ]))

for i in range(len(transformed_dataset)):
    sample = transformed_dataset[i]

    print(i, sample['image'].size(), sample['landmarks'].size())

    if i == 3:
        break

dataloader = DataLoader(transformed_dataset, batch_size=4,
                        shuffle=True, num_workers=2)

batches = []
for i_batch, sample_batched in enumerate(dataloader):
    print(i_batch, sample_batched['image'].size(),
          sample_batched['landmarks'].size())
    batches.append([list(sample_batched['image'].size()),
                    list(sample_batched['landmarks'].size()),
                    sample_batched['image'].dtype == torch.float64])

print("RESULT " + json.dumps({"raw": raw_shapes, "transformed": transformed_shapes,
                              "batches": batches, "landmarks": landmarks.tolist()}))
