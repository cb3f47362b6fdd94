"""Score answer.txt: the share of its letters that are capitals, from 0 to 1 (0 when it has no letters or is missing).

Prints one JSON line, `{"Score": x}`.
"""

import json
from pathlib import Path

ANSWER = Path(__file__).absolute().parent / "answer.txt"
LIMIT = 100_000  # characters read: a huge answer is scored on its beginning


def capital_share(text):
    """The share of the letters of `text` that are capitals."""
    letters = [c for c in text if c.isalpha()]
    return sum(c.isupper() for c in letters) / len(letters) if letters else 0.0


def main():
    try:
        with ANSWER.open(encoding="utf-8", errors="replace") as handle:
            text = handle.read(LIMIT)
    except (FileNotFoundError, IsADirectoryError):
        text = ""
    print(json.dumps({"Score": capital_share(text)}))


if __name__ == "__main__":
    main()
