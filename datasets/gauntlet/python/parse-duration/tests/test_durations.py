import sys
import unittest

sys.path.insert(0, "/app")
from durations import parse_duration  # noqa: E402


class ParseDurationTest(unittest.TestCase):
    def test_valid(self):
        for text, want in [("90s", 90), ("1h30m", 5400), ("2d1s", 172801), ("0s", 0),
                           ("1d2h3m4s", 93784), ("10m", 600), ("007h", 25200)]:
            got = parse_duration(text)
            self.assertEqual(got, want, text)
            self.assertIs(type(got), int, text)

    def test_invalid(self):
        for text in ["", " 1h", "1h ", "1h 30m", "30m1h", "1h1h", "h", "1", "1.5h", "-1s",
                     "1x", "1hh", "1H", "１h", "1h30", "s1"]:
            with self.assertRaises(ValueError, msg=repr(text)):
                parse_duration(text)


if __name__ == "__main__":
    unittest.main()
