"""gauntlet_env: a standard-library-only Python client for gauntlet's env API.

It speaks the Connect protocol's HTTP/JSON (one POST per call) to the envapi module of
`gauntlet up` and offers:

* ``Client``: every RPC of ``gauntlet.v1.EnvService`` as a method returning decoded JSON;
* ``GauntletEnv``: a Gymnasium-style env, ``reset(seed=, options=) -> (obs, info)`` and
  ``step(action) -> (obs, reward, terminated, truncated, info)``, usable as a context
  manager;
* ``GauntletVectorEnv``: many episodes stepped together over the batched RPCs
  (StepBatch, and EnvPool-style ``send`` / ``recv``), with Gymnasium's autoreset modes
  (``AutoresetMode``: NEXT_STEP, SAME_STEP, DISABLED, the default);
* ``GauntletAECEnv``: a world of several agents (roles taking turns), PettingZoo-AEC-style:
  ``agent_selection``, ``last()``, ``step(action)`` as the selected agent, each agent's
  ``rewards`` and ``cumulative_rewards``;
* ``action_space`` and ``observation_space`` from DescribeEnv: ``ToolCall`` (a tool and
  its arguments, valid under the tool's JSON Schema) and ``JSONSchema`` (a JSON object),
  with Gymnasium's ``sample()``, ``contains()`` and ``seed()`` (module ``spaces``);
* typed errors (``GauntletError`` and its subclasses), one per API error code;
* module ``tasks``: helpers for episodes of the ``tasks`` env (Harbor-format task
  folders): its params, a task folder's solution as an action, the verifier's verdict.

Semantics (no auto-reset on the server, terminated vs truncated, infra errors to mask) are in
docs/envapi.md. When gymnasium is importable, ``GauntletEnv`` subclasses ``gymnasium.Env``
and ``gauntlet/Shop-v0`` is registered.
"""

from .client import (
    AuthError,
    Client,
    ConflictError,
    EpisodeOverError,
    GauntletError,
    InfraError,
    InvalidArgumentError,
    NotFoundError,
    QuotaError,
    ServerRestartedError,
)
from .env import AutoresetMode, GauntletAECEnv, GauntletEnv, GauntletVectorEnv, StepOutcome
from .spaces import JSONSchema, ToolCall

__all__ = [
    "AuthError",
    "AutoresetMode",
    "Client",
    "ConflictError",
    "EpisodeOverError",
    "GauntletAECEnv",
    "GauntletEnv",
    "GauntletError",
    "GauntletVectorEnv",
    "InfraError",
    "InvalidArgumentError",
    "JSONSchema",
    "NotFoundError",
    "QuotaError",
    "ServerRestartedError",
    "StepOutcome",
    "ToolCall",
]

try:  # optional: register with gymnasium when it is installed
    import gymnasium as _gym

    try:
        _gym.register(id="gauntlet/Shop-v0", entry_point="gauntlet_env.env:GauntletEnv", kwargs={"env": "shop"})
    except Exception:  # already registered (module reloaded)
        pass
except ImportError:
    pass
