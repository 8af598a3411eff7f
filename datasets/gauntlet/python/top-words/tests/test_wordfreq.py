import subprocess
import sys
import unittest

sys.path.insert(0, "/app")
import wordfreq  # noqa: E402


class TopWordsTest(unittest.TestCase):
    def test_basic(self):
        self.assertEqual(wordfreq.top_words("the cat and the hat", 2), [("the", 2), ("and", 1)])

    def test_case_and_punctuation(self):
        self.assertEqual(wordfreq.top_words("Don't stop! DON'T, don't-stop.", 3),
                         [("don", 3), ("t", 3), ("stop", 2)])

    def test_digits_split(self):
        self.assertEqual(wordfreq.top_words("ab1ab2cd", 5), [("ab", 2), ("cd", 1)])

    def test_ties_alphabetical(self):
        self.assertEqual(wordfreq.top_words("b a c b a c", 3), [("a", 2), ("b", 2), ("c", 2)])

    def test_n(self):
        self.assertEqual(wordfreq.top_words("a b", 0), [])
        self.assertEqual(wordfreq.top_words("a b", -1), [])
        self.assertEqual(wordfreq.top_words("a b", 10), [("a", 1), ("b", 1)])
        self.assertEqual(wordfreq.top_words("", 3), [])

    def test_non_ascii_letters_separate(self):
        self.assertEqual(wordfreq.top_words("caf\u00e9 cafe", 2), [("caf", 1), ("cafe", 1)])

    def test_script(self):
        out = subprocess.run([sys.executable, "/app/wordfreq.py", "1"], input="x y x",
                             capture_output=True, text=True, timeout=10)
        self.assertEqual(out.stdout, "x 2\n")


if __name__ == "__main__":
    unittest.main()
