"""Word frequencies."""
import sys


def top_words(text, n):
    """The n most frequent words of text, as (word, count) tuples."""
    raise NotImplementedError


if __name__ == "__main__":
    for word, count in top_words(sys.stdin.read(), int(sys.argv[1])):
        print(word, count)
