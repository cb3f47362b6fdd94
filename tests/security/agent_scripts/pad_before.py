"""Agent script: ``python pad_before.py NAME COUNT`` makes COUNT small files that come before NAME in the folder's
listing order, so that a copy of the folder reaches NAME only after copying them all."""

import os
import sys


def main(name, count):
    made = 0
    while True:
        names = os.listdir(".")
        if sum(n.startswith("pad") for n in names[: names.index(name)]) >= count:
            return
        pad = f"pad{made}"
        made += 1
        with open(pad, "w") as handle:
            handle.write("x\n")
        names = os.listdir(".")
        if names.index(pad) > names.index(name):
            os.remove(pad)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
