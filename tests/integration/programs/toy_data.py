"""Small deterministic stand-ins for the data sets and environments of the example programs.

NumPy only (no torch), so it means the same thing in every library: stroke images in
place of MNIST, and the classic cart-pole in place of gym's CartPole-v1.
"""
import numpy as np


def stroke_patterns(size):
    """Four (size, size) patterns: a row, a column, the diagonal and the anti-diagonal."""
    grid = np.zeros((4, size, size), np.float32)
    mid = size // 2
    grid[0, mid - 1:mid + 1, 1:size - 1] = 1
    grid[1, 1:size - 1, mid - 1:mid + 1] = 1
    grid[2][np.eye(size, dtype=bool)] = 1
    grid[3][np.fliplr(np.eye(size, dtype=bool))] = 1
    return grid


def noisy_strokes(n, seed, size=12, noise=0.3):
    """``n`` stroke images with Gaussian noise, shape (n, 1, size, size), and their labels."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 4, n)
    images = stroke_patterns(size)[labels] + rng.normal(0, noise, (n, size, size))
    return images[:, None].astype(np.float32), labels


class CartPole:
    """The classic cart-pole (Euler steps, reward 1 per step until the pole falls)."""

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.state = None

    def reset(self):
        self.state = self.rng.uniform(-0.05, 0.05, 4)
        return self.state.astype(np.float32)

    def step(self, action):
        x, x_dot, theta, theta_dot = self.state
        force = 10.0 if action == 1 else -10.0
        cos, sin = np.cos(theta), np.sin(theta)
        temp = (force + 0.05 * theta_dot ** 2 * sin) / 1.1
        theta_acc = (9.8 * sin - cos * temp) / (0.5 * (4.0 / 3.0 - 0.1 * cos ** 2 / 1.1))
        x_acc = temp - 0.05 * theta_acc * cos / 1.1
        x, x_dot = x + 0.02 * x_dot, x_dot + 0.02 * x_acc
        theta, theta_dot = theta + 0.02 * theta_dot, theta_dot + 0.02 * theta_acc
        self.state = np.array([x, x_dot, theta, theta_dot])
        done = bool(abs(x) > 2.4 or abs(theta) > 12 * 2 * np.pi / 360)
        return self.state.astype(np.float32), 1.0, done, {}
