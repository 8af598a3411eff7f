"""Roman numerals."""

_VALUES = [(1000, "M"), (500, "D"), (100, "C"), (50, "L"), (10, "X"), (5, "V"), (1, "I")]


def to_roman(n):
    """n as a Roman numeral."""
    out = ""
    for value, letters in _VALUES:
        while n >= value:
            out += letters
            n -= value
    return out
