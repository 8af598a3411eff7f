"""The env API over Connect's HTTP/JSON, with typed errors."""

import http.client
import json
import os
import threading
import urllib.parse

SERVICE = "/gauntlet.v1.EnvService/"


class GauntletError(Exception):
    """An error the env API returned: ``code`` is the Connect/gRPC code name
    (``not_found``, ``invalid_argument``...), ``status`` the HTTP status."""

    def __init__(self, code, message, status=0, retry_after=None, reason=None):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.status = status
        self.retry_after = retry_after
        # The reason of the error's google.rpc.ErrorInfo detail, when it has one
        # (SERVER_RESTARTED), else None.
        self.reason = reason


class AuthError(GauntletError):
    """401: no token, or one the server does not know."""


class NotFoundError(GauntletError):
    """404: no such episode, env or snapshot for this tenant (others' are invisible)."""


class QuotaError(GauntletError):
    """429: the tenant's (or the server's) episode cap; retry after ``retry_after`` s."""


class InvalidArgumentError(GauntletError):
    """400: a malformed request; the message names the field."""


class EpisodeOverError(GauntletError):
    """The episode ended (terminated, truncated, closed or reaped): call reset()."""


class ServerRestartedError(EpisodeOverError):
    """The episode was live before the env API restarted and did not survive it
    (failed_precondition, reason SERVER_RESTARTED): call reset(). A subclass of
    EpisodeOverError, so code that resets on any ended episode keeps working."""


SERVER_RESTARTED = "SERVER_RESTARTED"
# How the message of such an error begins; batch items carry no details, only this.
SERVER_RESTARTED_MESSAGE = "episode over: the server restarted"


class ConflictError(GauntletError):
    """409: a step of the same episode is already in flight."""


class InfraError(GauntletError):
    """gauntlet itself failed (unavailable, internal, timeout): not the policy's fault."""


_BY_CODE = {
    "unauthenticated": AuthError,
    "permission_denied": AuthError,
    "not_found": NotFoundError,
    "resource_exhausted": QuotaError,
    "invalid_argument": InvalidArgumentError,
    "out_of_range": InvalidArgumentError,
    "failed_precondition": EpisodeOverError,
    "aborted": ConflictError,
    "unavailable": InfraError,
    "internal": InfraError,
    "deadline_exceeded": InfraError,
    "unknown": InfraError,
}


def error_for(code, message, status=0, retry_after=None, reason=None):
    """The typed error of an API error code (and ErrorInfo reason, if any)."""
    if code == "failed_precondition" and (reason == SERVER_RESTARTED or message.startswith(SERVER_RESTARTED_MESSAGE)):
        return ServerRestartedError(code, message, status, retry_after, SERVER_RESTARTED)
    return _BY_CODE.get(code, GauntletError)(code, message, status, retry_after, reason)


def _reason(reply):
    """The reason of the first google.rpc.ErrorInfo among a Connect error's details
    (their "debug" form, which the server adds), or None."""
    for d in reply.get("details") or []:
        if isinstance(d, dict) and d.get("type") == "google.rpc.ErrorInfo":
            return (d.get("debug") or {}).get("reason")
    return None


class Client:
    """A connection to the env API. ``url`` and ``token`` default to the environment
    variables GAUNTLET_URL (else http://127.0.0.1:9470) and GAUNTLET_TOKEN. Safe to share
    between threads: each thread keeps its own keep-alive connection."""

    def __init__(self, url=None, token=None, timeout=60.0):
        url = url or os.environ.get("GAUNTLET_URL", "http://127.0.0.1:9470")
        u = urllib.parse.urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"url: {url!r} is not an http(s) URL")
        self.url = url
        self._https = u.scheme == "https"
        self._host = u.hostname
        self._port = u.port or (443 if self._https else 80)
        self._prefix = u.path.rstrip("/")
        self.token = token if token is not None else os.environ.get("GAUNTLET_TOKEN", "")
        self.timeout = timeout
        self._local = threading.local()

    def _conn(self):
        c = getattr(self._local, "conn", None)
        if c is None:
            cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            c = cls(self._host, self._port, timeout=self.timeout)
            self._local.conn = c
        return c

    def _drop(self):
        c = getattr(self._local, "conn", None)
        if c is not None:
            c.close()
            self._local.conn = None

    def call(self, method, body=None):
        """Calls one RPC with a JSON body (a dict) and returns the decoded reply; raises a
        GauntletError subclass on an API error."""
        data = json.dumps(body or {}).encode()
        headers = {"Content-Type": "application/json", "Connect-Protocol-Version": "1"}
        if self.token:
            headers["Authorization"] = "Bearer " + self.token
        path = self._prefix + SERVICE + method
        for attempt in range(2):
            conn = self._conn()
            try:
                conn.request("POST", path, body=data, headers=headers)
            except (ConnectionError, http.client.HTTPException, OSError):
                # A stale keep-alive connection fails before the request is sent: the
                # server saw nothing, so sending again is safe.
                self._drop()
                if attempt == 1:
                    raise
                continue
            try:
                resp = conn.getresponse()
                raw = resp.read()
            except (ConnectionError, http.client.HTTPException, OSError) as e:
                self._drop()
                raise InfraError("unavailable", f"{method}: connection lost before the reply: {e}") from e
            break
        try:
            reply = json.loads(raw) if raw else {}
        except ValueError:
            reply = {"code": "unknown", "message": raw[:200].decode("utf-8", "replace")}
        if resp.status != 200:
            retry = resp.getheader("Retry-After")
            raise error_for(reply.get("code", "unknown"), reply.get("message", f"HTTP {resp.status}"),
                            resp.status, float(retry) if retry else None, _reason(reply))
        return reply

    def close(self):
        """Closes this thread's connection."""
        self._drop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # One method per RPC; bodies use the proto's JSON names.
    def list_envs(self):
        return self.call("ListEnvs").get("envs", [])

    def describe_env(self, env):
        return self.call("DescribeEnv", {"env": env})

    def reset(self, env, seed=0, params=None, profile="", max_steps=0, policy=""):
        body = {"env": env, "seed": str(int(seed)), "profile": profile, "maxSteps": int(max_steps), "policy": policy}
        if params is not None:
            body["paramsJson"] = params if isinstance(params, str) else json.dumps(params)
        return self.call("Reset", body)

    def step(self, episode_id, tool, args=None, trainer=None):
        return self.call("Step", step_body(episode_id, tool, args, trainer))

    def close_episode(self, episode_id):
        return self.call("Close", {"episodeId": episode_id})

    def snapshot(self, episode_id):
        return self.call("Snapshot", {"episodeId": episode_id})

    def fork(self, snapshot_id):
        return self.call("Fork", {"snapshotId": snapshot_id})

    # queue names the caller's result queue: results a batch call does not return wait
    # there for recv with the same queue. Use one per trainer process or vector env.
    def step_batch(self, steps, min_results=0, timeout_ms=0, queue=""):
        return self.call("StepBatch", {"steps": steps, "minResults": min_results, "timeoutMs": timeout_ms, "queue": queue})

    def send(self, steps, queue=""):
        return self.call("Send", {"steps": steps, "queue": queue})

    def recv(self, min_results=1, max_results=0, timeout_ms=0, queue=""):
        return self.call("Recv", {"minResults": min_results, "maxResults": max_results, "timeoutMs": timeout_ms,
                                  "queue": queue})

    def health(self):
        return self.call("Health")

    def capacity(self):
        return self.call("Capacity")


TRAINER_KEYS = ("prompt_token_ids", "completion_token_ids", "logprobs", "policy_version")


def check_keys(what, d, known):
    """Raises ValueError naming the keys of dict d that are not in known: a misspelled
    key would otherwise be dropped in silence (a profile not applied, token data not
    stored)."""
    unknown = sorted(k for k in d if k not in known)
    if unknown:
        raise ValueError(f"{what}: unknown key{'s' if len(unknown) > 1 else ''} "
                         f"{', '.join(repr(k) for k in unknown)}; known: {', '.join(sorted(known))}")


def step_body(episode_id, tool, args=None, trainer=None):
    """The JSON of one StepRequest. args: a dict (encoded) or a JSON string (sent as is,
    so malformed args reach the env, which answers with an invalid-action observation).
    trainer: optional dict with prompt_token_ids, completion_token_ids, logprobs (one per
    completion token, or none), policy_version; another key is a ValueError."""
    if args is None:
        args = {}
    body = {"episodeId": episode_id, "action": {"tool": tool, "argsJson": args if isinstance(args, str) else json.dumps(args)}}
    if trainer:
        check_keys("trainer", trainer, TRAINER_KEYS)
        body["trainer"] = {
            "promptTokenIds": list(trainer.get("prompt_token_ids", [])),
            "completionTokenIds": list(trainer.get("completion_token_ids", [])),
            "logprobs": list(trainer.get("logprobs", [])),
            "policyVersion": str(trainer.get("policy_version", "")),
        }
    return body
