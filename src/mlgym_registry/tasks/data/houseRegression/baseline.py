"""A simple baseline for house prices: ordinary least squares on the raw columns; writes submission.csv.

Numeric columns are used as they are (a missing LotArea gets the training median) and Neighbourhood is one-hot
encoded. The model is fitted on data/train.csv, checked on data/validation.csv, and predicts data/test.csv.
"""

import csv

import numpy as np

NUMERIC = ["LotArea", "LivingArea", "Bedrooms", "Bathrooms", "YearBuilt", "Quality", "GarageCars", "HasPool",
           "DistanceKm"]


def load(path):
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def design(rows, medians, neighbourhoods):
    """The feature matrix: an intercept, the numeric columns and one indicator per neighbourhood but the first."""
    columns = [np.ones(len(rows))]
    for name in NUMERIC:
        values = [float(r[name]) if r[name] != "" else medians[name] for r in rows]
        columns.append(np.array(values))
    for hood in neighbourhoods[1:]:
        columns.append(np.array([r["Neighbourhood"] == hood for r in rows], dtype=float))
    return np.column_stack(columns)


def main():
    train, valid, test = load("data/train.csv"), load("data/validation.csv"), load("data/test.csv")
    medians = {n: float(np.median([float(r[n]) for r in train if r[n] != ""])) for n in NUMERIC}
    neighbourhoods = sorted({r["Neighbourhood"] for r in train})
    weights, *_ = np.linalg.lstsq(design(train, medians, neighbourhoods),
                                  np.array([float(r["Price"]) for r in train]), rcond=None)

    predicted = design(valid, medians, neighbourhoods) @ weights
    rmse = float(np.sqrt(np.mean((predicted - np.array([float(r["Price"]) for r in valid])) ** 2)))
    print(f"validation RMSE: {rmse:.0f}")

    with open("submission.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["Id", "Price"])
        for row, price in zip(test, design(test, medians, neighbourhoods) @ weights, strict=True):
            writer.writerow([row["Id"], f"{price:.2f}"])


if __name__ == "__main__":
    main()
