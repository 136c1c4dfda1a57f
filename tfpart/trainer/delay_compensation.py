"""The update a parameter server applies for one worker's gradient, in each
asynchronous mode: plain ASGD, DC-ASGD and the delay-adaptive DDC-ASGD.

Notation: ``w`` the weights now, ``g`` the gradient a worker computed at its copy
``w_bak`` of the weights, taken ``tau`` updates ago (the update's delay: how many other
updates the parameter servers applied between the worker's read and its update), ``v``
the velocity (momentum ``mu``), ``eta`` the learning rate.

``async`` (ASGD)::

    v <- mu * v + g
    w <- w - eta * v

``dc-asgd`` (Zheng et al., ICML 2017, the adaptive form DC-ASGD-a)::

    MS <- m * MS + (1 - m) * g * g                 mean square of the gradients
    lam = lam0 / sqrt(MS / (1 - m^t) + eps)        element-wise; t = this update's number
    g_hat = g + lam * g * g * (w - w_bak)          first-order Taylor term of g(w) - g(w_bak)
    v <- mu * v + g_hat
    w <- w - eta * v

``ddc-asgd`` (delay-adaptive; Qu, 2021, describes it as scaling the compensation and
the momentum term by each update's measured delay; the exact rule implemented here)::

    f = 1 / (1 + tau)                              the update's freshness
    F <- m * F + (1 - m) * f                       running mean freshness (on the servers)
    r = f / (F / (1 - m^t))                        freshness relative to the mean
    g_hat = g + lam * r * g * g * (w - w_bak)      lam, MS as in DC-ASGD
    v <- mu * v + r * g_hat
    w <- w - eta * v

Why: a gradient ``tau`` updates old is an estimate for weights that have since moved
``w - w_bak``. DC-ASGD corrects it with a first-order term, whose error grows with that
distance, and momentum then repeats the corrected gradient for about ``1/(1 - mu)``
updates. DDC-ASGD trusts both the correction and the gradient's entry into the momentum
in proportion to ``r``: an update staler than usual (a slow worker's) counts less, a
fresher one more. ``r`` averages 1 over the updates, so the mean step size stays
DC-ASGD's (a weight such as ``(1 + mean tau) / (1 + tau)`` is 1 at the mean delay but
averages more than 1 when delays vary, a larger step rather than a reweighting). With
one worker every delay is zero, ``w_bak = w`` and ``r = 1``: all three modes are plain
SGD with momentum.

Both running means start at zero, so, as Adam does, they are divided by ``1 - m^t``
(``t`` counts the servers' updates, this one included): without it ``MS`` is 20 times
too small at the first update (m = 0.95), ``lam`` about 4.5 times too large, and the
first few dozen compensations overshoot (BENCHMARKS.md has the accuracies measured with
and without it).

The functions take ``sqrt`` so that the same code runs on numpy arrays (tests) and on
TensorFlow tensors on the parameter servers (:mod:`tfpart.trainer.asynchronous`).

References
----------
Zheng, Meng, Wang, Chen, Yu, Ma, Liu. "Asynchronous Stochastic Gradient Descent with
Delay Compensation", ICML 2017.
Qu. PhD thesis, 2021 (DDC-ASGD).

Examples
--------
>>> import numpy as np
>>> w, w_bak, g = np.array([1.0]), np.array([0.5]), np.array([2.0])
>>> hyper = Hyper(learning_rate=0.1, lambda0=1.0, ms_decay=0.0, epsilon=0.0)
>>> new = update("dc-asgd", w, g, w_bak, np.zeros(1), np.zeros(1), 3, 0.25, hyper, np.sqrt,
...              step=1)
>>> float(new.w[0])  # g_hat = 2 + (1 / 2) * 4 * 0.5 = 3
0.7
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

ASYNC_MODES = ("async", "dc-asgd", "ddc-asgd")


@dataclass(frozen=True)
class Hyper:
    """Hyper-parameters of the asynchronous updates (the paper's λ0 = 2, m = 0.95)."""

    learning_rate: float = 0.05
    momentum: float = 0.0
    lambda0: float = 2.0
    ms_decay: float = 0.95
    epsilon: float = 1e-7


class Updated(NamedTuple):
    w: object
    ms: object  # mean square of the gradients (unchanged by ``async``)
    velocity: object
    mean_freshness: object  # running mean of 1 / (1 + tau) (changed by ``ddc-asgd`` only)


def freshness(tau, mean_freshness):
    """DDC-ASGD's weight of an update ``tau`` updates old: ``1 / (1 + tau)`` relative
    to the (unbiased) running mean of that.

    >>> freshness(0, 0.5), freshness(1, 0.5), freshness(3, 0.5)
    (2.0, 1.0, 0.5)
    """
    return 1.0 / (1.0 + tau) / mean_freshness


def running_freshness(tau, mean_freshness, hyper):
    """DDC-ASGD's running mean of ``1 / (1 + tau)`` once an update ``tau`` updates old is
    counted (not unbiased).

    >>> running_freshness(1, 0.5, Hyper(ms_decay=0.5))
    0.5
    """
    return hyper.ms_decay * mean_freshness + (1.0 - hyper.ms_decay) / (1.0 + tau)


def compensation_strength(ms, g, hyper, sqrt, unbias):
    """DC-ASGD's running mean square once ``g`` is counted, and the element-wise
    ``lam = lam0 / sqrt(MS / unbias + eps)`` from it (``unbias = 1 - m^t``).

    >>> import math
    >>> compensation_strength(0.0, 2.0, Hyper(lambda0=1.0, ms_decay=0.5, epsilon=0.0),
    ...                       math.sqrt, unbias=0.5)
    (2.0, 0.5)
    """
    ms = hyper.ms_decay * ms + (1.0 - hyper.ms_decay) * g * g
    return ms, hyper.lambda0 / sqrt(ms / unbias + hyper.epsilon)


def update(mode, w, g, w_bak, ms, velocity, tau, mean_freshness, hyper, sqrt, step):
    """The parameter server's new state after one gradient (rules in the module doc).

    Parameters
    ----------
    mode : {"async", "dc-asgd", "ddc-asgd"}
    w, g, w_bak, ms, velocity : arrays or tensors of one shape
    tau : number or scalar tensor
        The update's delay.
    mean_freshness : number or scalar tensor
        Running mean of ``1 / (1 + tau)`` before this update, not yet unbiased
        (``ddc-asgd`` only).
    hyper : Hyper
    sqrt : callable
        ``numpy.sqrt`` or ``tf.sqrt``.
    step : number or scalar tensor
        This update's number ``t`` on the servers, counting from 1.

    Returns
    -------
    Updated
    """
    if mode not in ASYNC_MODES:
        raise ValueError(f"unknown asynchronous mode {mode!r}; one of {ASYNC_MODES}")
    corrected = g
    weight = 1.0
    if mode != "async":
        unbias = 1.0 - hyper.ms_decay ** step  # the running means start at zero
        ms, lam = compensation_strength(ms, g, hyper, sqrt, unbias)
        if mode == "ddc-asgd":
            mean_freshness = running_freshness(tau, mean_freshness, hyper)
            weight = freshness(tau, mean_freshness / unbias)
        corrected = g + lam * weight * g * g * (w - w_bak)
    velocity = hyper.momentum * velocity + weight * corrected
    return Updated(w - hyper.learning_rate * velocity, ms, velocity, mean_freshness)
