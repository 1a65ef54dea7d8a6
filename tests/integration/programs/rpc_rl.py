"""Reinforcement learning over RPC: an agent and observers, each with its own environment.

Port of pytorch/examples `distributed/rpc/rl/main.py`, shrunk (one observer by
default, as in the original; `--world-size` adds more). gym is not used:
each observer owns a small deterministic cart-pole (`toy_data.py`). The policy
starts from weights drawn by a seeded NumPy generator, has no dropout, and the
agent samples each observer's actions with that observer's own seeded NumPy
generator (inverse CDF of the policy's probabilities, scored with
`Categorical.log_prob`), so both runs take the same actions. MASTER_PORT comes
from the environment. Plain PyTorch.
"""
import argparse
import json
import os

import numpy as np
import torch
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.distributed.rpc import RRef, remote, rpc_async, rpc_sync
from torch.distributions import Categorical

from toy_data import CartPole

AGENT_NAME = "agent"
OBSERVER_NAME = "observer{}"

parser = argparse.ArgumentParser(description="PyTorch RPC RL example")
parser.add_argument("--world-size", type=int, default=2, metavar="W",
                    help="world size for RPC, rank 0 is the agent, others are observers")
parser.add_argument("--gamma", type=float, default=0.99, metavar="G", help="discount factor")
parser.add_argument("--seed", type=int, default=543, metavar="N", help="random seed")
parser.add_argument("--episodes", type=int, default=6, metavar="N", help="episodes to run")
parser.add_argument("--steps", type=int, default=30, metavar="N", help="steps per episode")
args = parser.parse_args()

torch.manual_seed(args.seed)


def _call_method(method, rref, *args, **kwargs):
    """Call a method on the value held by `rref` (runs on the RRef's owner)."""
    return method(rref.local_value(), *args, **kwargs)


def _remote_method(method, rref, *args, **kwargs):
    """Run `method` on the owner of `rref` and fetch the result back."""
    args = [method, rref] + list(args)
    return rpc_sync(rref.owner(), _call_method, args=args, kwargs=kwargs)


class Policy(nn.Module):
    def __init__(self):
        super(Policy, self).__init__()
        self.affine1 = nn.Linear(4, 32)
        self.dropout = nn.Dropout(p=0.0)
        self.affine2 = nn.Linear(32, 2)
        rng = np.random.default_rng(args.seed)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.from_numpy(rng.uniform(-0.5, 0.5, tuple(p.shape)).astype(np.float32)))

    def forward(self, x):
        x = self.affine1(x)
        x = self.dropout(x)
        x = F.relu(x)
        action_scores = self.affine2(x)
        return F.softmax(action_scores, dim=1)


class Observer:
    """Owns an environment: sends states to the agent, applies its actions, reports rewards."""

    def __init__(self):
        self.id = rpc.get_worker_info().id
        self.env = CartPole(args.seed + self.id)

    def run_episode(self, agent_rref, n_steps):
        state, ep_reward = self.env.reset(), 0
        for step in range(n_steps):
            # send the state to the agent to get an action
            action = _remote_method(Agent.select_action, agent_rref, self.id, state)
            # apply the action to the environment, and get the reward
            state, reward, done, _ = self.env.step(action)
            # report the reward to the agent for training purpose
            _remote_method(Agent.report_reward, agent_rref, self.id, reward)
            if done:
                break


class Agent:
    def __init__(self, world_size):
        self.ob_rrefs = []
        self.agent_rref = RRef(self)
        self.rewards = {}
        self.saved_log_probs = {}
        self.samplers = {}
        self.policy = Policy()
        self.optimizer = optim.Adam(self.policy.parameters(), lr=1e-2)
        self.eps = np.finfo(np.float32).eps.item()
        self.running_reward = 0
        for ob_rank in range(1, world_size):
            ob_info = rpc.get_worker_info(OBSERVER_NAME.format(ob_rank))
            self.ob_rrefs.append(remote(ob_info, Observer))
            self.rewards[ob_info.id] = []
            self.saved_log_probs[ob_info.id] = []
            self.samplers[ob_info.id] = np.random.default_rng(args.seed + 100 * ob_info.id)

    def select_action(self, ob_id, state):
        """Choose an action for observer `ob_id`; one list of log-probs per observer."""
        state = torch.from_numpy(state).float().unsqueeze(0)
        probs = self.policy(state)
        m = Categorical(probs)
        cdf = np.cumsum(probs.detach().numpy()[0])
        action = torch.tensor([min(int(np.searchsorted(cdf, self.samplers[ob_id].random())),
                                   len(cdf) - 1)])
        self.saved_log_probs[ob_id].append(m.log_prob(action))
        return action.item()

    def report_reward(self, ob_id, reward):
        self.rewards[ob_id].append(reward)

    def run_episode(self, n_steps=0):
        """Tell every observer to run an episode of up to n_steps, and wait for them."""
        futs = []
        for ob_rref in self.ob_rrefs:
            futs.append(rpc_async(ob_rref.owner(), _call_method,
                                  args=(Observer.run_episode, ob_rref, self.agent_rref, n_steps)))
        for fut in futs:
            fut.wait()

    def finish_episode(self):
        """REINFORCE on the joined trajectories; the episode's reward is the smallest one."""
        R, probs, rewards = 0, [], []
        for ob_id in self.rewards:
            probs.extend(self.saved_log_probs[ob_id])
            rewards.extend(self.rewards[ob_id])

        min_reward = min([sum(self.rewards[ob_id]) for ob_id in self.rewards])
        self.running_reward = 0.05 * min_reward + (1 - 0.05) * self.running_reward

        for ob_id in self.rewards:
            self.rewards[ob_id] = []
            self.saved_log_probs[ob_id] = []

        policy_loss, returns = [], []
        for r in rewards[::-1]:
            R = r + args.gamma * R
            returns.insert(0, R)
        returns = torch.tensor(returns)
        returns = (returns - returns.mean()) / (returns.std() + self.eps)
        for log_prob, R in zip(probs, returns):
            policy_loss.append(-log_prob * R)
        self.optimizer.zero_grad()
        policy_loss = torch.cat(policy_loss).sum()
        policy_loss.backward()
        self.optimizer.step()
        return min_reward, policy_loss.item()


def run_worker(rank, world_size):
    """Rank 0 is the agent; the others are observers."""
    os.environ.setdefault("MASTER_ADDR", "localhost")
    os.environ.setdefault("MASTER_PORT", "29500")
    if rank == 0:
        rpc.init_rpc(AGENT_NAME, rank=rank, world_size=world_size)
        agent = Agent(world_size)
        rewards, losses = [], []
        for i_episode in range(1, args.episodes + 1):
            agent.run_episode(n_steps=args.steps)
            last_reward, loss = agent.finish_episode()
            rewards.append(last_reward)
            losses.append(loss)
            print("Episode {}\tLast reward: {:.2f}\tAverage reward: {:.2f}".format(
                i_episode, last_reward, agent.running_reward))
        print("RESULT", json.dumps({"rewards": rewards, "losses": losses,
                                    "running_reward": agent.running_reward}), flush=True)
    else:
        # observers wait passively for instructions from the agent
        rpc.init_rpc(OBSERVER_NAME.format(rank), rank=rank, world_size=world_size)
    rpc.shutdown()


def main():
    mp.spawn(run_worker, args=(args.world_size,), nprocs=args.world_size, join=True)


if __name__ == "__main__":
    main()
