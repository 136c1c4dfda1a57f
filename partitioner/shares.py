"""Whole shares of a batch in proportion to device speeds (largest remainder).

Data-parallel replicas and filter splits give each device a share of the same work in
proportion to its speed, as Moreno-Álvarez et al. do for convolution filters: each
device first gets the whole part of its exact share, then the units still unassigned
go one each to the largest remainders (Hamilton's method). Shares then sum to the
total, each is within one of its exact proportion, and a faster device never gets
less than a slower one. A device whose share comes out zero takes no part, and so does
one of speed zero (it cannot run the work at all).

References
----------
Moreno-Álvarez, Haut, Paoletti, Rico-Gallego, Díaz-Martín, Plaza. "Training deep
neural networks: a static load balancing approach", Neurocomputing, 2021.

Examples
--------
>>> proportional_shares(10, [3.0, 1.0, 1.0])
[6, 2, 2]
>>> proportional_shares(7, [2.0, 1.0])  # exact 4.67 and 2.33
[5, 2]
>>> proportional_shares(2, [5.0, 1.0, 1.0])  # the slow ones take no part
[2, 0, 0]
>>> proportional_shares(4, [5146.2, 0.0])  # a device that cannot run it takes none
[4, 0]
"""
from __future__ import annotations

import numpy as np


def proportional_shares(total, speeds):
    """``total`` whole units split in proportion to ``speeds`` (largest remainder;
    ties go to the faster device, then the earlier one).

    Parameters
    ----------
    total : int
        Units to share (samples of a batch, filters of a layer), at least 0.
    speeds : sequence of float
        Relative speeds, one per device: finite, not negative, at least one positive
        (a device of speed 0 gets no share).

    Returns
    -------
    list of int
        One share per device, summing to ``total``.

    Raises
    ------
    ValueError
        If ``total`` is negative, a speed is negative or not finite, or none is
        positive.
    """
    speeds = np.asarray(speeds, dtype=float)
    if total < 0 or len(speeds) == 0 or not np.all(np.isfinite(speeds) & (speeds >= 0)) \
            or not np.any(speeds > 0):
        raise ValueError(f"cannot share {total} units among speeds {speeds.tolist()}")
    exact = total * speeds / speeds.sum()
    shares = np.floor(exact).astype(np.int64)
    left = int(total - shares.sum())
    order = np.lexsort((np.arange(len(speeds)), -speeds, -(exact - shares)))
    shares[order[:left]] += 1
    return shares.tolist()
