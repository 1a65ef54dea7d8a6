"""REINFORCE over RPC: one agent process holds the policy, observer processes hold the
environments and ask the agent for every action.

The shape of PyTorch's RPC reinforcement-learning example: the agent creates one
``Observer`` per observer rank with ``rpc.remote(worker_info, Observer)`` (looked up by
name with ``rpc.get_worker_info``), passes an ``RRef`` to itself, and starts the episodes
with ``rpc_async`` through a helper that calls a method on ``rref.local_value()`` on the
RRef's owner (``owner_calls.py``); the observers call back with ``rpc_sync`` for each
action and each reward. After an episode the agent turns the rewards into normalised discounted
returns and steps ``Adam`` on ``-log_prob * return`` (``Categorical.log_prob``,
``torch.cat``). The environment is ``DriftTrack``; the policy starts from seeded NumPy
weights, and each observer's actions are drawn from its own seeded NumPy generator
(inverse CDF of the policy's probabilities), so every library takes the same actions.
MASTER_ADDR/MASTER_PORT come from the environment. Plain PyTorch.
"""
import argparse
import json
import os

import numpy as np
import torch
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn, optim
from torch.distributions import Categorical

from owner_calls import async_on_owner, sync_on_owner
from synthetic import DriftTrack

# world size: the agent and its observers; steps: the longest episode
DEFAULTS = {"world_size": 2, "episodes": 5, "steps": 25, "gamma": 0.95, "seed": 17}
parser = argparse.ArgumentParser()
for key, value in DEFAULTS.items():
    parser.add_argument("--" + key.replace("_", "-"), type=type(value), default=value)
args = parser.parse_args()


class PolicyNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = nn.Linear(DriftTrack.OBSERVATION_SIZE, 24)
        self.scores = nn.Linear(24, DriftTrack.ACTIONS)
        rng = np.random.default_rng(args.seed)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.from_numpy(rng.uniform(-0.6, 0.6, tuple(p.shape)).astype(np.float32)))

    def forward(self, observation):
        return F.softmax(self.scores(F.relu(self.hidden(observation))), dim=1)


class Observer:
    def __init__(self):
        self.rank = rpc.get_worker_info().id
        self.track = DriftTrack(args.seed + self.rank)

    def play(self, agent_rref, steps):
        observation = self.track.reset()
        for _ in range(steps):
            action = sync_on_owner(Agent.choose, agent_rref, self.rank, observation)
            observation, reward, done = self.track.step(action)
            sync_on_owner(Agent.record, agent_rref, self.rank, reward)
            if done:
                break


class Agent:
    def __init__(self, world_size):
        self.me = rpc.RRef(self)
        self.policy = PolicyNet()
        self.optimizer = optim.Adam(self.policy.parameters(), lr=0.02)
        self.tiny = float(np.finfo(np.float32).eps)
        self.observers, self.rewards, self.log_probs, self.dice = [], {}, {}, {}
        for rank in range(1, world_size):
            info = rpc.get_worker_info(f"observer{rank}")
            self.observers.append(rpc.remote(info, Observer))
            self.rewards[info.id], self.log_probs[info.id] = [], []
            self.dice[info.id] = np.random.default_rng(1000 + info.id)

    def choose(self, rank, observation):
        probs = self.policy(torch.from_numpy(observation).float().unsqueeze(0))
        cumulative = probs.detach().numpy()[0].cumsum()
        picked = int(np.searchsorted(cumulative, self.dice[rank].random()))
        picked = min(picked, len(cumulative) - 1)
        action = torch.tensor([picked])
        self.log_probs[rank].append(Categorical(probs).log_prob(action))
        return action.item()

    def record(self, rank, reward):
        self.rewards[rank].append(reward)

    def episode(self, steps):
        pending = [async_on_owner(Observer.play, o, self.me, steps) for o in self.observers]
        for future in pending:
            future.wait()
        returns, log_probs, lengths = [], [], []
        for rank in self.rewards:
            running, mine = 0.0, []
            for reward in reversed(self.rewards[rank]):
                running = reward + args.gamma * running
                mine.insert(0, running)
            returns += mine
            log_probs += self.log_probs[rank]
            lengths.append(len(self.rewards[rank]))
            self.rewards[rank], self.log_probs[rank] = [], []
        returns = torch.tensor(returns)
        returns = (returns - returns.mean()) / (returns.std() + self.tiny)
        loss = torch.cat([-lp * g for lp, g in zip(log_probs, returns)]).sum()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return min(lengths), loss.item()


def run(rank, world_size):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    if rank == 0:
        rpc.init_rpc("agent", rank=rank, world_size=world_size)
        agent = Agent(world_size)
        lengths, losses = [], []
        for number in range(args.episodes):
            shortest, loss = agent.episode(args.steps)
            lengths.append(shortest)
            losses.append(loss)
            print(f"episode {number}: shortest {shortest} steps, loss {loss:.4f}")
        print("RESULT", json.dumps({"lengths": lengths, "losses": losses,
                                    "scores": agent.policy.scores.weight.flatten().tolist()}),
              flush=True)
    else:  # observers only answer the agent
        rpc.init_rpc(f"observer{rank}", rank=rank, world_size=world_size)
    rpc.shutdown()


if __name__ == "__main__":
    mp.spawn(run, args=(args.world_size,), nprocs=args.world_size, join=True)
