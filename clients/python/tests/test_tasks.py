"""Tests of gauntlet_env.tasks that need no server: the params it writes, the solution
action it builds from a task folder (its tar stream holds the folder's solution/, its
command exports [solution].env, quoted), and the verdict it finds in a last observation.
TestEnvAPITaskEpisodes (cmd/gauntlet) plays the action in real sandboxes."""

import base64
import io
import os
import tarfile
import tempfile
import unittest

from gauntlet_env import tasks as gt

DATASET = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "datasets", "gauntlet")


class TasksTest(unittest.TestCase):
    def test_task_params(self):
        self.assertEqual(gt.task_params("gauntlet", task="codefix/sum"), {"dataset": "gauntlet", "task": "codefix/sum"})
        self.assertEqual(gt.task_params("gauntlet", tags="python", difficulty=["easy", "medium"], glob=("python/*",), max_invalid=3),
                         {"dataset": "gauntlet", "tags": ["python"], "difficulty": ["easy", "medium"], "glob": ["python/*"], "max_invalid": 3})

    def test_solution_action_carries_the_solution(self):
        task = os.path.join(DATASET, "codefix", "sum")
        a = gt.solution_action(task)
        self.assertEqual(a["tool"], "shell.exec")
        self.assertEqual(a["args"]["dir"], "/app")
        self.assertIn("bash /solution/solve.sh", a["args"]["command"])
        self.assertEqual(gt.solution_action(task, workdir="/srv/project")["args"]["dir"], "/srv/project")
        with tarfile.open(fileobj=io.BytesIO(base64.b64decode(a["args"]["stdin"]))) as tar:
            names = sorted(tar.getnames())
            solve = tar.extractfile("solve.sh").read()
        self.assertEqual(names, sorted(os.listdir(os.path.join(task, "solution"))))
        with open(os.path.join(task, "solution", "solve.sh"), "rb") as f:
            self.assertEqual(solve, f.read())

    def test_solution_env_is_exported(self):
        with tempfile.TemporaryDirectory() as d:
            os.makedirs(os.path.join(d, "solution"))
            with open(os.path.join(d, "solution", "solve.sh"), "w") as f:
                f.write("echo $GREETING\n")
            with open(os.path.join(d, "task.toml"), "w") as f:
                f.write('[solution]\nenv = { GREETING = "it\'s me" }\n')
            cmd = gt.solution_action(d)["args"]["command"]
            self.assertIn("export 'GREETING=it'\\''s me'\n", cmd)
            with self.assertRaises(ValueError):
                gt.solution_action(os.path.join(d, "solution"))

    def test_verdict(self):
        v = {"pass": True, "rewards": {"reward": 1}, "exit_code": 0, "output": ""}
        self.assertEqual(gt.verdict(v), v)
        self.assertEqual(gt.verdict({"last": {"exit_code": 0}, "verdict": v}), v)
        self.assertIsNone(gt.verdict({"exit_code": 0, "stdout": ""}))
        self.assertIsNone(gt.verdict("text"))


if __name__ == "__main__":
    unittest.main()
