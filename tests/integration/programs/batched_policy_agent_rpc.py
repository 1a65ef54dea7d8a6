"""Batched action selection over RPC: the agent waits until every observer has sent its
observation for the step, runs the policy once on the stacked batch, and answers all.

The pattern of PyTorch's batched RPC REINFORCE example: ``select_batched`` is a
``@staticmethod`` under ``@rpc.functions.async_execution``; each call writes its
observation into a shared tensor (``copy_``) and returns ``future.then(...)`` picking
its own action out of the step's future, and the call that completes the batch, under a
lock, runs the policy and ``set_result``s that future. Observers are created with
``rpc.remote(worker_info, Observer)`` and run with ``rref.rpc_async().play(...)`` (the
RRef's method proxy); the agent gathers them with ``torch.futures.wait_all``, stacks the
rewards (discounted in place, in a tensor of the episode's length) and the log
probabilities the batched ``Categorical`` gave, and steps ``Adam``. Environments are
``DriftTrack``s; the policy's weights and the agent's action draws come from seeded
NumPy generators, so every library takes the same actions. MASTER_ADDR/MASTER_PORT come
from the environment. Plain PyTorch.
"""
import argparse
import json
import os
import threading

import numpy as np
import torch
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp
from torch import nn, optim
from torch.distributions import Categorical

from synthetic import DriftTrack

parser = argparse.ArgumentParser()
parser.add_argument("--world-size", type=int, default=3, help="the agent and its observers")
parser.add_argument("--episodes", type=int, default=4)
parser.add_argument("--steps", type=int, default=12, help="steps per episode")
parser.add_argument("--gamma", type=float, default=0.9)
parser.add_argument("--seed", type=int, default=29)
args = parser.parse_args()


def step_policy():
    """Action probabilities for an (observers, 1, observation) batch, over the last dim;
    the starting weights are drawn in order by the seeded NumPy generator."""
    policy = nn.Sequential(nn.Linear(DriftTrack.OBSERVATION_SIZE, 20), nn.ReLU(),
                           nn.Linear(20, DriftTrack.ACTIONS), nn.Softmax(dim=2))
    draws = np.random.default_rng(args.seed)
    with torch.no_grad():
        for weight in policy.parameters():
            weight.copy_(torch.from_numpy(
                draws.uniform(-0.6, 0.6, size=tuple(weight.shape)).astype(np.float32)))
    return policy


class Observer:
    def __init__(self):
        self.slot = rpc.get_worker_info().id - 1  # its row in the agent's batch
        self.track = DriftTrack(args.seed + self.slot)

    def play(self, agent_rref, steps):
        """One fixed-length run (restarting the track after a fall); returns the discounted
        rewards of each step and how long the first attempt lasted."""
        rewards = torch.zeros(steps)
        observation, attempt_start, first_attempt = self.track.reset(), 0, steps
        for step in range(steps):
            batch_row = torch.from_numpy(observation).float().unsqueeze(0)
            action = rpc.rpc_sync(agent_rref.owner(), Agent.select_batched,
                                  args=(agent_rref, self.slot, batch_row))
            observation, reward, done = self.track.step(action)
            rewards[step] = reward
            if done or step == steps - 1:
                attempt = rewards[attempt_start:step + 1]  # a view: discounted in place
                running = 0.0
                for i in reversed(range(attempt.numel())):
                    running = attempt[i] + args.gamma * running
                    attempt[i] = running
                if attempt_start == 0:
                    first_attempt = step + 1
                observation, attempt_start = self.track.reset(), step + 1
        return [rewards, first_attempt]


class Agent:
    def __init__(self, world_size):
        self.me = rpc.RRef(self)
        self.policy = step_policy()
        self.optimizer = optim.Adam(self.policy.parameters(), lr=0.02)
        self.dice = np.random.default_rng(args.seed)
        self.observers = [rpc.remote(rpc.get_worker_info(f"observer{rank}"), Observer)
                          for rank in range(1, world_size)]
        self.batch = torch.zeros(len(self.observers), 1, DriftTrack.OBSERVATION_SIZE)
        self.waiting = len(self.observers)
        self.lock = threading.Lock()
        self.step_actions = torch.futures.Future()
        self.log_probs = []

    def draw(self, probs):
        """Inverse-CDF draws for every row of `probs`, from the agent's NumPy generator."""
        u = torch.from_numpy(self.dice.random(probs.shape[:-1]).astype(np.float32))
        picked = (probs.detach().cumsum(-1) < u.unsqueeze(-1)).sum(-1)
        return picked.clamp(max=probs.shape[-1] - 1)

    @staticmethod
    @rpc.functions.async_execution
    def select_batched(agent_rref, slot, observation):
        self = agent_rref.local_value()
        self.batch[slot].copy_(observation)
        mine = self.step_actions.then(lambda done: done.wait()[slot].item())
        with self.lock:
            self.waiting -= 1
            if self.waiting == 0:  # the last observation of the step has arrived
                self.waiting = len(self.observers)
                probs = self.policy(self.batch.clone())  # the next step overwrites the batch
                actions = self.draw(probs)
                self.log_probs.append(Categorical(probs).log_prob(actions).t()[0])
                answered, self.step_actions = self.step_actions, torch.futures.Future()
                answered.set_result(actions)
        return mine

    def episode(self, steps):
        results = torch.futures.wait_all([o.rpc_async().play(self.me, steps)
                                          for o in self.observers])
        returns = torch.stack([r[0] for r in results]).t()          # (steps, observers)
        loss = (-torch.stack(self.log_probs) * returns / len(results)).sum()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.log_probs = []
        return sum(r[1] for r in results) / len(results), loss.item()

    def train(self, episodes, steps):
        history = {"survived": [], "losses": []}
        for number in range(episodes):
            mean_first, loss = self.episode(steps)
            history["survived"].append(mean_first)
            history["losses"].append(loss)
            print(f"episode {number}: first attempt lasted {mean_first:.1f} steps on average")
        history["scores"] = self.policy[2].weight.flatten().tolist()
        return history


def run(rank, world_size):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    rpc.init_rpc("agent" if rank == 0 else f"observer{rank}", rank=rank, world_size=world_size)
    if rank == 0:  # the observers only answer the agent's calls
        print("RESULT", json.dumps(Agent(world_size).train(args.episodes, args.steps)),
              flush=True)
    rpc.shutdown()


if __name__ == "__main__":
    mp.spawn(run, args=(args.world_size,), nprocs=args.world_size, join=True)
