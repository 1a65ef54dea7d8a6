"""Batched REINFORCE over RPC: the agent answers all observers with one policy call per step.

Port of pytorch/examples `distributed/rpc/batch/reinforce.py` (the batching
variant), shrunk. `@rpc.functions.async_execution` lets the agent return a
future that completes when the last observer's state of the step has arrived.
gym is not used: each observer owns a small deterministic cart-pole
(`toy_data.py`). The policy starts from weights drawn by a seeded NumPy generator, has no
dropout, and the agent draws the actions with a seeded NumPy generator (inverse
CDF of the policy's probabilities, scored with `Categorical.log_prob`), so both
runs take the same actions. MASTER_PORT comes from the environment. Plain PyTorch.
"""
import argparse
import json
import os
import threading

import numpy as np
import torch
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.distributed.rpc import RRef, remote
from torch.distributions import Categorical

from toy_data import CartPole

NUM_STEPS = 20
AGENT_NAME = "agent"
OBSERVER_NAME = "observer{}"

parser = argparse.ArgumentParser(description="PyTorch RPC Batch RL example")
parser.add_argument("--gamma", type=float, default=1.0, metavar="G", help="discount factor")
parser.add_argument("--seed", type=int, default=543, metavar="N", help="random seed")
parser.add_argument("--num-episode", type=int, default=5, metavar="E", help="number of episodes")
parser.add_argument("--world-size", type=int, default=3, metavar="W", help="agent + observers")
args = parser.parse_args()

torch.manual_seed(args.seed)


class Policy(nn.Module):
    def __init__(self, batch=True):
        super(Policy, self).__init__()
        self.affine1 = nn.Linear(4, 32)
        self.dropout = nn.Dropout(p=0.0)
        self.affine2 = nn.Linear(32, 2)
        self.dim = 2 if batch else 1
        rng = np.random.default_rng(args.seed)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.from_numpy(rng.uniform(-0.5, 0.5, tuple(p.shape)).astype(np.float32)))

    def forward(self, x):
        x = self.affine1(x)
        x = self.dropout(x)
        x = F.relu(x)
        action_scores = self.affine2(x)
        return F.softmax(action_scores, dim=self.dim)


class Observer:
    """Owns an environment: sends states to the agent and applies its actions."""

    def __init__(self, batch=True):
        self.id = rpc.get_worker_info().id - 1
        self.env = CartPole(args.seed + self.id)
        self.select_action = Agent.select_action_batch if batch else Agent.select_action

    def run_episode(self, agent_rref, n_steps):
        state, ep_reward = self.env.reset(), NUM_STEPS
        rewards = torch.zeros(n_steps)
        start_step = 0
        for step in range(n_steps):
            state = torch.from_numpy(state).float().unsqueeze(0)
            # send the state to the agent to get an action
            action = rpc.rpc_sync(agent_rref.owner(), self.select_action,
                                  args=(agent_rref, self.id, state))
            # apply the action to the environment, and get the reward
            state, reward, done, _ = self.env.step(action)
            rewards[step] = reward
            if done or step + 1 >= n_steps:
                curr_rewards = rewards[start_step:(step + 1)]
                R = 0
                for i in range(curr_rewards.numel() - 1, -1, -1):
                    R = curr_rewards[i] + args.gamma * R
                    curr_rewards[i] = R
                state = self.env.reset()
                if start_step == 0:
                    ep_reward = min(ep_reward, step - start_step + 1)
                start_step = step + 1
        return [rewards, ep_reward]


class Agent:
    def __init__(self, world_size, batch=True):
        self.ob_rrefs = []
        self.agent_rref = RRef(self)
        self.rewards = {}
        self.policy = Policy(batch)
        self.optimizer = optim.Adam(self.policy.parameters(), lr=1e-2)
        self.running_reward = 0
        self.sampler = np.random.default_rng(args.seed)
        for ob_rank in range(1, world_size):
            ob_info = rpc.get_worker_info(OBSERVER_NAME.format(ob_rank))
            self.ob_rrefs.append(remote(ob_info, Observer, args=(batch,)))
            self.rewards[ob_info.id] = []
        self.states = torch.zeros(len(self.ob_rrefs), 1, 4)
        self.batch = batch
        self.saved_log_probs = [] if self.batch else {k: [] for k in range(len(self.ob_rrefs))}
        self.future_actions = torch.futures.Future()
        self.lock = threading.Lock()
        self.pending_states = len(self.ob_rrefs)

    def sample(self, probs):
        """Actions drawn from `probs` (..., 2) with the agent's NumPy generator."""
        u = torch.from_numpy(self.sampler.random(probs.shape[:-1]).astype(np.float32))
        return (probs.detach().cumsum(-1) < u.unsqueeze(-1)).sum(-1).clamp(max=probs.shape[-1] - 1)

    @staticmethod
    @rpc.functions.async_execution
    def select_action_batch(agent_rref, ob_id, state):
        """Wait for the states of all observers, then choose all their actions at once."""
        self = agent_rref.local_value()
        self.states[ob_id].copy_(state)
        future_action = self.future_actions.then(
            lambda future_actions: future_actions.wait()[ob_id].item())
        with self.lock:
            self.pending_states -= 1
            if self.pending_states == 0:
                self.pending_states = len(self.ob_rrefs)
                # a copy (the original's `.cuda()`): the next step writes into self.states
                probs = self.policy(self.states.clone())
                m = Categorical(probs)
                actions = self.sample(probs)
                self.saved_log_probs.append(m.log_prob(actions).t()[0])
                future_actions = self.future_actions
                self.future_actions = torch.futures.Future()
                future_actions.set_result(actions.cpu())
        return future_action

    @staticmethod
    def select_action(agent_rref, ob_id, state):
        """Choose one observer's action right away."""
        self = agent_rref.local_value()
        probs = self.policy(state)
        m = Categorical(probs)
        action = self.sample(probs)
        self.saved_log_probs[ob_id].append(m.log_prob(action))
        return action.item()

    def run_episode(self, n_steps=0):
        """Run one episode on every observer, then train on all of their rewards."""
        futs = []
        for ob_rref in self.ob_rrefs:
            futs.append(ob_rref.rpc_async().run_episode(self.agent_rref, n_steps))
        rets = torch.futures.wait_all(futs)
        rewards = torch.stack([ret[0] for ret in rets]).t()
        ep_rewards = sum([ret[1] for ret in rets]) / len(rets)

        if self.batch:
            probs = torch.stack(self.saved_log_probs)
        else:
            probs = torch.stack([torch.stack(self.saved_log_probs[i]) for i in range(len(rets))])
        policy_loss = -probs * rewards / len(rets)
        policy_loss.sum().backward()
        self.optimizer.step()
        self.optimizer.zero_grad()

        # reset variables
        self.saved_log_probs = [] if self.batch else {k: [] for k in range(len(self.ob_rrefs))}
        self.states = torch.zeros(len(self.ob_rrefs), 1, 4)
        self.running_reward = 0.5 * ep_rewards + 0.5 * self.running_reward
        return ep_rewards, self.running_reward, policy_loss.sum().item()


def run_worker(rank, world_size, n_episode, batch, print_log=True):
    """Rank 0 is the agent; the others are observers."""
    os.environ.setdefault("MASTER_ADDR", "localhost")
    os.environ.setdefault("MASTER_PORT", "29500")
    if rank == 0:
        rpc.init_rpc(AGENT_NAME, rank=rank, world_size=world_size)
        agent = Agent(world_size, batch)
        rewards, losses = [], []
        for i_episode in range(n_episode):
            last_reward, running_reward, loss = agent.run_episode(n_steps=NUM_STEPS)
            rewards.append(last_reward)
            losses.append(loss)
            if print_log:
                print("Episode {}\tLast reward: {:.2f}\tAverage reward: {:.2f}".format(
                    i_episode, last_reward, running_reward))
        print("RESULT", json.dumps({"rewards": rewards, "losses": losses,
                                    "policy": agent.policy.affine2.weight.flatten().tolist()}),
              flush=True)
    else:
        # observers wait passively for instructions from the agent
        rpc.init_rpc(OBSERVER_NAME.format(rank), rank=rank, world_size=world_size)
    rpc.shutdown()


def main():
    mp.spawn(run_worker, args=(args.world_size, args.num_episode, True), nprocs=args.world_size,
             join=True)


if __name__ == "__main__":
    main()
