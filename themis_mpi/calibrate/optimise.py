"""The fits' optimisers: Levenberg-Marquardt on soft-L1 residuals, Nelder-Mead, a plain solver.

Hand-written on numpy, with sums in a fixed order, so a fit gives the same digits on every CPU.
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
    m = [[float(a[i, j]) for j in range(n)] + [float(b[i])] for i in range(n)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda i: abs(m[i][col]))
        if m[pivot][col] == 0.0 or not math.isfinite(m[pivot][col]):
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for i in range(col + 1, n):
            f = m[i][col] / m[col][col]
            m[i] = [x - f * y for x, y in zip(m[i], m[col])]
    x = [0.0] * n
    for i in reversed(range(n)):
        x[i] = (m[i][n] - sum(m[i][j] * x[j] for j in range(i + 1, n))) / m[i][i]
    return np.array(x)


def _lm(residual, u0: np.ndarray, delta: float, iters: int = 200) -> tuple[np.ndarray, float]:
    """Levenberg-Marquardt on soft-L1-weighted residuals (IRLS, scale delta), numeric Jacobian."""

    def cost(r):
        return float(np.sum(2 * delta**2 * (np.sqrt(1 + (r / delta) ** 2) - 1)))

    u, r = u0.copy(), residual(u0)
    best, lam = cost(r), 1e-2
    for _ in range(iters):
        h = 1e-6
        jac = np.empty((len(r), len(u)))
        for j in range(len(u)):
            du = u.copy()
            du[j] += h
            jac[:, j] = (residual(du) - r) / h
        w = 1 / np.sqrt(1 + (r / delta) ** 2)
        # sums in a fixed order, not BLAS: its kernels differ per CPU in their last bits, and this
        # fit's valleys are flat enough for that to move the fitted values (issue 26)
        a = (jac[:, :, None] * (w[:, None] * jac)[:, None, :]).sum(axis=0)
        g = (jac * (w * r)[:, None]).sum(axis=0)
        improved = False
        for _ in range(8):
            step = _solve(a + lam * (np.diag(np.diag(a)) + 1e-9 * np.eye(len(u))), -g)
            if step is None:
                lam *= 10
                continue
            trial = u + step
            rt = residual(trial)
            ct = cost(rt)
            if ct < best:
                gain = best - ct
                u, r, best, lam = trial, rt, ct, max(lam / 3, 1e-9)
                improved = True
                break
            lam *= 4
        if not improved or gain < 1e-12 * max(best, 1e-30):
            break
    return u, best


def _nelder_mead(f, x0: np.ndarray, iters: int = 3000, step: float = 0.1) -> np.ndarray:
    """Derivative-free polish of f from x0 (the hinge terms make the objective non-smooth)."""
    n = len(x0)
    simplex = [x0] + [x0 + step * np.eye(n)[i] for i in range(n)]
    values = [f(x) for x in simplex]
    for _ in range(iters):
        order = np.argsort(values)
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        if values[-1] - values[0] < 1e-12 * (abs(values[0]) + 1e-20):
            break
        centroid = np.mean(simplex[:-1], axis=0)
        reflected = centroid + (centroid - simplex[-1])
        fr = f(reflected)
        if fr < values[0]:
            expanded = centroid + 2 * (centroid - simplex[-1])
            fe = f(expanded)
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            contracted = centroid + 0.5 * (simplex[-1] - centroid)
            fc = f(contracted)
            if fc < values[-1]:
                simplex[-1], values[-1] = contracted, fc
            else:
                simplex = [simplex[0] + 0.5 * (x - simplex[0]) for x in simplex]
                values = [f(x) for x in simplex]
    return simplex[int(np.argmin(values))]
