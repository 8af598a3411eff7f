import sys
import unittest

sys.path.insert(0, "/app")
import roman  # noqa: E402


def reference(n):
    pairs = [(1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
             (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")]
    out = ""
    for v, s in pairs:
        while n >= v:
            out += s
            n -= v
    return out


class RomanTest(unittest.TestCase):
    def test_known(self):
        for n, s in [(1, "I"), (4, "IV"), (9, "IX"), (14, "XIV"), (40, "XL"), (90, "XC"),
                     (400, "CD"), (1994, "MCMXCIV"), (2024, "MMXXIV"), (3999, "MMMCMXCIX")]:
            self.assertEqual(roman.to_roman(n), s)

    def test_all(self):
        for n in range(1, 4000):
            self.assertEqual(roman.to_roman(n), reference(n), n)

    def test_out_of_range(self):
        for n in (0, -1, 4000, 10**6):
            with self.assertRaises(ValueError):
                roman.to_roman(n)


if __name__ == "__main__":
    unittest.main()
