"""The response rule's lag clause: does a head's attention keep moving one way over several epochs by less per epoch
than its own jitter? (this project, beside ViTCAE's convergence rule, Jebraeeli et al., arXiv 2509.16554, section
"Convergence diagnostics"; docs/dynamics.md, "The lag clause").

A head's scores (the centred log-attention of :func:`~vitlab.diagnostics.dynamics.score_drift`) are modelled as a
movement plus independent jitter, ``z_t = m_t + e_t``. Their mean squared displacement (MSD) over ``k`` epochs is
then ``|m_t - m_{t-k}|^2 + s_t + s_{t-k}`` (``s``: the jitter's variance), so the displacement over ``K`` epochs less
the mean of the one-epoch displacements at both ends of the window removes the jitter, even a jitter that falls, and
leaves the movement: ``(K^2 - 1) v^2`` for a steady movement of ``v`` an epoch, ``(K - 1) v^2`` for a random walk, 0
for jitter. This is the variance ratio of Lo and MacKinlay ("Stock market prices do not follow random walks", Review
of Financial Studies 1, 1988, eq. 12: ``VR(q) - 1``), with the one-epoch variance taken at both ends of the window; in
particle tracking it is the excess of the MSD curve over a flat (confined) one.
"""

from __future__ import annotations

import torch

from vitlab.diagnostics.dynamics import score_drift


def score_msd(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Mean squared displacement of a head's scores between two probe measurements ``p, q: [..., P, N]`` (``P``
    images, distributions over ``N`` patches) -> ``[...]`` float64: the squared :func:`score_drift`, averaged over
    the images."""
    return score_drift(p, q).pow(2).mean(dim=-1)


def lag_excess(
    long: torch.Tensor, short_now: torch.Tensor, short_then: torch.Tensor, lag: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The movement in a window of ``lag = K`` epochs that its jitter does not explain (module doc).

    ``long``: the MSD between epochs ``t - K`` and ``t``; ``short_now``, ``short_then``: the one-epoch MSDs ending at
    ``t`` and at ``t - K + 1`` (the window's two ends), all ``[...]``. Returns ``(ratio, speed)``, ``[...]`` float64:
    ``ratio = (long - J) / J`` with ``J = (short_now + short_then) / 2`` (the variance ratio less one: 0 for jitter,
    ``K - 1`` for a random walk, ``(K^2 - 1) v^2 / (v^2 + 2 s)`` for a steady movement of ``v`` an epoch under a
    jitter of variance ``s``; 0 where nothing moved), and ``speed = sqrt(max(long - J, 0) / (K^2 - 1))``, the steady
    movement per epoch that would leave that excess.
    """
    if lag < 2:
        raise ValueError(f"lag must be >= 2 epochs (a displacement over one epoch is the jitter), got {lag}")
    long, jitter = long.double(), (short_now.double() + short_then.double()) / 2
    excess = long - jitter
    ratio = torch.where(jitter == 0, torch.zeros_like(excess), excess / jitter)  # NaN stays NaN
    return ratio, (excess.clamp_min(0) / (lag**2 - 1)).sqrt()


def lag_series(lagged: torch.Tensor, rates: torch.Tensor, lag: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`lag_excess` at every epoch of a head grid's history: ``lagged: [T, 2, L, H]`` the score MSDs over one
    and over ``lag`` epochs ending at each epoch (:meth:`LagWindow.push`), ``rates: [T, L, H]`` each epoch's rate.
    Returns ``(ratio, speed)``, each ``[T, L, H]`` float64 (NaN where not measured), the speed per unit of the
    window's mean rate."""
    steps, nan = lagged[:, 0], torch.full_like(rates, float("nan"), dtype=torch.float64)
    if len(steps) < lag:
        return nan, nan
    then = torch.cat([nan[: lag - 1], steps[: len(steps) - lag + 1]])
    ratio, speed = lag_excess(lagged[:, 1], steps, then, lag)
    summed = torch.cat([torch.zeros_like(rates[:1]), rates.cumsum(0)]).double()
    mean_rate = torch.cat([torch.ones_like(nan[: lag - 1]), (summed[lag:] - summed[:-lag]) / lag])
    return ratio, speed / mean_rate


class LagWindow:
    """The last ``lag`` probe measurements ``[L, H, P, N]`` (distributions, as measured), to compare the newest with
    the one ``lag`` epochs before it. Memory: ``lag`` measurements, ``lag * L * H * P * N * 4`` bytes in float32
    (12 layers of 12 heads, 256 images of 256 patches: 38 MB each)."""

    def __init__(self, lag: int) -> None:
        if lag < 2:
            raise ValueError(f"lag must be >= 2 epochs, got {lag}")
        self.lag = lag
        self.measurements: list[torch.Tensor] = []

    def push(self, current: torch.Tensor) -> torch.Tensor:
        """Add ``current: [L, H, P, N]``; returns the MSDs ``[2, L, H]`` float64 of the scores over one epoch and over
        ``lag`` epochs (:func:`score_msd`, on the images both hold; NaN until there are ``lag`` epochs before it)."""
        window, shape = self.measurements, current.shape[:2]
        nan = torch.full(shape, float("nan"), dtype=torch.float64)

        def msd(before: torch.Tensor) -> torch.Tensor:
            common = min(before.shape[2], current.shape[2])
            return score_msd(current[:, :, :common], before[:, :, :common])

        out = torch.stack([msd(window[-1]) if window else nan, msd(window[0]) if len(window) == self.lag else nan])
        self.measurements = [*window, current][-self.lag :]
        return out
