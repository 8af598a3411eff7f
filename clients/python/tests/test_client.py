"""Tests of gauntlet_env against a real gauntlet stack (started by the Go test
TestEnvAPI in cmd/gauntlet, which sets GAUNTLET_URL, GAUNTLET_TOKEN and
GAUNTLET_OTHER_TOKEN). They fail, never skip, without a server."""

import os
import unittest

import gauntlet_env as g

URL = os.environ.get("GAUNTLET_URL")
TOKEN = os.environ.get("GAUNTLET_TOKEN")
OTHER = os.environ.get("GAUNTLET_OTHER_TOKEN")


def search(q="mug"):
    return {"tool": "catalog.search", "args": {"query": q}}


class EnvAPITest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not (URL and TOKEN and OTHER):
            raise RuntimeError("GAUNTLET_URL, GAUNTLET_TOKEN and GAUNTLET_OTHER_TOKEN must name a running env API "
                               "(run via go test ./cmd/gauntlet -run TestEnvAPI)")
        cls.client = g.Client(URL, TOKEN)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()

    def test_describe(self):
        self.assertIn("shop", [e["name"] for e in self.client.list_envs()])
        with g.GauntletEnv("shop", client=self.client) as env:
            self.assertIn("catalog.search", env.tools)
            names = [c["name"] for c in env.description["rewardComponents"]]
            self.assertEqual(names, ["task", "cost", "safety", "timeliness", "causal"])

    def test_spaces_of_every_env(self):
        for name in [e["name"] for e in self.client.list_envs()]:
            d = self.client.describe_env(name)
            a = d["actionSpace"]
            self.assertEqual([t["name"] for t in a["tools"]], [t["name"] for t in d["tools"]], name)
            self.assertTrue(all(t["schemaJson"] for t in a["tools"]), name)
            self.assertEqual(a["maxArgsBytes"], 65536)
            self.assertEqual(d["observationSpace"], {"encoding": "json", "schemaJson": '{"type":"object"}'})
            with g.GauntletEnv(name, client=self.client) as env:
                self.assertIsInstance(env.action_space, g.ToolCall)
                self.assertEqual(env.action_space.names, [t["name"] for t in d["tools"]])
                env.action_space.seed(3)
                for _ in range(20):
                    self.assertIn(env.action_space.sample(), env.action_space)
        with g.GauntletEnv("shop", client=self.client) as env:
            obs, _ = env.reset(seed=11)
            self.assertIn(obs, env.observation_space)
            self.assertNotIn({"tool": "catalog.search", "args": {"q": "mug"}}, env.action_space)
            env.action_space.seed(5)
            for _ in range(5):
                a = env.action_space.sample()
                obs, _, term, trunc, info = env.step(a)
                self.assertIn(obs, env.observation_space)
                self.assertFalse(info["infra_error"])
                if term or trunc:
                    break

    def test_autoreset_next_step(self):
        with g.GauntletVectorEnv(2, "shop", client=self.client, max_steps=2,
                                 autoreset_mode=g.AutoresetMode.NEXT_STEP) as venv:
            self.assertEqual(venv.metadata["autoreset_mode"], g.AutoresetMode.NEXT_STEP)
            venv.reset(seed=200)
            old = [e.episode_id for e in venv.envs]
            venv.step([search()] * 2)
            obs, rew, term, trunc, infos = venv.step([search()] * 2)
            self.assertEqual(trunc, [True, True])
            self.assertEqual([i["reason"] for i in infos], ["max_steps", "max_steps"])
            # The ending step is the episode's own last: its observation, no reset yet.
            self.assertEqual([i["episode_id"] for i in infos], old)
            self.assertFalse(any("item" in o for o in obs))
            self.assertNotIn("final_obs", infos[0])
            # The next step resets both instead of stepping them: the actions (an invalid
            # one among them) are ignored; each gives the new episode's first observation,
            # reward 0 and neither flag.
            obs, rew, term, trunc, infos = venv.step([{"tool": "no.such.tool", "args": {}}, search()])
            self.assertEqual(rew, [0.0, 0.0])
            self.assertEqual(term, [False, False])
            self.assertEqual(trunc, [False, False])
            for i in range(2):
                self.assertIn("item", obs[i])
                self.assertIn(obs[i], venv.single_observation_space)
                self.assertNotEqual(infos[i]["episode_id"], old[i])
                self.assertEqual(infos[i]["episode_id"], venv.envs[i].episode_id)
                self.assertEqual(infos[i]["runId"], "api-acme")  # the reset's info
            # The ignored actions were not played: the next step is each episode's first.
            obs, rew, term, trunc, infos = venv.step([search()] * 2)
            self.assertEqual([i["step"] for i in infos], [0, 0])
            self.assertFalse(any(i["signals"].get("invalidAction") for i in infos))

    def test_autoreset_same_step(self):
        with g.GauntletVectorEnv(2, "shop", client=self.client, max_steps=1, autoreset_mode="SameStep") as venv:
            venv.reset(seed=300)
            old = [e.episode_id for e in venv.envs]
            obs, rew, term, trunc, infos = venv.step([search()] * 2)
            # The ending step's reward and flags, the new episode's first observation, and
            # the ended step's observation and info under final_obs and final_info.
            self.assertEqual(trunc, [True, True])
            self.assertTrue(all(isinstance(r, float) for r in rew))
            for i in range(2):
                self.assertIn("item", obs[i])
                final = infos[i]["final_info"]
                self.assertEqual(final["episode_id"], old[i])
                self.assertEqual(final["reason"], "max_steps")
                self.assertEqual(final["step"], 0)
                self.assertIsNotNone(infos[i]["final_obs"])
                self.assertNotIn("item", infos[i]["final_obs"])  # a search result, not a start
                self.assertEqual(infos[i]["episode_id"], venv.envs[i].episode_id)
                self.assertNotEqual(infos[i]["episode_id"], old[i])
            # The next step is the new episode's first; with max_steps 1 it ends that one
            # too, and is reset within the step again.
            new = [i["episode_id"] for i in infos]
            obs, rew, term, trunc, infos = venv.step([search()] * 2)
            self.assertEqual(trunc, [True, True])
            self.assertEqual([i["final_info"]["episode_id"] for i in infos], new)
            self.assertEqual([i["final_info"]["step"] for i in infos], [0, 0])

    def test_reset_mask_when_autoreset_is_disabled(self):
        with g.GauntletVectorEnv(2, "shop", client=self.client, max_steps=1) as venv:
            self.assertEqual(venv.metadata["autoreset_mode"], g.AutoresetMode.DISABLED)
            venv.reset(seed=400)
            obs, rew, term, trunc, infos = venv.step([search()] * 2)
            self.assertEqual(trunc, [True, True])
            kept = venv.envs[1].episode_id
            obs2, infos2 = venv.reset(options={"reset_mask": [True, False]})
            self.assertIn("item", obs2[0])
            self.assertEqual(obs2[1], obs[1])  # not reset: its last observation
            self.assertEqual(infos2[1], {})
            self.assertEqual(venv.envs[1].episode_id, kept)
            obs, rew, term, trunc, infos = venv.step([search(), search()])
            self.assertEqual(infos[0]["step"], 0)
            self.assertIsInstance(infos[1]["error"], g.EpisodeOverError)  # still over: no autoreset

    def test_full_episode_five_tuple(self):
        with g.GauntletEnv("shop", client=self.client, max_steps=5, policy="py-test") as env:
            obs, info = env.reset(seed=3, options={"profile": "baseline"})
            self.assertIn("item", obs)
            self.assertEqual(info["runId"], "api-acme")
            n = 0
            while True:
                obs, reward, terminated, truncated, info = env.step(search(obs.get("item", "mug") if n == 0 else "mug"))
                n += 1
                self.assertIsInstance(reward, float)
                self.assertEqual(set(info["reward_components"]), {"task", "cost", "safety", "timeliness", "causal"})
                self.assertFalse(info["infra_error"])
                if terminated or truncated:
                    break
            self.assertEqual(n, 5)
            self.assertTrue(truncated)
            self.assertEqual(info["reason"], "max_steps")
            # No auto-reset: the next step says the episode is over.
            with self.assertRaises(g.EpisodeOverError):
                env.step(search())
            obs, info = env.reset(seed=4)
            env.step(search())

    def test_bad_actions_keep_the_episode_usable(self):
        with g.GauntletEnv("shop", client=self.client) as env:
            env.reset(seed=5)
            _, _, term, _, info = env.step({"tool": "no.such.tool", "args": {}})
            self.assertTrue(info["signals"].get("invalidAction"))
            self.assertFalse(term)
            _, _, _, _, info = env.step({"tool": "catalog.search", "args": "{not json"})
            self.assertTrue(info["signals"].get("invalidAction"))
            _, _, _, _, info = env.step(search())
            self.assertEqual(info["step"], 2)
            with self.assertRaises(ValueError):
                env.step("catalog.search")
            with self.assertRaises(g.InvalidArgumentError) as cm:
                self.client.call("Step", {"episodeId": env.episode_id})
            self.assertIn("action", cm.exception.message)
            # A field the server does not know is refused, naming it, and not played.
            with self.assertRaises(g.InvalidArgumentError) as cm:
                self.client.call("Step", {"episodeId": env.episode_id,
                                          "action": {"tool": "catalog.search", "args": {"query": "mug"}}})
            self.assertIn('"args"', cm.exception.message)
            _, _, _, _, info = env.step(search())
            self.assertEqual(info["step"], 3)

    def test_typed_errors(self):
        with self.assertRaises(g.AuthError) as cm, g.Client(URL, "wrong-token-xxxxxxxxxxxxxxxx") as c:
            c.list_envs()
        self.assertEqual(cm.exception.status, 401)
        with g.GauntletEnv("shop", client=self.client) as env:
            env.reset(seed=6)
            with self.assertRaises(g.NotFoundError) as cm, g.Client(URL, OTHER) as other:
                other.step(env.episode_id, "catalog.search", {})
            self.assertEqual(cm.exception.status, 404)
        with self.assertRaises(g.InvalidArgumentError):
            self.client.reset("shop", profile="apocalypse")

    def test_context_manager_closes(self):
        before = self.client.capacity().get("activeEpisodes", 0)
        with g.GauntletEnv("shop", client=self.client) as env:
            env.reset(seed=8)
            self.assertEqual(self.client.capacity().get("activeEpisodes", 0), before + 1)
            eid = env.episode_id
        self.assertEqual(self.client.capacity().get("activeEpisodes", 0), before)
        self.client.close_episode(eid)  # idempotent

    def test_vector_env_256(self):
        n = 256
        with g.GauntletVectorEnv(n, "shop", client=self.client, max_steps=3) as venv:
            obs, infos = venv.reset(seed=100)
            self.assertEqual(len(obs), n)
            obs, rew, term, trunc, infos = venv.step([search()] * n)
            self.assertTrue(all(isinstance(r, float) for r in rew))
            self.assertEqual({i["step"] for i in infos}, {0})
            # EnvPool style: send everything, receive the first results as they complete.
            self.assertEqual(venv.send([search()] * n), n)
            got = {}
            while len(got) < n:
                for i, out in venv.recv(min_results=1):
                    self.assertFalse(out.info["error"])
                    got[i] = out
            self.assertEqual({o.info["step"] for o in got.values()}, {1})
            obs, rew, term, trunc, infos = venv.step([search()] * n)
            self.assertTrue(all(trunc))
            # A done sub-env is not auto-reset: stepping it fails for that item only.
            obs, rew, term, trunc, infos = venv.step([search()] + [None] * (n - 1))
            self.assertIsInstance(infos[0]["error"], g.EpisodeOverError)
            venv.reset_at(0, seed=1)
            obs, rew, term, trunc, infos = venv.step([search()] + [None] * (n - 1))
            self.assertEqual(infos[0]["step"], 0)

    def test_trainer_data_and_fork(self):
        with g.GauntletEnv("shop", client=self.client) as env:
            env.reset(seed=9)
            env.step({"tool": "catalog.search", "args": {"query": "mug"},
                      "trainer": {"completion_token_ids": [1, 2], "logprobs": [-0.1, -0.2], "policy_version": "py"}})
            snap = env.snapshot()
            a = env.step(search("lamp"))
            with g.GauntletEnv("shop", client=self.client) as env2:
                env2.fork(snap)
                b = env2.step(search("lamp"))
            self.assertEqual(a.obs, b.obs)
            self.assertEqual(a.reward, b.reward)

    def test_several_agents(self):
        # The dispatch world: the dispatcher lists the orders; the driver sees nothing of
        # them, only its own answer, inbox and view, in its own turns.
        with g.GauntletAECEnv("dispatch", client=self.client) as aec:
            aec.reset(seed=4, options={"max_steps": 6})
            self.assertEqual(aec.possible_agents, ["dispatcher", "driver"])
            self.assertEqual(aec.agent_selection, "dispatcher")
            self.assertIn("truck.load", aec.tools("driver"))
            self.assertNotIn("truck.load", aec.tools("dispatcher"))
            total = 0.0
            out = aec.step({"tool": "orders.list", "args": {}})
            total += out.reward
            obs, _, _, _, _ = aec.last()
            self.assertEqual(aec.agent_selection, "driver")
            self.assertEqual(obs["agent"], "driver")
            self.assertNotIn("urgent", str(obs))
            out = aec.step(("wait", {"ms": 10}))
            total += out.reward
            obs, _, _, _, _ = aec.last()
            self.assertEqual(aec.agent_selection, "dispatcher")
            self.assertIn("answer", obs)  # its orders.list's, or the error a fault gave it
            # Another role's tool is an invalid action of the agent whose turn it is.
            out = aec.step({"tool": "driver:truck.load", "args": {"order": "o-1"}})
            total += out.reward
            self.assertTrue(out.info["signals"].get("invalidAction"))
            while not aec.terminations["driver"] and not aec.truncations["driver"]:
                total += aec.step(("wait", {"ms": 10})).reward
            self.assertTrue(aec.truncations["dispatcher"])
            self.assertAlmostEqual(sum(aec.cumulative_rewards.values()), total)


if __name__ == "__main__":
    unittest.main()
