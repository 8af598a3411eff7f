#!/usr/bin/env python3
"""Task episodes over gauntlet's env API with a scripted policy, through the Python client.

Each episode of env `tasks` resets on a dataset the stack plays (by the task's id for odd
episodes, by the seed for even ones), checks the first observation holds the task's
instruction, then plays three steps: a look around (`shell.exec ls`), the task folder's
solution/solve.sh (`gauntlet_env.tasks.solution_action`, what the oracle runs) and
`submit`, whose observation is the verifier's verdict. Episodes run on several threads,
each with its own connection. One JSON line per episode goes to stdout, then a summary.

    GAUNTLET_URL=http://127.0.0.1:9470 GAUNTLET_TOKEN=$(cat .gauntlet/envapi-token) \\
        python3 examples/tasks_scripted.py --dataset gauntlet --dir datasets/gauntlet --episodes 200

It exits non-zero when an episode's first observation is not its task's, or when the
solution fails where no fault was injected (a failure under a fault is the fault's doing).
"""

import argparse
import concurrent.futures
import json
import os
import sys
import threading
import tomllib
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients", "python"))

import gauntlet_env as g  # noqa: E402
from gauntlet_env import tasks as gt  # noqa: E402


def task_ids(root):
    """The tasks a seed draws from, sorted as gauntlet sorts them: folders holding
    task.toml, relative to root, hidden folders skipped, and canaries (unsolvable tasks
    marked `canary = true` in [metadata]) left out, as gauntlet's draws leave them out."""
    out = []
    for d, subdirs, files in os.walk(root):
        subdirs[:] = sorted(s for s in subdirs if not s.startswith("."))
        if "task.toml" in files:
            with open(os.path.join(d, "task.toml"), "rb") as f:
                if tomllib.load(f).get("metadata", {}).get("canary") is True:
                    subdirs[:] = []
                    continue
            out.append(os.path.relpath(d, root).replace(os.sep, "/"))
            subdirs[:] = []
    return sorted(out)


def play(client, args, ids, i):
    by_id = i % 2 == 1
    params = gt.task_params(args.dataset, task=ids[(i * 7) % len(ids)] if by_id else "")
    env = g.GauntletEnv("tasks", client=client, params=params, profile=args.profile)
    try:
        obs, info = env.reset(seed=args.seed + i)
        problems = []
        task = obs.get("task", "")
        if by_id and task != params["task"]:
            problems.append("reset by id %s gave task %r" % (params["task"], task))
        if not by_id and task != ids[(args.seed + i) % len(ids)]:
            problems.append("reset by seed %d gave task %r, want %s" % (args.seed + i, task, ids[(args.seed + i) % len(ids)]))
        if not obs.get("instruction") or not obs.get("digest", "").startswith("sha256:"):
            problems.append("the first observation holds no instruction or digest: %.200s" % json.dumps(obs))
        faults = 0
        steps = 0
        last = None
        for action in ({"tool": "shell.exec", "args": {"command": "ls"}},
                       gt.solution_action(os.path.join(args.dir, task)), gt.SUBMIT):
            out = env.step(action)
            steps += 1
            faults += len(out.info["faults"])
            last = out
            if out.terminated or out.truncated:
                break
        v = gt.verdict(last.obs)
        passed = bool(v and v.get("pass"))
        if not last.terminated:
            problems.append("not terminated by submit after %d steps (reason %s)" % (steps, last.info["reason"]))
        elif not passed and faults == 0:
            problems.append("the solution failed with no fault injected: %.300s" % json.dumps(last.obs))
        return {"episode_id": info["episode_id"], "task": task, "digest": obs.get("digest"), "by": "id" if by_id else "seed",
                "steps": steps, "pass": passed, "reward": last.reward, "faults": faults, "problems": problems}
    finally:
        env.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", required=True, help="the dataset's name on the stack (--tasks.datasets NAME=DIR)")
    ap.add_argument("--dir", required=True, help="the dataset's folder, where the solutions are read")
    ap.add_argument("--episodes", type=int, default=200)
    ap.add_argument("--workers", type=int, default=4, help="episodes in flight at once")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--profile", default="baseline", help="fault profile of every episode")
    args = ap.parse_args()
    ids = task_ids(args.dir)
    if not ids:
        sys.exit("%s holds no task folder" % args.dir)
    local = threading.local()

    def run(i):
        if not hasattr(local, "client"):
            local.client = g.Client()
        return play(local.client, args, ids, i)

    t0 = time.monotonic()
    bad = passed = steps = 0
    with concurrent.futures.ThreadPoolExecutor(args.workers) as pool:
        for r in pool.map(run, range(args.episodes)):
            print(json.dumps(r), flush=True)
            bad += bool(r["problems"])
            passed += r["pass"]
            steps += r["steps"]
    wall = time.monotonic() - t0
    print("summary: %d episodes, %d steps, %d passed, %d with problems, %.1f s (%.1f episodes/s)"
          % (args.episodes, steps, passed, bad, wall, args.episodes / wall), flush=True)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
