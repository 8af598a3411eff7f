#!/usr/bin/env python3
"""A trainer-shaped loop over gauntlet's env API: REINFORCE on a softmax over four
shopping strategies (a "strategy bandit"), played in batches through the Python client's
vector env, on the `shop` env with injected faults. Every step goes through gauntlet's
pipeline (faults, reward service, ClickHouse), tagged with the policy version.

    GAUNTLET_URL=http://127.0.0.1:9470 GAUNTLET_TOKEN=$(cat .gauntlet/envapi-token) \\
        python3 examples/shop_reinforce.py --iterations 12 --batch 16

The mean episode return and the success rate rise as the policy shifts its probability
onto the strategy that checks stock and budget before it buys.
"""

import argparse
import math
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients", "python"))

import gauntlet_env as g  # noqa: E402

ARMS = ["first_hit", "cheapest_match", "check_stock", "random_tool"]
TOOLS = ["catalog.search", "catalog.get", "inventory.get", "order.create", "order.status",
         "payment.pay", "wallet.balance", "shipping.ship", "wait"]


class Strategy:
    """A scripted shopper; arm picks how it chooses what to buy. It retries after
    injected faults (waiting out retry_after_ms) like any sane client."""

    def __init__(self, arm, task, rng):
        self.arm, self.task, self.rng = arm, task, rng
        self.last = None
        self.pending = None
        self.cands = []
        self.order_id = None

    def do(self, tool, **args):
        self.last = {"tool": tool, "args": args}
        return self.last

    def act(self, obs):
        t = self.task
        if self.arm == "random_tool":
            return self.do(self.rng.choice(TOOLS), query=t["item"])
        if self.last is None:
            return self.do("catalog.search", query=t["item"])
        if self.pending is not None:
            a, self.pending = self.pending, None
            return self.do(a["tool"], **a["args"])
        if not isinstance(obs, dict) or obs.get("truncated"):
            return self.do(self.last["tool"], **self.last["args"])
        if obs.get("status"):
            if obs.get("retry_after_ms"):
                self.pending = self.last
                return self.do("wait", ms=min(int(obs["retry_after_ms"]), 10000))
            return self.do(self.last["tool"], **self.last["args"])
        tool = self.last["tool"]
        if tool == "catalog.search":
            hits = obs.get("results") or []
            if self.arm == "first_hit":
                self.cands = hits[:1]
            else:
                limit = min(t["budget"], t["balance"])
                self.cands = sorted((h for h in hits if t["item"] in h["name"].split() and h["price"] * t["qty"] <= limit),
                                    key=lambda h: (h["price"], h["sku"]))
            return self.next_candidate()
        if tool == "inventory.get":
            if obs.get("ok") and obs.get("stock", 0) >= t["qty"]:
                return self.do("order.create", sku=self.cands[0]["sku"], qty=t["qty"])
            self.cands = self.cands[1:]
            return self.next_candidate()
        if tool == "order.create":
            if not obs.get("ok"):
                self.cands = self.cands[1:]
                return self.next_candidate()
            self.order_id = obs["order_id"]
            return self.do("payment.pay", order_id=self.order_id)
        if tool == "payment.pay":
            if obs.get("ok") or obs.get("rule") == "pay_once":
                return self.do("shipping.ship", order_id=self.order_id)
            self.cands = self.cands[1:]
            return self.next_candidate()
        return self.do("order.status", order_id=self.order_id or "o-1")

    def next_candidate(self):
        if not self.cands:
            return self.do("catalog.search", query=self.task["item"])
        if self.arm == "check_stock":
            return self.do("inventory.get", sku=self.cands[0]["sku"])
        return self.do("order.create", sku=self.cands[0]["sku"], qty=self.task["qty"])


def softmax(x):
    m = max(x)
    e = [math.exp(v - m) for v in x]
    s = sum(e)
    return [v / s for v in e]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=12)
    ap.add_argument("--batch", type=int, default=16, help="episodes per iteration, stepped together")
    ap.add_argument("--lr", type=float, default=0.5)
    ap.add_argument("--max-steps", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    theta = [0.0] * len(ARMS)
    baseline = None
    first = last = None
    with g.GauntletVectorEnv(args.batch, "shop", max_steps=args.max_steps, policy="reinforce") as venv:
        for it in range(args.iterations):
            probs = softmax(theta)
            arms = [rng.choices(range(len(ARMS)), probs)[0] for _ in range(args.batch)]
            obs, _ = venv.reset(seed=rng.getrandbits(40))
            agents = [Strategy(ARMS[a], o, rng) for a, o in zip(arms, obs)]
            returns, success, live = [0.0] * args.batch, [False] * args.batch, [True] * args.batch
            while any(live):
                actions = [dict(agents[i].act(obs[i]), trainer={"policy_version": f"it-{it}"}) if live[i] else None
                           for i in range(args.batch)]
                nobs, rew, term, trunc, infos = venv.step(actions)
                for i in range(args.batch):
                    if not live[i]:
                        continue
                    obs[i] = nobs[i]
                    returns[i] += rew[i]
                    if term[i] or trunc[i]:
                        live[i] = False
                        success[i] = infos[i]["reason"] == "success"
            mean = sum(returns) / len(returns)
            baseline = mean if baseline is None else 0.8 * baseline + 0.2 * mean
            for a, g_ in zip(arms, returns):
                adv = g_ - baseline
                for k in range(len(ARMS)):
                    theta[k] += args.lr * adv * ((1.0 if k == a else 0.0) - probs[k]) / args.batch
            rate = sum(success) / len(success)
            print(f"iter {it:2d}  mean return {mean:7.3f}  success {rate:5.0%}  "
                  + "  ".join(f"{n}={p:.2f}" for n, p in zip(ARMS, probs)), flush=True)
            if first is None:
                first = (mean, rate)
            last = (mean, rate)
    print(f"first iteration: return {first[0]:.3f}, success {first[1]:.0%}; "
          f"last: return {last[0]:.3f}, success {last[1]:.0%}")


if __name__ == "__main__":
    main()
