"""Small statistics helpers."""


def mean(values):
    """The arithmetic mean of a non-empty list."""
    if not values:
        raise ValueError("mean of an empty list")
    return sum(values) / len(values)


def median(values):
    """The median of a non-empty list of numbers."""
    values.sort()
    return values[len(values) // 2]
