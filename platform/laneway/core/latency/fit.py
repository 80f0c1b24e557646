"""A robust, time-decayed least-squares line: the estimator under every latency figure.

    y ~ c0 + c1 x1 + c2 x2 + ...        (x0 = 1: the intercept; at most 4 coefficients)

Each observation adds its weight to the normal equations (sums of x x' and x y) and every sum
decays by half each `half_life_s` of time, so the fit is of the last minute or so of traffic,
whatever the request rate. An update is O(1): a k x k matrix for k <= 4 coefficients, no
sample kept.

Robust: once the fit has data, an observation is clipped (winsorised) to the prediction plus or
minus the larger of `clip` times the running mean absolute residual, widened by how far the
observation lies from what the fit has seen (its leverage: a prompt far longer than any before
is news, not an outlier, and clipping it biased the prefill rate 10 % low), and `relative`
times the prediction itself. A 10x outlier (a pause, a request stuck behind a client) then
counts as a 1.25x one, and a few of them move the fit by a fraction of a percent.

A robust fit resists a real change too, so a drift detector tells the two apart: the mean of
the residuals, each as a share of its clipping bound (-1..1), over a window half the fit's
half-life. A few outliers barely move it; an engine that got 3x slower (or faster) puts every
residual at the bound, and once that mean passes one half the fit forgets all but 1/16 of what
it held and takes the next half half-life unclipped: the change is learned in seconds, not at
the pace of the decay (docs/decisions/0009-latency-estimator.md).

A regressor with no spread (a replica that always runs one sequence, an engine that reports no
KV use) leaves its coefficient undetermined; a small ridge on each non-intercept coefficient,
proportional to the weight held, keeps it at 0 then and costs next to nothing otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

LN2 = math.log(2.0)
DRIFT_SHARE = 0.5  # mean residual, as a share of its clipping bound, that is a shift, not noise
DRIFT_MIN_WEIGHT = 5.0  # observations in the drift window before it may call a shift
SHIFT_KEEPS = 1 / 16  # of the fit's weight, when it shifts: four half-lives forgotten at once


def _solve(a: list[list[float]], b: Sequence[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting (k <= 4): None when singular. `a` is
    consumed (the callers pass a fresh copy)."""
    k = len(b)
    m = a
    for i in range(k):
        m[i].append(b[i])
    for col in range(k):
        pivot = col
        for r in range(col + 1, k):
            if abs(m[r][col]) > abs(m[pivot][col]):
                pivot = r
        if abs(m[pivot][col]) < 1e-300:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        top = m[col]
        for r in range(col + 1, k):
            row = m[r]
            f = row[col] / top[col]
            if f:
                for c in range(col, k + 1):
                    row[c] -= f * top[c]
    out = [0.0] * k
    for r in range(k - 1, -1, -1):
        row = m[r]
        acc = row[k]
        for c in range(r + 1, k):
            acc -= row[c] * out[c]
        out[r] = acc / row[r]
    return out


def _solve_normal(a: list[list[float]], b: Sequence[float]) -> list[float] | None:
    """The fit's own normal equations (symmetric, positive definite with the ridge): LDL'
    written out for each size, about a fifth of `_solve`'s time (it runs once or more per
    request: every observation asks the fit's prediction to clip against). Only `a`'s lower
    triangle is read, and `a` is left as it is. A pivot that is not positive (never with the
    ridge, but rounding may) falls back to the pivoting elimination."""
    k = len(b)
    if k == 1:
        d0 = a[0][0]
        return [b[0] / d0] if d0 > 1e-300 else None
    if k == 3:
        (d0, _, _), (a10, a11, _), (a20, a21, a22) = a
        if d0 > 1e-300:
            l10, l20 = a10 / d0, a20 / d0
            d1 = a11 - l10 * l10 * d0
            if d1 > 1e-300:
                l21 = (a21 - l20 * l10 * d0) / d1
                d2 = a22 - l20 * l20 * d0 - l21 * l21 * d1
                if d2 > 1e-300:
                    b0, b1, b2 = b
                    y1 = b1 - l10 * b0
                    y2 = b2 - l20 * b0 - l21 * y1
                    x2 = y2 / d2
                    x1 = y1 / d1 - l21 * x2
                    return [b0 / d0 - l10 * x1 - l20 * x2, x1, x2]
    elif k == 4:
        (d0, _, _, _), (a10, a11, _, _), (a20, a21, a22, _), (a30, a31, a32, a33) = a
        if d0 > 1e-300:
            l10, l20, l30 = a10 / d0, a20 / d0, a30 / d0
            d1 = a11 - l10 * l10 * d0
            if d1 > 1e-300:
                l21 = (a21 - l20 * l10 * d0) / d1
                l31 = (a31 - l30 * l10 * d0) / d1
                d2 = a22 - l20 * l20 * d0 - l21 * l21 * d1
                if d2 > 1e-300:
                    l32 = (a32 - l30 * l20 * d0 - l31 * l21 * d1) / d2
                    d3 = a33 - l30 * l30 * d0 - l31 * l31 * d1 - l32 * l32 * d2
                    if d3 > 1e-300:
                        b0, b1, b2, b3 = b
                        y1 = b1 - l10 * b0
                        y2 = b2 - l20 * b0 - l21 * y1
                        y3 = b3 - l30 * b0 - l31 * y1 - l32 * y2
                        x3 = y3 / d3
                        x2 = y2 / d2 - l32 * x3
                        x1 = y1 / d1 - l21 * x2 - l31 * x3
                        return [b0 / d0 - l10 * x1 - l20 * x2 - l30 * x3, x1, x2, x3]
    return _solve([row[:] for row in a], b)


class DecayedFit:
    def __init__(
        self,
        size: int,
        half_life_s: float,
        *,
        ridge: Sequence[float] = (),
        clip: float = 3.0,
        relative: float = 0.25,
        floor: float = 0.0,
        warm_weight: float = 5.0,
    ) -> None:
        if not 1 <= size <= 4:
            raise ValueError("1 to 4 coefficients (the intercept included)")
        self.size = size
        self.half_life_s = half_life_s
        self._ridge = [0.0, *ridge, *([1e-4] * size)][:size]  # never on the intercept
        self._clip = clip
        self._relative = relative
        self._floor = floor  # the smallest clipping bound, in y's units
        self._warm = warm_weight  # weight held before anything is clipped
        self._xx = [[0.0] * size for _ in range(size)]
        self._xy = [0.0] * size
        self._w = 0.0
        self._abs_residual = 0.0  # weighted sum of |clipped residual|
        self._at: float | None = None
        self._coef: list[float] | None = None
        self._dirty = False
        # The drift detector: a decayed mean of residuals as shares of their bound, over a
        # window of half the half-life, and how long the fit stays unclipped after a shift.
        self._drift = 0.0
        self._drift_w = 0.0
        self._drift_at = 0.0
        self._unclipped_until = float("-inf")
        self.count = 0  # observations ever (not decayed)
        self.clipped = 0  # of which were clipped
        self.shifts = 0  # changes the drift detector saw

    def _decay(self, now: float) -> None:
        if self._at is not None and now > self._at:
            f = math.exp(-LN2 * (now - self._at) / self.half_life_s)
            for row in self._xx:
                for j in range(self.size):
                    row[j] *= f
            for j in range(self.size):
                self._xy[j] *= f
            self._w *= f
            self._abs_residual *= f
        if self._at is None or now > self._at:
            self._at = now

    def weight(self, now: float) -> float:
        """The observations' weight left at `now` (about the observations of the last
        half_life / ln 2 seconds at weight 1)."""
        if self._at is None:
            return 0.0
        return self._w * math.exp(-LN2 * max(now - self._at, 0.0) / self.half_life_s)

    def add(self, now: float, x: Sequence[float], y: float, weight: float = 1.0) -> None:
        """One observation (x without the leading 1)."""
        if weight <= 0 or not math.isfinite(y):
            return
        self._decay(now)
        row = (1.0, *x)
        predicted = self.predict(x) if self._w >= self._warm else None
        if predicted is not None:
            spread = self._clip * self._abs_residual / self._w
            base = max(spread, self._relative * abs(predicted), self._floor)  # the drift's yardstick
            residual = y - predicted
            bound = base
            if self._drifted(now, max(-1.0, min(1.0, residual / base)), weight):
                self._forget(SHIFT_KEEPS)
                self._unclipped_until = now + self.half_life_s / 2
                self.shifts += 1
            elif abs(residual) > base and now >= self._unclipped_until:
                bound = max(spread * math.sqrt(1.0 + self._leverage(row)), base)  # only when it matters
                if abs(residual) > bound:
                    y = predicted + math.copysign(bound, residual)
                    residual = y - predicted
                    self.clipped += 1
            self._abs_residual += weight * min(abs(residual), bound)
        for i in range(self.size):
            wi = weight * row[i]
            xx = self._xx[i]
            for j in range(self.size):
                xx[j] += wi * row[j]
            self._xy[i] += wi * y
        self._w += weight
        self.count += 1
        self._dirty = True

    def _leverage(self, row: Sequence[float]) -> float:
        """W x' (X'WX)^-1 x: about the number of coefficients for an observation like those
        seen, far more for one outside them."""
        z = _solve_normal(self._regularised(), row)
        return 0.0 if z is None else max(self._w * sum(a * b for a, b in zip(row, z, strict=True)), 0.0)

    def _regularised(self) -> list[list[float]]:
        a = [row[:] for row in self._xx]
        for i in range(1, self.size):
            a[i][i] += self._ridge[i] * self._w
        return a  # _solve_normal leaves it whole

    def _drifted(self, now: float, share: float, weight: float) -> bool:
        """Whether the residuals of the last half half-life sit at their bound, one way."""
        if now > self._drift_at:
            f = math.exp(-LN2 * (now - self._drift_at) / (self.half_life_s / 2))
            self._drift *= f
            self._drift_w *= f
            self._drift_at = now
        self._drift += weight * share
        self._drift_w += weight
        if self._drift_w >= DRIFT_MIN_WEIGHT and abs(self._drift) > DRIFT_SHARE * self._drift_w:
            self._drift = self._drift_w = 0.0
            return True
        return False

    def _forget(self, keep: float) -> None:
        for row in self._xx:
            for j in range(self.size):
                row[j] *= keep
        for j in range(self.size):
            self._xy[j] *= keep
        self._w *= keep
        self._abs_residual *= keep

    def _solved(self) -> list[float] | None:
        if self._dirty:
            self._dirty = False
            solved = _solve_normal(self._regularised(), self._xy)
            if solved is not None:
                self._coef = solved
        return self._coef

    @property
    def coefficients(self) -> tuple[float, ...] | None:
        """(c0, c1, ...) as of the last observation; None before the first."""
        c = self._solved()
        return None if c is None else tuple(c)

    def predict(self, x: Sequence[float]) -> float | None:
        c = self._solved()
        if c is None:
            return None
        slope = 0.0  # summed as sum() did, then the intercept: the same float
        for ci, xi in zip(c[1:], x, strict=False):
            slope += ci * xi
        return c[0] + slope
