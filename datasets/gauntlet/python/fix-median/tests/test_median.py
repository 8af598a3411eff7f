import sys
import unittest

sys.path.insert(0, "/app")
import stats  # noqa: E402


class MedianTest(unittest.TestCase):
    def test_odd(self):
        self.assertEqual(stats.median([3, 1, 2]), 2)
        self.assertEqual(stats.median([7]), 7)

    def test_even(self):
        self.assertEqual(stats.median([4, 1, 3, 2]), 2.5)
        self.assertEqual(stats.median([10, -10]), 0)

    def test_floats(self):
        self.assertAlmostEqual(stats.median([0.5, 0.25, 1.0, 2.0]), 0.75)

    def test_unchanged(self):
        xs = [5, 3, 9, 1]
        stats.median(xs)
        self.assertEqual(xs, [5, 3, 9, 1])

    def test_empty(self):
        with self.assertRaises(ValueError):
            stats.median([])

    def test_mean_still_works(self):
        self.assertEqual(stats.mean([1, 2, 3]), 2)


if __name__ == "__main__":
    unittest.main()
