"""Small linear least squares for the speed model (:mod:`prefixroute.core.speed`): its normal
equations have two to four unknowns, solved with the feasibility rules of a speed (a rate
positive, a time not negative). Pure Python: a 4x4 solve is a few microseconds, and the core
takes no numerical library.
"""

from __future__ import annotations


def solve_feasible(
    a: list[list[float]], c: list[float], current: list[float], free: list[int]
) -> list[float]:
    """The least-squares solution of ``a theta = c`` over the unknowns in ``free`` (the others
    stay at ``current``), with ``1/rate`` (unknown 0) positive and the rest not negative: an
    unknown the solution makes infeasible is fixed (a step or overhead at 0; the rate at its
    current value: no time left for prefill) and the rest solved again."""
    fixed = {i: v for i, v in enumerate(current) if i not in free}
    theta = list(current)
    for _ in range(len(current)):
        free = [i for i in range(len(current)) if i not in fixed]
        if not free:
            return theta
        rhs = [c[i] - sum(a[i][j] * v for j, v in fixed.items() if v) for i in free]
        sol = _gauss([[a[i][j] for j in free] for i in free], rhs)
        if sol is None:
            return current
        theta = [fixed.get(i, 0.0) for i in range(len(current))]
        for i, v in zip(free, sol, strict=True):
            theta[i] = v
        bad = [i for i in free if (theta[i] <= 0 if i == 0 else theta[i] < 0)]
        if not bad:
            return theta
        for i in bad:
            fixed[i] = current[0] if i == 0 else 0.0
    return theta


def _gauss(a: list[list[float]], c: list[float]) -> list[float] | None:
    """``a x = c`` by Gaussian elimination with partial pivoting; None when ``a`` is singular."""
    n = len(c)
    if n == 2:  # Cramer's rule: the two-unknown fit's arithmetic, exactly as it always was
        det = a[0][0] * a[1][1] - a[0][1] * a[0][1]
        if det <= 0:
            return None
        return [(c[0] * a[1][1] - c[1] * a[0][1]) / det, (a[0][0] * c[1] - a[0][1] * c[0]) / det]
    m = [[*row, rhs] for row, rhs in zip(a, c, strict=True)]
    for k in range(n):
        p = max(range(k, n), key=lambda i: abs(m[i][k]))
        if abs(m[p][k]) < 1e-300:
            return None
        m[k], m[p] = m[p], m[k]
        for i in range(k + 1, n):
            f = m[i][k] / m[k][k]
            for j in range(k, n + 1):
                m[i][j] -= f * m[k][j]
    x = [0.0] * n
    for k in range(n - 1, -1, -1):
        x[k] = (m[k][n] - sum(m[k][j] * x[j] for j in range(k + 1, n))) / m[k][k]
    return x
