"""Export a JSON array of objects as CSV."""
import json
import sys


def main(src, dst):
    with open(src) as f:
        items = json.load(f)
    keys = list(items[0])
    with open(dst, "w") as out:
        out.write(",".join(keys) + "\n")
        for item in items:
            out.write(",".join(str(item[k]) for k in keys) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
