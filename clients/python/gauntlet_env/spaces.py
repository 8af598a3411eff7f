"""Gymnasium-shaped spaces of gauntlet's actions and observations.

An action is a tool call, ``{"tool": name, "args": {...}}``, whose arguments must be valid
under the tool's JSON Schema; an observation is a JSON object. Gymnasium has no space for
either (a ``Dict`` of a tool name and its arguments would sample arguments of one tool for
another), so this module defines two spaces with Gymnasium's API (``sample()``,
``contains()`` and ``in``, ``seed()``, ``np_random``-free), built from DescribeEnv:

* ``JSONSchema(schema)``: the JSON values valid under a JSON Schema (the observation
  space, and each tool's arguments);
* ``ToolCall(tools, max_args_bytes)``: the actions calling one of the tools with valid
  arguments (the action space).

When gymnasium is importable both subclass ``gymnasium.spaces.Space``, so
``gymnasium.utils.env_checker`` and wrappers accept them, and a vector env's batched space
is ``gymnasium.spaces.Tuple``; without it they stand alone and ``Tuple`` is this module's.

The JSON Schema subset understood is what the envs' schemas use and a little more: type
(one or a list), enum, const, properties, required, additionalProperties (a boolean or a
schema), items, minItems, maxItems, minLength, maxLength (in characters), minimum,
maximum, exclusiveMinimum, exclusiveMaximum. Other keywords are ignored by contains() and
sample(), as JSON Schema ignores keywords it does not know; the env still judges every
action, so an action this space accepts wrongly is answered as an invalid action, never
lost.
"""

import copy
import json
import math
import random

try:
    from gymnasium import spaces as _gspaces

    _Base = _gspaces.Space
except ImportError:  # gymnasium is optional
    _gspaces = None
    _Base = object

_ALNUM = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
# Unbounded sizes are sampled within these spans: a sample is an example, not a survey.
_SPAN_STR, _SPAN_ITEMS, _SPAN_NUM = 16, 3, 1000


class Space(_Base):
    """The base of gauntlet's spaces: seeding and sampling through one random.Random, so
    ``seed(n)`` makes every later ``sample()`` reproducible without numpy."""

    def __init__(self, seed=None):
        if _gspaces is not None:
            super().__init__(None, None, None)
        self._rng = random.Random()
        if seed is not None:
            self.seed(seed)

    def seed(self, seed=None):
        """Seeds the space's sampler and returns the seed used (a random one for None)."""
        if seed is None:
            seed = random.SystemRandom().getrandbits(63)
        self._rng = random.Random(seed)
        return seed

    @property
    def is_np_flattenable(self):
        return False

    def sample(self, mask=None, probability=None):
        if mask is not None or probability is not None:
            raise ValueError(f"{type(self).__name__}.sample: masks and probabilities are not supported")
        return self._sample()

    def contains(self, x):
        raise NotImplementedError

    def __contains__(self, x):
        return self.contains(x)

    def to_jsonable(self, sample_n):
        return list(sample_n)

    def from_jsonable(self, sample_n):
        return list(sample_n)


class JSONSchema(Space):
    """The JSON values (as ``json.loads`` returns them) valid under ``schema``, a dict or
    its JSON text."""

    def __init__(self, schema, seed=None):
        self.schema = json.loads(schema) if isinstance(schema, (str, bytes)) else schema
        if not isinstance(self.schema, (dict, bool)):
            raise ValueError(f"schema: want a JSON Schema object, got {type(self.schema).__name__}")
        super().__init__(seed)

    def contains(self, x):
        return _valid(x, self.schema)

    def _sample(self):
        return _gen(self.schema, self._rng)

    def __repr__(self):
        return f"JSONSchema({json.dumps(self.schema, sort_keys=True)})"

    def __eq__(self, other):
        return isinstance(other, JSONSchema) and self.schema == other.schema


class ToolCall(Space):
    """The actions calling one of ``tools`` (DescribeEnv's ToolSpec dicts: name,
    schemaJson, ...): ``{"tool": name, "args": {...}}`` with args valid under that tool's
    schema and, as JSON, at most ``max_args_bytes`` long. contains() also takes args as
    JSON text, a ``(tool, args)`` pair and a ``trainer`` key, as ``step`` does.
    ``names`` lists the tools in the env's order, ``args[name]`` is the JSONSchema space
    of a tool's arguments."""

    def __init__(self, tools, max_args_bytes=64 << 10, seed=None):
        if not tools:
            raise ValueError("tools: an action space needs at least one tool")
        self.tools = [dict(t) for t in tools]
        self.names = [t["name"] for t in self.tools]
        self.args = {t["name"]: JSONSchema(t.get("schemaJson") or t.get("schema_json") or "{}") for t in self.tools}
        self.max_args_bytes = int(max_args_bytes)
        super().__init__(seed)

    def contains(self, x):
        if isinstance(x, dict):
            if "tool" not in x or any(k not in ("tool", "args", "trainer") for k in x):
                return False
            tool, args = x["tool"], x.get("args", {})
        elif isinstance(x, (tuple, list)) and len(x) == 2:
            tool, args = x
        else:
            return False
        if not isinstance(tool, str) or tool not in self.args:
            return False
        if isinstance(args, (str, bytes)):
            raw = args.encode() if isinstance(args, str) else args
            try:
                args = json.loads(raw)
            except ValueError:
                return False
        else:
            try:
                raw = json.dumps(args).encode()
            except (TypeError, ValueError):
                return False
        return len(raw) <= self.max_args_bytes and self.args[tool].contains(args)

    def _sample(self):
        tool = self._rng.choice(self.names)
        return {"tool": tool, "args": _gen(self.args[tool].schema, self._rng)}

    def __repr__(self):
        return f"ToolCall({', '.join(self.names)})"

    def __eq__(self, other):
        return isinstance(other, ToolCall) and self.tools == other.tools and self.max_args_bytes == other.max_args_bytes


if _gspaces is not None:
    Tuple = _gspaces.Tuple
else:

    class Tuple(Space):
        """A fixed-length tuple of spaces (gymnasium.spaces.Tuple's shape): a vector env's
        batched space, one element per sub-env."""

        def __init__(self, spaces, seed=None):
            self.spaces = tuple(spaces)
            super().__init__(seed)

        def seed(self, seed=None):
            seed = super().seed(seed)
            for i, s in enumerate(self.spaces):
                s.seed(self._rng.getrandbits(63) if seed is not None else None)
            return seed

        def contains(self, x):
            if isinstance(x, list):
                x = tuple(x)
            return isinstance(x, tuple) and len(x) == len(self.spaces) and all(s.contains(v) for s, v in zip(self.spaces, x))

        def _sample(self):
            return tuple(s.sample() for s in self.spaces)

        def __len__(self):
            return len(self.spaces)

        def __getitem__(self, i):
            return self.spaces[i]

        def __repr__(self):
            return f"Tuple({', '.join(repr(s) for s in self.spaces)})"

        def __eq__(self, other):
            return isinstance(other, Tuple) and self.spaces == other.spaces


def batch(space, n):
    """A vector env's batched space of n sub-envs: a Tuple of n copies (what gymnasium's
    batch_space makes of a space it cannot stack into arrays), each seeded apart from a
    copy of space's generator, so sub-envs draw different samples and space's own draws
    are left as they were."""
    rng = copy.deepcopy(space._rng)
    copies = [copy.deepcopy(space) for _ in range(n)]
    for c in copies:
        c.seed(rng.getrandbits(63))
    return Tuple(copies)


def _is(x, t):
    if t == "object":
        return isinstance(x, dict) and all(isinstance(k, str) for k in x)
    if t == "array":
        return isinstance(x, (list, tuple))
    if t == "string":
        return isinstance(x, str)
    if t == "boolean":
        return isinstance(x, bool)
    if t == "null":
        return x is None
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    if isinstance(x, float) and not math.isfinite(x):
        return False
    if t == "number":
        return True
    if t == "integer":  # 2.0 is an integer, as in JSON Schema
        return isinstance(x, int) or x.is_integer()
    return False


def _equal(a, b):
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


def _valid(x, s):
    if s is True or s == {}:
        return True
    if s is False or not isinstance(s, dict):
        return False
    t = s.get("type")
    if t is not None and not any(_is(x, one) for one in (t if isinstance(t, list) else [t])):
        return False
    if "enum" in s and not any(_equal(x, e) for e in s["enum"]):
        return False
    if "const" in s and not _equal(x, s["const"]):
        return False
    if _is(x, "number"):
        if "minimum" in s and x < s["minimum"] or "maximum" in s and x > s["maximum"]:
            return False
        if "exclusiveMinimum" in s and x <= s["exclusiveMinimum"] or "exclusiveMaximum" in s and x >= s["exclusiveMaximum"]:
            return False
    if isinstance(x, str):
        if len(x) < s.get("minLength", 0) or "maxLength" in s and len(x) > s["maxLength"]:
            return False
    if isinstance(x, (list, tuple)):
        if len(x) < s.get("minItems", 0) or "maxItems" in s and len(x) > s["maxItems"]:
            return False
        if "items" in s and not all(_valid(v, s["items"]) for v in x):
            return False
    if isinstance(x, dict):
        props = s.get("properties", {})
        if any(k not in x for k in s.get("required", [])):
            return False
        extra = s.get("additionalProperties", True)
        for k, v in x.items():
            if k in props:
                if not _valid(v, props[k]):
                    return False
            elif not _valid(v, extra):
                return False
    return True


def _gen(s, rng):
    """A value valid under schema s, drawn with rng."""
    if s is True or not isinstance(s, dict):
        return None
    if "const" in s:
        return copy.deepcopy(s["const"])
    if "enum" in s:
        return copy.deepcopy(rng.choice(s["enum"]))
    t = s.get("type")
    if isinstance(t, list):
        t = rng.choice(t)
    if t is None:
        t = "object" if "properties" in s else "null"
    if t == "object":
        out = {}
        required = s.get("required", [])
        for k, sub in s.get("properties", {}).items():
            if k in required or rng.random() < 0.5:
                out[k] = _gen(sub, rng)
        for k in required:
            if k not in out:
                out[k] = _gen(s.get("additionalProperties", True), rng)
        return out
    if t == "array":
        lo = s.get("minItems", 0)
        hi = min(s.get("maxItems", lo + _SPAN_ITEMS), lo + _SPAN_ITEMS)
        return [_gen(s.get("items", True), rng) for _ in range(rng.randint(lo, max(lo, hi)))]
    if t == "string":
        lo = s.get("minLength", 0)
        hi = min(s.get("maxLength", lo + _SPAN_STR), lo + _SPAN_STR)
        return "".join(rng.choice(_ALNUM) for _ in range(rng.randint(lo, max(lo, hi))))
    if t == "boolean":
        return rng.random() < 0.5
    if t == "integer":
        lo, hi = _bounds(s)
        lo, hi = math.ceil(lo), math.floor(hi)
        if "exclusiveMinimum" in s and lo <= s["exclusiveMinimum"]:
            lo = math.floor(s["exclusiveMinimum"]) + 1
        if "exclusiveMaximum" in s and hi >= s["exclusiveMaximum"]:
            hi = math.ceil(s["exclusiveMaximum"]) - 1
        return rng.randint(lo, max(lo, hi))
    if t == "number":
        lo, hi = _bounds(s)
        x = rng.uniform(lo, hi)
        if "exclusiveMinimum" in s and x <= s["exclusiveMinimum"] or "exclusiveMaximum" in s and x >= s["exclusiveMaximum"]:
            x = (lo + hi) / 2
        return x
    return None


def _bounds(s):
    lo = s.get("minimum", s.get("exclusiveMinimum"))
    hi = s.get("maximum", s.get("exclusiveMaximum"))
    if lo is None and hi is None:
        return -_SPAN_NUM, _SPAN_NUM
    if lo is None:
        return hi - _SPAN_NUM, hi
    if hi is None:
        return lo, lo + _SPAN_NUM
    return lo, hi
