"""The fits' optimiser: bounded Levenberg-Marquardt on soft-L1 residuals, and a plain solver.

Hand-written on numpy, with sums in a fixed order, so a fit gives the same digits on every CPU.
Parameters stay in their box: a step that leaves it is cut back to the boundary (a projected
step), and the Jacobian is taken on the inside of a bound, so a parameter can leave a bound again.
"""

from __future__ import annotations

import math

import numpy as np


def _solve(a: np.ndarray, b: np.ndarray) -> np.ndarray | None:
    """The x with a x = b, by Gaussian elimination with partial pivoting (None if a is singular).

    Plain Python arithmetic on a few unknowns, so the result is the same on every CPU (LAPACK's
    depends on the BLAS kernel the machine picks).
    """
    n = len(b)
    rows, right = np.asarray(a, dtype=float).tolist(), np.asarray(b, dtype=float).tolist()
    m = [row + [last] for row, last in zip(rows, right)]  # the same floats as float(a[i, j]), faster
    for col in range(n):
        pivot = max(range(col, n), key=lambda i: abs(m[i][col]))
        if m[pivot][col] == 0.0 or not math.isfinite(m[pivot][col]):
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for i in range(col + 1, n):
            f = m[i][col] / m[col][col]
            # columns up to `col` of the rows below are never read again: left as they are
            m[i][col + 1 :] = [x - f * y for x, y in zip(m[i][col + 1 :], m[col][col + 1 :])]
    x = [0.0] * n
    for i in reversed(range(n)):
        x[i] = (m[i][n] - sum(m[i][j] * x[j] for j in range(i + 1, n))) / m[i][i]
    return np.array(x)


def soft_l1(r: np.ndarray, delta: float) -> np.ndarray:
    """The soft-L1 loss of residuals r: r^2 near 0, 2 delta |r| far out (outliers weigh less)."""
    return 2 * delta**2 * (np.sqrt(1 + (r / delta) ** 2) - 1)


def fit_box(
    residual, x0: np.ndarray, lo: np.ndarray, hi: np.ndarray, delta: float, iters: int = 100
) -> tuple[np.ndarray, float]:
    """Levenberg-Marquardt on soft-L1-weighted residuals (IRLS), every x kept in [lo, hi].

    Returns the best x found and its cost, the sum of `soft_l1` over the residuals.
    """
    x = np.clip(np.asarray(x0, dtype=float), lo, hi)
    r = residual(x)
    best, lam, span = float(np.sum(soft_l1(r, delta))), 1e-2, hi - lo
    for _ in range(iters):
        jac = np.empty((len(r), len(x)))
        for j in range(len(x)):
            h = 1e-6 * span[j]
            d = x.copy()
            d[j] = x[j] + h if x[j] + h <= hi[j] else x[j] - h
            jac[:, j] = (residual(d) - r) / (d[j] - x[j])
        w = 1 / np.sqrt(1 + (r / delta) ** 2)
        # sums in a fixed order, not BLAS: its kernels differ per CPU in their last bits (issue 26)
        a = (jac[:, :, None] * (w[:, None] * jac)[:, None, :]).sum(axis=0)
        g = (jac * (w * r)[:, None]).sum(axis=0)
        gain, improved = 0.0, False
        for _ in range(10):
            step = _solve(a + lam * (np.diag(np.diag(a)) + 1e-12 * np.eye(len(x))), -g)
            if step is None:
                lam *= 10
                continue
            trial = np.clip(x + step, lo, hi)
            rt = residual(trial)
            ct = float(np.sum(soft_l1(rt, delta)))
            if ct < best:
                gain = best - ct
                x, r, best, lam = trial, rt, ct, max(lam / 3, 1e-9)
                improved = True
                break
            lam *= 4
        if not improved or gain < 1e-12 * max(best, 1e-30):
            break
    return x, best
