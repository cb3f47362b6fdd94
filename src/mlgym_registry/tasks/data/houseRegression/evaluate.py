"""Score a house-price submission against the held-out prices of the test set.

Usage: python evaluate.py --submission_file submission.csv
The submission is a CSV file with the columns Id and Price and one row per house of data/test.csv. Prints one JSON
line: {"rmse": root mean squared error in dollars (lower is better), "r2": coefficient of determination (higher is
better)}.
"""

import argparse
import csv
import json
import math
from pathlib import Path

ANSWERS = Path(__file__).absolute().parent / "data" / "answer.csv"


def read_prices(path, what):
    """{Id: Price} from a CSV file with Id and Price columns; SystemExit with the reason when it is malformed."""
    try:
        with open(path, newline="") as handle:
            rows = list(csv.DictReader(handle))
    except FileNotFoundError:
        raise SystemExit(f"{what} {str(path)!r} not found") from None
    if not rows or not {"Id", "Price"} <= set(rows[0]):
        raise SystemExit(f"{what} {str(path)!r} needs a header line with the columns Id and Price")
    prices = {}
    for line, row in enumerate(rows, start=2):
        key = (row["Id"] or "").strip()
        try:
            value = float(row["Price"])
        except (TypeError, ValueError):
            raise SystemExit(f"{what} line {line}: Price {row['Price']!r} is not a number") from None
        if not math.isfinite(value):
            raise SystemExit(f"{what} line {line}: Price must be finite, got {row['Price']!r}")
        if key in prices:
            raise SystemExit(f"{what} line {line}: Id {key} appears twice")
        prices[key] = value
    return prices


def score(truth, predicted):
    """RMSE and R^2 of `predicted` against `truth` (dicts keyed by Id with the same keys)."""
    ids = sorted(truth)
    errors = [truth[i] - predicted[i] for i in ids]
    mean = math.fsum(truth.values()) / len(ids)
    residual = math.fsum(e * e for e in errors)
    total = math.fsum((truth[i] - mean) ** 2 for i in ids)
    return {"rmse": math.sqrt(residual / len(ids)), "r2": 1.0 - residual / total}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--submission_file", default="submission.csv", help="the CSV file of predictions")
    args = parser.parse_args()
    truth = read_prices(ANSWERS, "answer file")
    predicted = read_prices(args.submission_file, "submission")
    missing = sorted(set(truth) - set(predicted))
    unknown = sorted(set(predicted) - set(truth))
    if missing or unknown:
        raise SystemExit(
            f"submission must hold exactly the {len(truth)} Ids of data/test.csv: "
            f"{len(missing)} missing (e.g. {missing[:3]}), {len(unknown)} unknown (e.g. {unknown[:3]})"
        )
    print(json.dumps(score(truth, predicted)))


if __name__ == "__main__":
    main()
