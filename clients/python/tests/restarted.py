"""What gauntlet_env raises for an episode the env API held before it restarted. Run by
the Go test TestEnvAPIAfterRestart in cmd/gauntlet, which restarts a stack and sets
GAUNTLET_URL, GAUNTLET_TOKEN and GAUNTLET_RESTARTED_EPISODE (an episode live before the
restart); not collected by `unittest discover` (it needs that restart)."""

import os
import unittest

import gauntlet_env as g

URL = os.environ.get("GAUNTLET_URL")
TOKEN = os.environ.get("GAUNTLET_TOKEN")
EPISODE = os.environ.get("GAUNTLET_RESTARTED_EPISODE")


class RestartedTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not (URL and TOKEN and EPISODE):
            raise RuntimeError("GAUNTLET_URL, GAUNTLET_TOKEN and GAUNTLET_RESTARTED_EPISODE must be set "
                               "(run via go test ./cmd/gauntlet -run TestEnvAPIAfterRestart)")
        cls.client = g.Client(URL, TOKEN)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()

    def test_step_raises_server_restarted(self):
        with self.assertRaises(g.ServerRestartedError) as cm:
            self.client.step(EPISODE, "catalog.search", {"query": "mug"})
        e = cm.exception
        self.assertIsInstance(e, g.EpisodeOverError)  # handlers of "episode over" keep working
        self.assertEqual(e.reason, "SERVER_RESTARTED")
        self.assertEqual(e.code, "failed_precondition")

    def test_env_recovers_with_reset(self):
        env = g.GauntletEnv("shop", client=self.client)
        env.episode_id = EPISODE
        with self.assertRaises(g.ServerRestartedError):
            env.step({"tool": "catalog.search", "args": {"query": "mug"}})
        env.reset(seed=1)  # closes the old episode first: that must not fail
        self.assertNotEqual(env.episode_id, EPISODE)
        env.close()

    def test_batch_item_raises_server_restarted(self):
        venv = g.GauntletVectorEnv(1, "shop", client=self.client)
        venv.envs[0].episode_id = EPISODE
        _, _, _, _, infos = venv.step([{"tool": "catalog.search", "args": {"query": "mug"}}])
        self.assertIsInstance(infos[0]["error"], g.ServerRestartedError)


if __name__ == "__main__":
    unittest.main()
