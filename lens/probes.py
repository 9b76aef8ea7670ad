"""Concept probes over text features: the directions and biases a lens pack projects onto.

`means` is the difference of class means; `logistic` one-vs-rest logistic regression on standardised
features (robust to a few huge dimensions, such as an attention sink's).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

METHODS = ("means", "logistic")


def fit_means(features: np.ndarray, members: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Difference of class means, scaled so the concept mean scores +0.5 and the rest's −0.5."""
    x = np.asarray(features, dtype=np.float64)
    directions, biases = [], []
    for m in members:
        inside = np.zeros(len(x), dtype=bool)
        inside[list(m)] = True
        mu_in, mu_out = x[inside].mean(0), x[~inside].mean(0)
        d = mu_in - mu_out
        norm2 = float(d @ d)
        w = d / norm2 if norm2 > 0 else d
        directions.append(w)
        biases.append(-float(w @ (mu_in + mu_out) / 2))
    return np.asarray(directions, dtype=np.float32), np.asarray(biases, dtype=np.float32)


def fit_logistic(features: np.ndarray, members: Sequence[Sequence[int]], l2: float = 1e-2,
                 iterations: int = 200) -> tuple[np.ndarray, np.ndarray]:
    """One-vs-rest logistic probes (class-balanced, L2 on the standardised weights)."""
    import torch

    x = torch.as_tensor(np.asarray(features, dtype=np.float64))
    mean, std = x.mean(0), x.std(0, unbiased=False).clamp(min=1e-8)
    z = (x - mean) / std
    directions, biases = [], []
    for m in members:
        y = torch.zeros(len(x), dtype=torch.float64)
        y[list(m)] = 1.0
        pos = float(y.sum())
        weight = torch.where(y > 0, 0.5 / pos, 0.5 / (len(y) - pos))
        w = torch.zeros(z.shape[1], dtype=torch.float64, requires_grad=True)
        b = torch.zeros((), dtype=torch.float64, requires_grad=True)
        opt = torch.optim.LBFGS([w, b], max_iter=iterations, line_search_fn="strong_wolfe")

        def closure(opt=opt, w=w, b=b, weight=weight, y=y):
            opt.zero_grad()
            logits = z @ w + b
            loss = (weight * torch.nn.functional.binary_cross_entropy_with_logits(
                logits, y, reduction="none")).sum() + l2 * (w @ w)
            loss.backward()
            return loss

        opt.step(closure)
        with torch.no_grad():
            raw_w = w / std
            directions.append(raw_w.numpy())
            biases.append(float(b - raw_w @ mean))
    return np.asarray(directions, dtype=np.float32), np.asarray(biases, dtype=np.float32)


def fit(features: np.ndarray, members: Sequence[Sequence[int]], method: str = "means"):
    if method == "means":
        return fit_means(features, members)
    if method == "logistic":
        return fit_logistic(features, members)
    raise ValueError(f"method: must be one of {', '.join(METHODS)}, got {method!r}")
