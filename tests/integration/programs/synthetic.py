"""Seeded, NumPy-only data and a toy control task shared by the example programs.

Nothing here imports torch, so every library the programs run on sees the same
numbers: glyph pictures stand in for a downloaded image set, and ``DriftTrack``
stands in for a gym environment in the reinforcement-learning programs.
"""
import numpy as np

GLYPHS = ("block", "frame", "plus", "cross")


def glyph_stencils(size):
    """One (size, size) 0/1 stencil per entry of GLYPHS."""
    out = np.zeros((len(GLYPHS), size, size), np.float32)
    lo, hi = size // 4, size - size // 4
    out[0, lo:hi, lo:hi] = 1                       # a solid square in the middle
    out[1, 1:-1, 1:-1] = 1                         # a square outline along the border
    out[1, 2:-2, 2:-2] = 0
    mid = size // 2
    out[2, mid - 1:mid + 1, 1:-1] = 1              # a plus sign
    out[2, 1:-1, mid - 1:mid + 1] = 1
    diagonal = np.eye(size, dtype=bool)            # an X
    out[3][diagonal | diagonal[::-1]] = 1
    return out


def glyph_images(count, seed, size=12, noise=0.3):
    """``count`` noisy glyphs shaped (count, 1, size, size), float32, and int64 labels."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, len(GLYPHS), count)
    pictures = glyph_stencils(size)[labels] + rng.normal(0.0, noise, (count, size, size))
    return pictures[:, None].astype(np.float32), labels.astype(np.int64)


class DriftTrack:
    """A cart on a track with a gusting wind: push left (0) or right (1) to stay near the
    middle. The observation is (position, velocity, wind); each step survived pays 1, and
    the episode ends once the cart leaves [-1, 1]."""

    OBSERVATION_SIZE = 3
    ACTIONS = 2

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.position = self.velocity = self.wind = 0.0

    def reset(self):
        self.position, self.velocity = self.rng.uniform(-0.3, 0.3, 2)
        self.wind = 0.0
        return self._observation()

    def step(self, action):
        self.wind = 0.8 * self.wind + self.rng.normal(0.0, 0.05)
        push = 0.06 if action == 1 else -0.06
        self.velocity = 0.9 * self.velocity + push + self.wind
        self.position += 0.2 * self.velocity
        done = abs(self.position) > 1.0
        return self._observation(), 1.0, done

    def _observation(self):
        return np.array([self.position, self.velocity, self.wind], np.float32)
