import csv
import json
import os
import subprocess
import tempfile
import unittest

ITEMS = [
    {"id": 1, "name": "Ada, Countess", "note": 'said "hi"', "extra": None},
    {"id": 2, "name": "multi\nline", "note": "", "extra": "x"},
    {"id": 3, "name": "plain", "note": "comma,and \"quote\"", "extra": "tab\there"},
]


class ExportTest(unittest.TestCase):
    def test_round_trip(self):
        with tempfile.TemporaryDirectory() as d:
            src, dst = os.path.join(d, "in.json"), os.path.join(d, "out.csv")
            with open(src, "w") as f:
                json.dump(ITEMS, f)
            subprocess.run(["python3", "/app/export.py", src, dst], check=True, timeout=20)
            with open(dst, newline="") as f:
                rows = list(csv.reader(f))
        self.assertEqual(rows[0], ["id", "name", "note", "extra"])
        want = [["" if v is None else str(v) for v in item.values()] for item in ITEMS]
        self.assertEqual(rows[1:], want)


if __name__ == "__main__":
    unittest.main()
