"""Tests of what gauntlet_env refuses before it sends anything: keys it does not know in
reset options, actions and trainer data. A misspelled key used to be dropped in silence
(a profile not applied, token data not stored); now it is a ValueError naming it. These
need no server: each call fails before a request is made."""

import unittest

import gauntlet_env as g
from gauntlet_env.client import step_body

# Nothing listens here; a test that reached the network would fail with InfraError.
NOWHERE = "http://127.0.0.1:9"


class ArgumentsTest(unittest.TestCase):
    def test_reset_refuses_unknown_option_keys(self):
        env = g.GauntletEnv("shop", url=NOWHERE, token="t")
        with self.assertRaises(ValueError) as cm:
            env.reset(seed=1, options={"profle": "stress", "max_steps": 3})
        msg = str(cm.exception)
        self.assertIn("'profle'", msg)
        self.assertIn("profile", msg)  # the known keys are listed
        venv = g.GauntletVectorEnv(2, "shop", url=NOWHERE, token="t")
        with self.assertRaises(ValueError):
            venv.reset(seed=1, options={"maxsteps": 3})

    def test_step_refuses_unknown_trainer_keys(self):
        with self.assertRaises(ValueError) as cm:
            step_body("e", "catalog.search", {}, {"completion_ids": [1, 2], "logprobs": [-0.1, -0.2]})
        self.assertIn("'completion_ids'", str(cm.exception))
        body = step_body("e", "catalog.search", {"query": "mug"},
                         {"completion_token_ids": [1, 2], "logprobs": [-0.1, -0.2], "policy_version": "v1"})
        self.assertEqual(body["trainer"]["completionTokenIds"], [1, 2])
        self.assertEqual(body["trainer"]["policyVersion"], "v1")

    def test_step_refuses_unknown_action_keys(self):
        env = g.GauntletEnv("shop", url=NOWHERE, token="t")
        env.episode_id = "e"
        with self.assertRaises(ValueError) as cm:
            env.step({"tool": "catalog.search", "arguments": {"query": "mug"}})
        self.assertIn("'arguments'", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
