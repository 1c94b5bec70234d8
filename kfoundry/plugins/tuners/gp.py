"""A small Gaussian process for tuning: Matern-5/2 kernel with one length scale per parameter (ARD).

Hyperparameters (length scales, signal and noise variance) are fitted by maximising the log marginal
likelihood with analytic gradients (L-BFGS-B), warm-started from the previous fit. Inputs live in
the unit cube (ordinal indices); targets are standardised.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.linalg import cho_solve, solve_triangular
from scipy.optimize import minimize
from scipy.special import ndtr

SQRT5 = math.sqrt(5.0)
LOG_2PI = math.log(2 * math.pi)


def _matern52(r: np.ndarray) -> np.ndarray:
    return (1.0 + SQRT5 * r + (5.0 / 3.0) * r * r) * np.exp(-SQRT5 * r)


class GaussianProcess:
    """GP regression with a Matern-5/2 ARD kernel and fitted hyperparameters."""

    def __init__(self, dims: int, min_length_scale: float = 0.03) -> None:
        self.dims = dims
        # theta = [log length scales..., log signal variance, log noise variance]
        self.theta = np.concatenate([np.full(dims, math.log(0.5)), [0.0, math.log(1e-2)]])
        self.bounds = [(math.log(min_length_scale), math.log(20.0))] * dims + [
            (math.log(0.05), math.log(20.0)),
            (math.log(1e-6), math.log(0.5)),
        ]
        self._x = np.empty((0, dims))
        self._fitted = False
        self._mean = 0.0
        self._std = 1.0

    def _nll(
        self, theta: np.ndarray, x: np.ndarray, y: np.ndarray, sq: np.ndarray
    ) -> tuple[float, np.ndarray]:
        ls2 = np.exp(2 * theta[: self.dims])
        sf2, sn2 = math.exp(theta[-2]), math.exp(theta[-1])
        r = np.sqrt(np.maximum((sq / ls2).sum(-1), 0.0))
        e = np.exp(-SQRT5 * r)
        kr = sf2 * (1.0 + SQRT5 * r + (5.0 / 3.0) * r * r) * e
        n = len(y)
        k = kr + sn2 * np.eye(n)
        try:
            c = np.linalg.cholesky(k)
        except np.linalg.LinAlgError:
            return 1e10, np.zeros_like(theta)
        c_inv = solve_triangular(c, np.eye(n), lower=True, check_finite=False)
        k_inv = c_inv.T @ c_inv
        alpha = k_inv @ y
        nll = 0.5 * float(y @ alpha) + float(np.log(np.diag(c)).sum()) + 0.5 * n * LOG_2PI
        w = np.outer(alpha, alpha) - k_inv
        grad = np.empty_like(theta)
        wc = (w * (sf2 * (5.0 / 3.0)) * (1.0 + SQRT5 * r) * e).reshape(-1)
        grad[: self.dims] = -0.5 * (wc @ sq.reshape(n * n, self.dims)) / ls2
        grad[-2] = -0.5 * float((w * kr).sum())
        grad[-1] = -0.5 * sn2 * float(np.trace(w))
        return nll, grad

    def fit(self, x: np.ndarray, y: np.ndarray, optimize: bool = True) -> None:
        """Condition on observations ``x`` (n x d, unit cube) and ``y`` (n); refit hyperparameters if asked."""
        self._mean = float(y.mean())
        self._std = float(y.std()) or 1.0
        ys = (y - self._mean) / self._std
        sq = (x[:, None, :] - x[None, :, :]) ** 2
        if optimize and len(y) >= 3:
            default = np.concatenate([np.full(self.dims, math.log(0.5)), [0.0, math.log(1e-2)]])
            starts = [self.theta] if self._fitted else [default]
            if self._fitted:
                starts.append(default)
            self._fitted = True
            best = None
            for start in starts:
                res = minimize(
                    self._nll,
                    start,
                    args=(x, ys, sq),
                    jac=True,
                    method="L-BFGS-B",
                    bounds=self.bounds,
                    options={"maxiter": 40},
                )
                if best is None or res.fun < best.fun:
                    best = res
            assert best is not None
            self.theta = best.x
        ls = np.exp(self.theta[: self.dims])
        sf2, sn2 = math.exp(self.theta[-2]), math.exp(self.theta[-1])
        k = sf2 * _matern52(np.sqrt((sq / ls**2).sum(-1))) + (sn2 + 1e-9) * np.eye(len(y))
        self._chol = np.linalg.cholesky(k)
        self._alpha = cho_solve((self._chol, True), ys)
        self._x = x
        self._ls = ls
        self._sf2 = sf2

    def predict(self, xs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and standard deviation at ``xs``, in standardised target units."""
        a, b = xs / self._ls, self._x / self._ls
        d2 = (a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2.0 * a @ b.T
        d = np.sqrt(np.maximum(d2, 0.0))
        ks = self._sf2 * _matern52(d)
        mean = ks @ self._alpha
        v = solve_triangular(self._chol, ks.T, lower=True)
        var = np.maximum(self._sf2 - (v * v).sum(0), 1e-12)
        return mean, np.sqrt(var)

    def standardise(self, y: float) -> float:
        return (y - self._mean) / self._std


def expected_improvement(mean: np.ndarray, std: np.ndarray, best: float, xi: float = 0.0) -> np.ndarray:
    """Expected improvement below ``best`` (minimisation)."""
    imp = best - mean - xi
    z = imp / std
    return imp * ndtr(z) + std * np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
