"""Scores /app/summary.json field by field into /logs/verifier/reward.json."""
import json

with open("/tests/expected.json") as f:
    want = json.load(f)
rewards = {"valid_json": 0, "total": 0, "by_status": 0, "top_path": 0}
try:
    with open("/app/summary.json") as f:
        got = json.load(f)
    if isinstance(got, dict):
        rewards["valid_json"] = 1
        for key in ("total", "by_status", "top_path"):
            rewards[key] = int(got.get(key) == want[key] and type(got.get(key)) is type(want[key]))
except (OSError, ValueError) as e:
    print("summary.json:", e)
print(rewards)
with open("/logs/verifier/reward.json", "w") as f:
    json.dump(rewards, f)
