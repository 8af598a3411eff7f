"""Gymnasium-style envs over the env API."""

import json
import random
from typing import NamedTuple

from .client import Client, EpisodeOverError, check_keys, error_for, step_body

try:
    import gymnasium as _gym

    _Base = _gym.Env
except ImportError:  # gymnasium is optional
    _Base = object


class StepOutcome(NamedTuple):
    """One step's five-tuple."""

    obs: object
    reward: float
    terminated: bool
    truncated: bool
    info: dict


def _obs(s):
    try:
        return json.loads(s) if s else None
    except ValueError:
        return s


ACTION_KEYS = ("tool", "args", "trainer")
RESET_OPTIONS = ("params", "profile", "max_steps", "policy")


def _action(action):
    """(tool, args, trainer) from an action: {"tool": ..., "args": {...} or "json",
    "trainer": {...}} or a (tool, args) pair."""
    if isinstance(action, dict):
        if "tool" not in action:
            raise ValueError("action: a dict needs a 'tool' key")
        check_keys("action", action, ACTION_KEYS)
        return action["tool"], action.get("args", {}), action.get("trainer")
    if isinstance(action, (tuple, list)) and len(action) == 2:
        return action[0], action[1], None
    raise ValueError("action: want {'tool': ..., 'args': ...} or (tool, args)")


def outcome(result):
    """The five-tuple of a StepResult (JSON). info carries: episode_id, step, reason,
    reward_components (name -> value), faults, signals, metering, infra_error, error."""
    info = result.get("info", {}) or {}
    comps = {c.get("name"): c.get("value", 0.0) for c in result.get("rewardComponents", [])}
    reason = result.get("reason", "TERMINATION_REASON_UNSPECIFIED")
    return StepOutcome(
        _obs(result.get("observationJson")),
        float(result.get("reward", 0.0)),
        bool(result.get("terminated", False)),
        bool(result.get("truncated", False)),
        {
            "episode_id": result.get("episodeId"),
            "step": int(result.get("step", 0)),
            "reason": reason.replace("TERMINATION_REASON_", "").lower(),
            "reward_components": comps,
            "faults": info.get("faults", []),
            "signals": info.get("signals", {}),
            "metering": info.get("metering", {}),
            "infra_error": bool(info.get("infraError", False)),
            "error": info.get("error", ""),
        },
    )


class GauntletEnv(_Base):
    """One gauntlet episode at a time, Gymnasium-style.

    reset(seed=None, options=None) -> (obs, info): options may hold params (dict),
    profile, max_steps, policy (another key is a ValueError). A live episode is closed first (no auto-reset: after
    terminated or truncated, step raises EpisodeOverError until reset).
    step(action) -> (obs, reward, terminated, truncated, info); action is
    {"tool": name, "args": dict, "trainer": {...}} or (tool, args).
    Observations are the env's JSON, decoded. info["infra_error"] marks steps gauntlet,
    not the policy, failed: mask them.
    """

    metadata = {"render_modes": []}

    def __init__(self, env="shop", url=None, token=None, client=None, params=None, profile="", max_steps=0, policy=""):
        self.client = client or Client(url, token)
        self.env_name = env
        self.defaults = {"params": params, "profile": profile, "max_steps": max_steps, "policy": policy}
        self.episode_id = None
        self.done = False
        self._spec = None

    @property
    def description(self):
        """DescribeEnv: tools (with JSON schemas), params, reward components."""
        if self._spec is None:
            self._spec = self.client.describe_env(self.env_name)
        return self._spec

    @property
    def tools(self):
        """Tool names of the action space."""
        return [t["name"] for t in self.description.get("tools", [])]

    def reset(self, seed=None, options=None):
        check_keys("options", options or {}, RESET_OPTIONS)
        self._close_episode()
        o = dict(self.defaults)
        o.update(options or {})
        if seed is None:
            seed = random.getrandbits(63)
        r = self.client.reset(self.env_name, seed=seed, params=o.get("params"), profile=o.get("profile", ""),
                              max_steps=o.get("max_steps", 0), policy=o.get("policy", ""))
        self.episode_id, self.done = r["episodeId"], False
        info = dict(r.get("info", {}))
        info["episode_id"] = self.episode_id
        return _obs(r.get("observationJson")), info

    def step(self, action):
        if self.episode_id is None:
            raise EpisodeOverError("failed_precondition", "step before reset")
        tool, args, trainer = _action(action)
        out = outcome(self.client.step(self.episode_id, tool, args, trainer))
        self.done = out.terminated or out.truncated
        return out

    def snapshot(self):
        """Records the episode's point; fork(snapshot_id) continues from it in a new env."""
        return self.client.snapshot(self.episode_id)["snapshotId"]

    def fork(self, snapshot_id):
        """Makes this env continue from a snapshot (a new episode replayed to that point)."""
        self._close_episode()
        r = self.client.fork(snapshot_id)
        self.episode_id, self.done = r["episodeId"], False
        return _obs(r.get("observationJson")), dict(r.get("info", {}))

    def _close_episode(self):
        if self.episode_id is not None:
            self.client.close_episode(self.episode_id)
            self.episode_id = None

    def close(self):
        """Closes the episode (idempotent)."""
        self._close_episode()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class GauntletVectorEnv:
    """num_envs episodes stepped together with one batched call per step.

    reset(seed=None, options=None) -> (obs list, info list), every sub-env reset.
    step(actions) -> (obs, rewards, terminated, truncated, infos) lists; a sub-env that is
    done must be reset with reset_at(i) before it is stepped again (no auto-reset); pass
    None as its action to skip it (its entries are then None). An item that fails as a
    call has obs None and infos[i]["error"] set to the typed error. send(actions) / recv()
    are EnvPool's asynchronous pair: recv returns (index, StepOutcome) pairs as they
    complete.
    """

    def __init__(self, num_envs, env="shop", url=None, token=None, client=None, **defaults):
        if num_envs < 1:
            raise ValueError("num_envs: must be at least 1")
        self.client = client or Client(url, token)
        self.num_envs = num_envs
        self.envs = [GauntletEnv(env, client=self.client, **defaults) for _ in range(num_envs)]
        self.queue = "venv-%016x" % random.getrandbits(64)  # this vector env's own result queue
        self._sent = {}

    def reset(self, seed=None, options=None):
        obs, infos = [], []
        for i, e in enumerate(self.envs):
            o, info = e.reset(seed=None if seed is None else seed + i, options=options)
            obs.append(o)
            infos.append(info)
        return obs, infos

    def reset_at(self, i, seed=None, options=None):
        return self.envs[i].reset(seed=seed, options=options)

    def _bodies(self, actions):
        if len(actions) != self.num_envs:
            raise ValueError(f"actions: {len(actions)} actions for {self.num_envs} envs")
        bodies, index = [], {}
        for i, a in enumerate(actions):
            if a is None:
                continue
            e = self.envs[i]
            if e.episode_id is None:
                raise EpisodeOverError("failed_precondition", f"env {i}: step before reset")
            tool, args, trainer = _action(a)
            bodies.append(step_body(e.episode_id, tool, args, trainer))
            index[e.episode_id] = i
        return bodies, index

    def _take(self, index, result):
        if result.get("episodeId") not in index:
            raise error_for("internal", f"a result for episode {result.get('episodeId')!r}, not one of this vector env's")
        i = index[result["episodeId"]]
        err = result.get("error")
        if err:
            # This item failed as a call (e.g. its episode is over): the others stand.
            e = error_for(err.get("code", "unknown"), err.get("message", ""))
            return i, StepOutcome(None, 0.0, False, False, {"episode_id": result["episodeId"], "error": e})
        out = outcome(result)
        self.envs[i].done = out.terminated or out.truncated
        return i, out

    def step(self, actions):
        bodies, index = self._bodies(actions)
        n = self.num_envs
        obs, rew, term, trunc, infos = [None] * n, [None] * n, [None] * n, [None] * n, [None] * n
        if not bodies:
            return obs, rew, term, trunc, infos
        results = self.client.step_batch(bodies, queue=self.queue).get("results", [])
        for r in results:
            i, out = self._take(index, r)
            obs[i], rew[i], term[i], trunc[i], infos[i] = out
        return obs, rew, term, trunc, infos

    def send(self, actions):
        bodies, index = self._bodies(actions)
        self._sent.update(index)
        if bodies:
            self.client.send(bodies, queue=self.queue)
        return len(bodies)

    def recv(self, min_results=1, max_results=0, timeout_ms=0):
        r = self.client.recv(min_results, max_results, timeout_ms, queue=self.queue)
        out = []
        for res in r.get("results", []):
            i, o = self._take(self._sent, res)
            out.append((i, o))
        return out

    def close(self):
        for e in self.envs:
            e.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
