"""Shared statistics for the exactness tests: fixed significance level, chi-square helpers."""

from __future__ import annotations

from collections import Counter

import numpy as np
from scipy import stats

ALPHA = 1e-3  # a correct rule fails a test at this rate; a wrong one fails it almost surely


def goodness_of_fit(draws: list, expected: dict) -> float:
    """p-value of a chi-square test of draws against a known law {outcome: probability}.

    Outcomes with small expected counts are pooled into one cell, so the test stays valid.
    """
    n = len(draws)
    counts = Counter(draws)
    assert set(counts) <= {k for k, p in expected.items() if p > 0}, "an impossible outcome was drawn"
    big = [k for k, p in expected.items() if p * n >= 5]
    obs = [counts[k] for k in big]
    exp = [expected[k] * n for k in big]
    rest_exp = n - sum(exp)
    if rest_exp >= 1e-9:
        obs.append(n - sum(obs))
        exp.append(rest_exp)
    return float(stats.chisquare(obs, exp).pvalue)


def two_sample(a: list, b: list) -> float:
    """p-value of a chi-square test that two samples of categories come from the same law."""
    ca, cb = Counter(a), Counter(b)
    keys = sorted(set(ca) | set(cb), key=lambda k: -(ca[k] + cb[k]))
    table = [[ca[k], cb[k]] for k in keys if ca[k] + cb[k] >= 10]
    rare = [ca[k] + 0 for k in keys if ca[k] + cb[k] < 10], [cb[k] for k in keys if ca[k] + cb[k] < 10]
    if sum(rare[0]) + sum(rare[1]):
        table.append([sum(rare[0]), sum(rare[1])])
    if len(table) < 2:
        return 1.0
    return float(stats.chi2_contingency(np.array(table)).pvalue)
