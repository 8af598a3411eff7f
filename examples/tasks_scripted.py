#!/usr/bin/env python3
"""Task episodes over gauntlet's env API with a scripted policy, through the Python client.

Each episode of env `tasks` resets on a dataset the stack plays (by the task's id for odd
episodes, by the seed for even ones), checks the first observation holds the task's
instruction, then plays three steps: a look around (`shell.exec ls`), the task folder's
solution/solve.sh (`gauntlet_env.tasks.solution_action`, what the oracle runs) and
`submit`, whose observation is the verifier's verdict. With `--policy mixed` every third
episode is a no-op instead (the look around, then `submit`), which must fail. `--glob`
limits the tasks (gauntlet's `glob` filter: `*` does not cross a `/`). Episodes run on
several threads, each with its own connection. One JSON line per episode goes to stdout,
then a summary.

    GAUNTLET_URL=http://127.0.0.1:9470 GAUNTLET_TOKEN=$(cat .gauntlet/envapi-token) \\
        python3 examples/tasks_scripted.py --dataset gauntlet --dir datasets/gauntlet --episodes 200

It exits non-zero when an episode's first observation is not its task's, when the
solution fails where no fault was injected (a failure under a fault is the fault's doing),
or when a no-op passes.
"""

import argparse
import concurrent.futures
import json
import os
import re
import sys
import threading
import tomllib
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients", "python"))

import gauntlet_env as g  # noqa: E402
from gauntlet_env import tasks as gt  # noqa: E402


def glob_re(pattern):
    """pattern as Go's path.Match reads it (`*` and `?` within one path segment), for
    the patterns this script is given: a bracket class is refused rather than guessed."""
    if "[" in pattern or "\\" in pattern:
        sys.exit("--glob %r: only * and ? are supported here" % pattern)
    return re.compile("".join("[^/]*" if c == "*" else "[^/]" if c == "?" else re.escape(c) for c in pattern) + r"\Z")


def task_ids(root, globs=()):
    """The tasks a seed draws from, sorted as gauntlet sorts them: folders holding
    task.toml, relative to root, hidden folders skipped, and canaries (unsolvable tasks
    marked `canary = true` in [metadata]) left out, as gauntlet's draws leave them out;
    with globs, only the tasks one of them matches."""
    res = [glob_re(g) for g in globs]
    out = []
    for d, subdirs, files in os.walk(root):
        subdirs[:] = sorted(s for s in subdirs if not s.startswith("."))
        if "task.toml" in files:
            with open(os.path.join(d, "task.toml"), "rb") as f:
                if tomllib.load(f).get("metadata", {}).get("canary") is True:
                    subdirs[:] = []
                    continue
            rel = os.path.relpath(d, root).replace(os.sep, "/")
            if not res or any(r.match(rel) for r in res):
                out.append(rel)
            subdirs[:] = []
    return sorted(out)


def play(client, args, ids, i):
    by_id = i % 2 == 1
    noop = args.policy == "mixed" and i % 3 == 2
    params = gt.task_params(args.dataset, task=ids[(i * 7) % len(ids)] if by_id else "", glob=None if by_id else args.glob)
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
        look = {"tool": "shell.exec", "args": {"command": "ls"}}
        actions = (look, gt.SUBMIT) if noop else (look, gt.solution_action(os.path.join(args.dir, task), obs.get("workdir") or gt.WORKDIR), gt.SUBMIT)
        for action in actions:
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
        elif noop and passed:
            problems.append("a no-op passed: %.300s" % json.dumps(last.obs))
        elif not noop and not passed and faults == 0:
            problems.append("the solution failed with no fault injected: %.300s" % json.dumps(last.obs))
        return {"episode_id": info["episode_id"], "task": task, "digest": obs.get("digest"), "by": "id" if by_id else "seed",
                "policy": "noop" if noop else "solve", "steps": steps, "pass": passed, "reward": last.reward, "faults": faults, "problems": problems}
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
    ap.add_argument("--policy", choices=("solve", "mixed"), default="solve",
                    help="solve: every episode runs the task's solution; mixed: every third one is a no-op, which must fail")
    ap.add_argument("--glob", action="append", default=[], help="play only the tasks this pattern matches (repeatable)")
    ap.add_argument("--timeout", type=float, default=60.0,
                    help="seconds a call may take; a reset builds its task's image the first time (minutes with apt-get)")
    args = ap.parse_args()
    ids = task_ids(args.dir, args.glob)
    if not ids:
        sys.exit("%s holds no task folder%s" % (args.dir, " matching %s" % args.glob if args.glob else ""))
    local = threading.local()

    def run(i):
        if not hasattr(local, "client"):
            local.client = g.Client(timeout=args.timeout)
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
