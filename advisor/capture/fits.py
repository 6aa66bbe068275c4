"""The two-point fits of CAPTURE's predictor (seed 000, Section III-B), and one of ours.

Each fit is a two-parameter family y = alpha + beta * phi(x) drawn through two measured points
and sampled at a third x. With two points the family member is unique, so every fit is

    y(x) = y1 + (y2 - y1) * (phi(x) - phi(x1)) / (phi(x2) - phi(x1)),

linear in (y1, y2). That linearity is why the predictor may fit per layer statistic and then sum:
the fit of a sum is the sum of the fits. ``y1`` and ``y2`` may be numpy arrays (one fit per
element); NaN stays where it was.

- ``line_at``: phi(x) = x. Description 2: memory grows linearly with the batch size.
- ``log_at``: phi(d) = ln d, i.e. y = a + b ln(d), through degrees 2 and 4, for degrees above 4
  (Section III-B3). Any "logarithmic function" with two free parameters is this one: a
  c log_k(e d) is a + b ln d again, so the base does not matter.
- ``hyperbola_at``: phi(d) = 1/d, y = F + A/d. Not CAPTURE's: it is the shape of the paper's own
  analytical models (a fixed part plus a part divided by the degree, Section III-B3), exact for
  terms that are, and the position-aware predictor uses it for degrees it did not profile.
"""

from __future__ import annotations

import math
from typing import Callable

from advisor.errors import AdvisorError


def _two_point(phi: Callable[[float], float], x1: float, y1, x2: float, y2, x: float):
    if x1 == x2:
        raise AdvisorError(f"a two-point fit needs two different x values, got {x1} twice")
    weight = (phi(x) - phi(x1)) / (phi(x2) - phi(x1))
    return y1 + (y2 - y1) * weight


def line_at(x1: float, y1, x2: float, y2, x: float):
    """Description 2: the straight line through (x1, y1) and (x2, y2), sampled at x."""
    return _two_point(float, x1, y1, x2, y2, x)


def log_at(d1: float, y1, d2: float, y2, d: float):
    """Section III-B3: y = a + b ln(d) through (d1, y1) and (d2, y2), sampled at d."""
    return _two_point(math.log, d1, y1, d2, y2, d)


def hyperbola_at(d1: float, y1, d2: float, y2, d: float):
    """y = F + A/d through (d1, y1) and (d2, y2), sampled at d."""
    return _two_point(lambda value: 1.0 / value, d1, y1, d2, y2, d)
