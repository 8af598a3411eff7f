"""Tests of the Gymnasium-shaped spaces and the vector env's autoreset settings that need
no server: the spaces are built from tool schemas as DescribeEnv returns them (these are
shop's and codefix's own), and a vector env is made without reaching the network."""

import json
import unittest

import gauntlet_env as g
from gauntlet_env import spaces
from gauntlet_env.spaces import JSONSchema, ToolCall

NOWHERE = "http://127.0.0.1:9"

ORDER = {"additionalProperties": False, "required": ["sku", "qty"], "type": "object",
         "properties": {"qty": {"maximum": 1000, "minimum": 1, "type": "integer"},
                        "sku": {"maxLength": 32, "type": "string"}}}
PATCH = {"type": "object", "required": ["path", "edits"], "additionalProperties": False,
         "properties": {"path": {"type": "string"},
                        "edits": {"type": "array", "minItems": 1,
                                  "items": {"type": "object", "required": ["old", "new"], "additionalProperties": False,
                                            "properties": {"old": {"type": "string"}, "new": {"type": "string"}}}}}}
TOOLS = [{"name": "order.create", "schemaJson": json.dumps(ORDER)},
         {"name": "fs.patch", "schemaJson": json.dumps(PATCH)},
         {"name": "wallet.balance", "schemaJson": '{"additionalProperties":false,"properties":{},"type":"object"}'}]


class SpacesTest(unittest.TestCase):
    def test_json_schema_contains(self):
        s = JSONSchema(ORDER)
        self.assertIn({"sku": "sku-1", "qty": 3}, s)
        self.assertIn({"sku": "sku-1", "qty": 3.0}, s)  # 3.0 is an integer, as in JSON Schema
        for bad in [{"sku": "sku-1"}, {"sku": "sku-1", "qty": 0}, {"sku": "sku-1", "qty": 1001},
                    {"sku": "x" * 33, "qty": 1}, {"sku": "a", "qty": 1, "note": ""}, {"sku": 1, "qty": 1},
                    {"sku": "a", "qty": True}, {"sku": "a", "qty": 1.5}, [], None, "{}"]:
            self.assertNotIn(bad, s, bad)
        p = JSONSchema(json.dumps(PATCH))  # the JSON text, as DescribeEnv sends it
        self.assertIn({"path": "a", "edits": [{"old": "x", "new": "y"}]}, p)
        self.assertNotIn({"path": "a", "edits": []}, p)
        self.assertNotIn({"path": "a", "edits": [{"old": "x"}]}, p)

    def test_samples_are_members_and_seeded(self):
        for schema in (ORDER, PATCH, {"type": "object"}):
            s = JSONSchema(schema, seed=7)
            first = [s.sample() for _ in range(50)]
            for x in first:
                self.assertIn(x, s)
            self.assertEqual(s.seed(7), 7)
            self.assertEqual([s.sample() for _ in range(50)], first)
        a = ToolCall(TOOLS, seed=1)
        got = [a.sample() for _ in range(100)]
        self.assertEqual({x["tool"] for x in got}, {"order.create", "fs.patch", "wallet.balance"})
        for x in got:
            self.assertIn(x, a)
            self.assertEqual(set(x), {"tool", "args"})
        a.seed(1)
        self.assertEqual([a.sample() for _ in range(100)], got)
        with self.assertRaises(ValueError):
            a.sample(mask=[1, 0, 0])

    def test_batched_space_samples_each_sub_env_apart(self):
        a = ToolCall(TOOLS, seed=1)
        b = spaces.batch(a, 4)
        self.assertEqual(len(b), 4)
        x = b.sample()
        self.assertEqual(len(x), 4)
        self.assertIn(x, b)
        self.assertIn(list(x), b)
        self.assertGreater(len({json.dumps(v, sort_keys=True) for v in x}), 1)  # not one sample four times
        self.assertEqual(a.sample(), ToolCall(TOOLS, seed=1).sample())  # batching left a's draws alone

    def test_tool_call_contains(self):
        a = ToolCall(TOOLS, max_args_bytes=64)
        self.assertEqual(a.names, ["order.create", "fs.patch", "wallet.balance"])
        self.assertIn({"tool": "order.create", "args": {"sku": "s", "qty": 2}}, a)
        self.assertIn({"tool": "order.create", "args": '{"sku":"s","qty":2}'}, a)  # JSON text, as step takes
        self.assertIn(("wallet.balance", {}), a)
        self.assertIn({"tool": "wallet.balance", "args": {}, "trainer": {"policy_version": "v"}}, a)
        for bad in [{"tool": "no.such", "args": {}}, {"tool": "order.create", "args": {"sku": "s"}},
                    {"tool": "order.create", "args": "{not json"}, {"tool": "wallet.balance", "arguments": {}},
                    {"args": {}}, "wallet.balance", ("wallet.balance",),
                    {"tool": "fs.patch", "args": {"path": "p" * 80, "edits": [{"old": "", "new": ""}]}}]:  # over 64 bytes
            self.assertNotIn(bad, a, bad)

    def test_vector_env_declares_its_autoreset_mode(self):
        venv = g.GauntletVectorEnv(2, "shop", url=NOWHERE, token="t")
        self.assertEqual(venv.metadata["autoreset_mode"], g.AutoresetMode.DISABLED)  # as before: no autoreset
        for mode in (g.AutoresetMode.NEXT_STEP, "NextStep", "next_step", "NEXT_STEP"):
            v = g.GauntletVectorEnv(2, "shop", url=NOWHERE, token="t", autoreset_mode=mode)
            self.assertEqual(v.metadata["autoreset_mode"], g.AutoresetMode.NEXT_STEP)
            self.assertEqual(v.autoreset_mode, g.AutoresetMode.NEXT_STEP)
        self.assertEqual(g.AutoresetMode.SAME_STEP.value, "SameStep")
        with self.assertRaises(ValueError):
            g.GauntletVectorEnv(2, "shop", url=NOWHERE, token="t", autoreset_mode="whenever")

    def test_reset_mask_is_checked_before_anything_is_sent(self):
        venv = g.GauntletVectorEnv(2, "shop", url=NOWHERE, token="t")
        for bad in ([True], [False, False], ["yes", True], [1, 0], True):
            with self.assertRaises(ValueError):
                venv.reset(options={"reset_mask": bad})
        with self.assertRaises(ValueError):
            venv.reset(seed=[1, 2, 3])  # one seed per sub-env
        with self.assertRaises(ValueError):
            venv.reset(options={"reset_mask": [True, False], "profle": "stress"})


if __name__ == "__main__":
    unittest.main()
