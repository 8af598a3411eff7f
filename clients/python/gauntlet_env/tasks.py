"""Helpers for episodes of gauntlet's ``tasks`` env (Harbor-format task folders).

An episode of env ``tasks`` names a dataset the stack plays (``gauntlet up
--tasks.datasets NAME=DIR``) and picks a task by id or by the reset's seed::

    env = GauntletEnv("tasks", params=task_params("gauntlet", task="codefix/sum"))
    obs, info = env.reset(seed=3)           # obs["instruction"], obs["task"], obs["digest"]
    env.step({"tool": "shell.exec", "args": {"command": "ls"}})
    obs, reward, terminated, truncated, info = env.step(SUBMIT)   # obs is the verdict

``solution_action`` is the action that runs a task folder's ``solution/solve.sh`` in the
episode, as gauntlet's ``oracle`` policy does: a scripted policy for vetting a pipeline
from Python when the task folders are at hand.
"""

import base64
import io
import os
import tarfile

try:
    import tomllib
except ImportError:  # Python < 3.11: no [solution].env
    tomllib = None

#: The action that ends a task episode; the verifier's verdict is its observation.
SUBMIT = {"tool": "submit", "args": {}}

#: Where the agent works in a task's sandbox when its image names no WORKDIR; the reset's
#: observation says where it works (``obs["workdir"]``).
WORKDIR = "/app"


def task_params(dataset, task="", tags=None, difficulty=None, glob=None, **more):
    """The ``tasks`` env's params: a dataset by its name on the stack, and either one task
    by id or filters the reset's seed picks among (tags: all of them; difficulty, glob:
    any of them). ``more`` adds other params (max_invalid, deadline_ms)."""
    p = {"dataset": dataset}
    if task:
        p["task"] = task
    for k, v in (("tags", tags), ("difficulty", difficulty), ("glob", glob)):
        if v:
            p[k] = [v] if isinstance(v, str) else list(v)
    p.update(more)
    return p


def _quote(s):
    return "'" + s.replace("'", "'\\''") + "'"


def solution_action(task_dir, workdir=WORKDIR):
    """The shell.exec action that runs ``task_dir/solution/solve.sh`` in the episode's
    sandbox: solution/ goes to /solution as a tar stream on the command's stdin, solve.sh
    runs in workdir (the reset observation's ``workdir``: the image's WORKDIR, else /app)
    with the task's [solution].env, and /solution is emptied again."""
    sol = os.path.join(task_dir, "solution")
    if not os.path.isfile(os.path.join(sol, "solve.sh")):
        raise ValueError("%s: no solution/solve.sh" % task_dir)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(os.listdir(sol)):
            tar.add(os.path.join(sol, name), arcname=name)
    env = {}
    cfg = os.path.join(task_dir, "task.toml")
    if tomllib is not None and os.path.isfile(cfg):
        with open(cfg, "rb") as f:
            env = (tomllib.load(f).get("solution") or {}).get("env") or {}
    cmd = "set -e; mkdir -p /workspace/solution; base64 -d | tar -x -f - -C /solution; set +e\n"
    for k in sorted(env):
        cmd += "export %s\n" % _quote("%s=%s" % (k, env[k]))
    cmd += "bash /solution/solve.sh; rc=$?; rm -rf /solution/* /solution/.[!.]* 2>/dev/null; exit $rc\n"
    return {"tool": "shell.exec", "args": {"command": cmd, "dir": workdir,
                                           "stdin": base64.b64encode(buf.getvalue()).decode("ascii")}}


def verdict(obs):
    """The verifier's verdict in a last observation ({"pass", "rewards", "exit_code",
    "output"}), also when a truncation wraps it ({"last", "verdict"}); None if it holds
    none."""
    if not isinstance(obs, dict):
        return None
    if "verdict" in obs:
        return obs["verdict"]
    return obs if "pass" in obs else None
