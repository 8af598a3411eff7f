"""Gymnasium-style envs over the env API."""

import enum
import json
import random
from typing import NamedTuple

from . import spaces
from .client import Client, EpisodeOverError, GauntletError, check_keys, error_for, step_body

try:
    import gymnasium as _gym

    _Base = _gym.Env
except ImportError:  # gymnasium is optional
    _Base = object

try:
    from gymnasium.vector import AutoresetMode
except ImportError:  # gymnasium is optional (and before 1.1 had no AutoresetMode)

    class AutoresetMode(enum.Enum):
        """When a vector env resets a sub-env whose episode ended (Gymnasium 1.1's
        gymnasium.vector.AutoresetMode, used instead when gymnasium is importable)."""

        NEXT_STEP = "NextStep"
        SAME_STEP = "SameStep"
        DISABLED = "Disabled"


def as_autoreset_mode(mode):
    """The AutoresetMode a member, its value ("NextStep") or its name ("next_step",
    "NEXT_STEP") stands for; another is a ValueError naming the modes."""
    if isinstance(mode, AutoresetMode):
        return mode
    for m in AutoresetMode:
        if isinstance(mode, str) and mode in (m.value, m.name, m.name.lower()):
            return m
    raise ValueError(f"autoreset_mode: {mode!r} is not one of {', '.join(m.name for m in AutoresetMode)}")


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
    not the policy, failed: mask them. action_space and observation_space are
    DescribeEnv's (spaces.ToolCall and spaces.JSONSchema), asked for on first use.
    """

    metadata = {"render_modes": []}

    def __init__(self, env="shop", url=None, token=None, client=None, params=None, profile="", max_steps=0, policy=""):
        self.client = client or Client(url, token)
        self.env_name = env
        self.defaults = {"params": params, "profile": profile, "max_steps": max_steps, "policy": policy}
        self.episode_id = None
        self.done = False
        self._spec = None
        self._action_space = None
        self._observation_space = None

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

    @property
    def action_space(self):
        """The env's action space (DescribeEnv's, asked for on first use): a
        spaces.ToolCall of its tools, whose sample() is a valid action for step() and
        whose contains() checks a tool call against the tool's argument schema."""
        if self._action_space is None:
            d = self.description
            a = d.get("actionSpace") or {}
            # A server without action_space: the same tools and the envs' args limit.
            self._action_space = spaces.ToolCall(a.get("tools") or d.get("tools", []),
                                                 int(a.get("maxArgsBytes", 64 << 10)))
        return self._action_space

    @action_space.setter
    def action_space(self, space):
        self._action_space = space

    @property
    def observation_space(self):
        """The env's observation space (DescribeEnv's): a spaces.JSONSchema of the decoded
        observation, a JSON object."""
        if self._observation_space is None:
            o = self.description.get("observationSpace") or {}
            self._observation_space = spaces.JSONSchema(o.get("schemaJson") or '{"type":"object"}')
        return self._observation_space

    @observation_space.setter
    def observation_space(self, space):
        self._observation_space = space

    def reset(self, seed=None, options=None):
        check_keys("options", options or {}, RESET_OPTIONS)
        self._close_episode()
        if _Base is not object:
            super().reset(seed=seed)  # seeds gymnasium's np_random, as its env checker expects
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


def _is_bool(x):
    """Whether x is a bool, Python's or numpy's (whose type is numpy.bool_, or numpy.bool
    from numpy 2), without importing numpy."""
    return isinstance(x, bool) or (type(x).__module__ == "numpy" and type(x).__name__ in ("bool_", "bool"))


class GauntletVectorEnv:
    """num_envs episodes stepped together with one batched call per step.

    reset(seed=None, options=None) -> (obs list, info list): every sub-env reset (an int
    seed seeds sub-env i with seed + i, a list gives each its own), or with
    options={"reset_mask": [bool per sub-env]} only those marked (the others' entries keep their last observation and an
    empty info). step(actions) -> (obs, rewards, terminated, truncated, infos) lists.

    autoreset_mode (metadata["autoreset_mode"], Gymnasium's AutoresetMode or its name)
    decides what happens to a sub-env whose episode ended:

    * DISABLED (the default): nothing; reset it with reset(options={"reset_mask": ...})
      or reset_at(i) before stepping it again (stepping it fails for that item);
    * NEXT_STEP (Gymnasium's default): the next step() resets it instead of stepping it:
      its action is ignored, and its entries are the new episode's first observation,
      reward 0.0, terminated and truncated False, and the reset's info;
    * SAME_STEP: the step() that ends it resets it at once: its entries are the ended
      step's reward, terminated and truncated, the new episode's first observation, and
      the reset's info with "final_obs" and "final_info", the ended step's observation and
      info.

    An episode the server reports over without ending it in a step (reaped, or lost to a
    restart: an EpisodeOverError item) counts as ended. A reset that fails in an autoreset
    leaves obs None and infos[i]["error"], and is retried on the next step().

    Pass None as a sub-env's action to skip it (its entries are then None, and a pending
    autoreset waits). An item that fails as a call has obs None and infos[i]["error"] set
    to the typed error. send(actions) / recv() are EnvPool's asynchronous pair: recv
    returns (index, StepOutcome) pairs as they complete; they never autoreset.

    Observations are JSON objects, not arrays, so results are lists and infos a list of
    per-sub-env dicts rather than Gymnasium's stacked arrays; single_action_space and
    single_observation_space are a sub-env's spaces, action_space and observation_space
    their Tuple of num_envs.
    """

    def __init__(self, num_envs, env="shop", url=None, token=None, client=None, autoreset_mode=AutoresetMode.DISABLED,
                 **defaults):
        if num_envs < 1:
            raise ValueError("num_envs: must be at least 1")
        self.autoreset_mode = as_autoreset_mode(autoreset_mode)
        self.metadata = {"autoreset_mode": self.autoreset_mode}
        self.client = client or Client(url, token)
        self.num_envs = num_envs
        self.envs = [GauntletEnv(env, client=self.client, **defaults) for _ in range(num_envs)]
        self.queue = "venv-%016x" % random.getrandbits(64)  # this vector env's own result queue
        self._sent = {}
        self._obs = [None] * num_envs
        # Sub-envs to reset before they are stepped again (NEXT_STEP, or a failed autoreset).
        self._autoreset = [False] * num_envs
        self._action_space = self._observation_space = None

    @property
    def single_action_space(self):
        """A sub-env's action space (GauntletEnv.action_space)."""
        return self.envs[0].action_space

    @property
    def single_observation_space(self):
        """A sub-env's observation space (GauntletEnv.observation_space)."""
        return self.envs[0].observation_space

    @property
    def action_space(self):
        """The batched action space: a Tuple of num_envs single action spaces."""
        if self._action_space is None:
            self._action_space = spaces.batch(self.single_action_space, self.num_envs)
        return self._action_space

    @property
    def observation_space(self):
        """The batched observation space: a Tuple of num_envs single observation spaces."""
        if self._observation_space is None:
            self._observation_space = spaces.batch(self.single_observation_space, self.num_envs)
        return self._observation_space

    def _mask(self, options):
        if not options or "reset_mask" not in options:
            return None, options
        options = dict(options)
        mask = options.pop("reset_mask")
        try:
            mask = [m for m in mask]
        except TypeError:
            raise ValueError("options: reset_mask must be a sequence of one bool per sub-env") from None
        if len(mask) != self.num_envs or not all(_is_bool(m) for m in mask):
            raise ValueError(f"options: reset_mask must hold {self.num_envs} bools, one per sub-env")
        if not any(mask):
            raise ValueError("options: reset_mask resets no sub-env")
        return [bool(m) for m in mask], options

    def reset(self, seed=None, options=None):
        mask, options = self._mask(options)
        if options:
            check_keys("options", options, RESET_OPTIONS)
        if seed is None or isinstance(seed, int):
            seeds = [None if seed is None else seed + i for i in range(self.num_envs)]
        else:
            seeds = list(seed)
            if len(seeds) != self.num_envs:
                raise ValueError(f"seed: {len(seeds)} seeds for {self.num_envs} envs")
        obs, infos = list(self._obs), [{} for _ in range(self.num_envs)]
        for i in range(self.num_envs):
            if mask is not None and not mask[i]:
                continue
            obs[i], infos[i] = self.reset_at(i, seed=seeds[i], options=options)
        return obs, infos

    def reset_at(self, i, seed=None, options=None):
        o, info = self.envs[i].reset(seed=seed, options=options)
        self._obs[i], self._autoreset[i] = o, False
        return o, info

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
            if isinstance(e, EpisodeOverError):
                self.envs[i].done = True
            return i, StepOutcome(None, 0.0, False, False, {"episode_id": result["episodeId"], "error": e})
        out = outcome(result)
        self.envs[i].done = out.terminated or out.truncated
        self._obs[i] = out.obs
        return i, out

    def _autoreset_at(self, i):
        """Resets sub-env i for an autoreset: (obs, info), or (None, {"error": e}) with
        the reset left pending when it fails."""
        try:
            o, info = self.reset_at(i)
        except GauntletError as e:
            self._autoreset[i] = True
            return None, {"error": e}
        return o, info

    def step(self, actions):
        if len(actions) != self.num_envs:
            raise ValueError(f"actions: {len(actions)} actions for {self.num_envs} envs")
        n = self.num_envs
        obs, rew, term, trunc, infos = [None] * n, [None] * n, [None] * n, [None] * n, [None] * n
        actions = list(actions)
        for i in range(n):
            if self._autoreset[i] and actions[i] is not None:
                actions[i] = None  # ignored: this step resets the sub-env instead
                obs[i], infos[i] = self._autoreset_at(i)
                rew[i], term[i], trunc[i] = 0.0, False, False
        bodies, index = self._bodies(actions)
        if not bodies:
            return obs, rew, term, trunc, infos
        results = self.client.step_batch(bodies, queue=self.queue).get("results", [])
        for r in results:
            i, out = self._take(index, r)
            obs[i], rew[i], term[i], trunc[i], infos[i] = out
            if not self.envs[i].done:
                continue
            if self.autoreset_mode == AutoresetMode.NEXT_STEP:
                self._autoreset[i] = True
            elif self.autoreset_mode == AutoresetMode.SAME_STEP:
                obs[i], info = self._autoreset_at(i)
                infos[i] = dict(info, final_obs=out.obs, final_info=out.info)
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


class GauntletAECEnv:
    """A world of several agents (docs/worlds.md, "Several agents"), PettingZoo-AEC-style,
    over one GauntletEnv episode.

    Agents take turns; agent_selection is the one whose turn it is. last() is what it
    sees: (observation, reward, termination, truncation, info), the observation being
    addressed to it alone (its answer, inbox and view), the reward that of its own last
    step. step(action) plays its action: {"tool": name, "args": {...}} or (tool, args),
    the tool named without its role (added here) or as "role:tool". rewards holds each
    agent's reward of its last step, cumulative_rewards their sums over the episode.
    """

    def __init__(self, env, url=None, token=None, client=None, params=None, profile="", max_steps=0, policy=""):
        self.env = GauntletEnv(env, url=url, token=token, client=client, params=params, profile=profile,
                               max_steps=max_steps, policy=policy)
        self.possible_agents = []
        self.agents = []
        self.agent_selection = None
        self._reset_state()

    def _reset_state(self):
        self.rewards, self.cumulative_rewards = {}, {}
        self.terminations, self.truncations, self.infos = {}, {}, {}
        self._obs = {}

    def reset(self, seed=None, options=None):
        obs, info = self.env.reset(seed=seed, options=options)
        if not isinstance(obs, dict) or "roles" not in obs or "agent" not in obs:
            raise ValueError(f"env {self.env.env_name} declares no roles: use GauntletEnv")
        self.possible_agents = list(obs["roles"])
        self.agents = list(self.possible_agents)
        self._reset_state()
        for a in self.agents:
            self.rewards[a], self.cumulative_rewards[a] = 0.0, 0.0
            self.terminations[a], self.truncations[a], self.infos[a] = False, False, dict(info)
        self.agent_selection = obs["agent"]
        self._obs[self.agent_selection] = obs

    def tools(self, agent):
        """The tools agent may call, named as step takes them (without the role)."""
        prefix = agent + ":"
        return [t[len(prefix):] for t in self.env.tools if t.startswith(prefix)]

    def observe(self, agent):
        """The last observation addressed to agent (None before its first turn)."""
        return self._obs.get(agent)

    def last(self):
        a = self.agent_selection
        return self._obs.get(a), self.rewards.get(a, 0.0), self.terminations.get(a, False), \
            self.truncations.get(a, False), self.infos.get(a, {})

    def step(self, action):
        tool, args, trainer = _action(action)
        agent = self.agent_selection
        if ":" not in tool:
            tool = agent + ":" + tool
        out = self.env.step({"tool": tool, "args": args, "trainer": trainer} if trainer else (tool, args))
        self.rewards[agent] = out.reward
        self.cumulative_rewards[agent] += out.reward
        self.infos[agent] = out.info
        if out.terminated or out.truncated:
            for a in self.agents:
                self.terminations[a], self.truncations[a] = out.terminated, out.truncated
        obs = out.obs
        if isinstance(obs, dict) and obs.get("agent") in self.possible_agents:
            self.agent_selection = obs["agent"]
            self._obs[self.agent_selection] = obs
        return out

    def close(self):
        self.env.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
