"""How the sink bench takes a ratio of two runs: within each round, of runs seconds apart, the median of
the rounds reported and each round's value kept."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from statistics import median
from typing import Any


class Ratios:
    """The runs' steady rates, and figures of two runs taken within each round."""

    def __init__(self, runs: dict[str, dict[str, Any]]) -> None:
        self.runs = runs
        self.spread: dict[str, list[float]] = {}  # a ratio's value in each round, where there were rounds

    def steady(self, name: str) -> float:
        return self.runs[name]["steady_per_s"]

    def across(self, names: Sequence[str], figure: Callable[..., float], key: str) -> float:
        """`figure` of the named runs' results, in each round (a run measured once stands in every
        round): the median, its rounds kept under `key`."""
        runs, spread = self.runs, self.spread
        each = [runs[n].get("rounds", [runs[n]]) for n in names]
        count = max(len(e) for e in each)
        padded = [e if len(e) == count else e * count for e in each]
        values = [figure(*results) for results in zip(*padded, strict=True)]
        if count > 1 and all(len(e) == count for e in each):
            spread[key] = [round(v, 3) for v in values]
        return round(median(values), 3)

    def paired(self, a: str, b: str, key: str | None = None) -> float:
        """a's steady rate over b's, within each round (its rounds kept under `key`)."""
        key = key or f"ratio_{a}_vs_{b}"
        return self.across((a, b), lambda x, y: x["steady_per_s"] / y["steady_per_s"], key)


def ratio(a: float, b: float) -> float:
    return round(a / b, 3)
