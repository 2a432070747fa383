"""FLAP's statistics, metric and compression, transcribed in float64 as references for the tests.

From CASIA-LMC-Lab/FLAP (An et al. 2024): ``lib/layerwrapper.py::BiasGPT.add_batch``
(the running mean ``baseline_inp`` and fluctuation ``fluc_inp`` of a layer's
inputs, with its in-place aliasing kept: ``old_baseline_inp`` is the same
tensor as the updated mean), the "WIFV" metric of ``lib/prune.py`` (per
input channel, squared and summed per head for the attention output), and
``compress``'s bias, ``(mean * ~mask) @ W.T``. Written here from the code's
formulas, in float64 where FLAP uses float32/float16.
"""

from __future__ import annotations

import torch

Tensor = torch.Tensor


class BiasGPT:
    """``BiasGPT`` with ``metric="WIFV"``: one ``add_batch(inp)`` per calibration sample, ``inp`` of ``(batch, seq, in)``."""

    def __init__(self, in_dim: int) -> None:
        self.nsamples = 0
        self.baseline_inp = torch.zeros(in_dim, dtype=torch.float64)
        self.fluc_inp: Tensor | float = torch.zeros(in_dim, dtype=torch.float64)

    def add_batch(self, inp: Tensor) -> None:
        if inp.dim() == 2:
            inp = inp.unsqueeze(0)
        batch_size = inp.shape[0]
        inp = inp.reshape(-1, inp.shape[-1]).t().to(torch.float64)  # (dim, seqlen)
        old_baseline_inp = self.baseline_inp  # the same tensor: updated in place below, as in FLAP
        self.baseline_inp *= self.nsamples / (self.nsamples + batch_size)
        self.baseline_inp += torch.mean(inp, dim=1) / (self.nsamples + batch_size)
        if self.nsamples == 0:
            self.fluc_inp = 0.0
        else:
            self.fluc_inp = self.fluc_inp * ((self.nsamples - 1) / (self.nsamples + batch_size - 1))
            self.fluc_inp = self.fluc_inp + torch.sum(
                (inp - self.baseline_inp.unsqueeze(1)) * (inp - old_baseline_inp.unsqueeze(1)), dim=1
            ) / (self.nsamples + batch_size)
        self.nsamples += batch_size


def wifv(fluc: Tensor, weight: Tensor) -> Tensor:
    """``metrics["WIFV"]``: ``fluc_inp * sum(W ** 2, dim=0)`` for a Linear weight ``(out, in)``."""
    return fluc * weight.to(torch.float64).pow(2).sum(dim=0)


def head_metric(fluc: Tensor, weight: Tensor, head_dim: int) -> Tensor:
    """The attention output's per-head metric of FLAP's per-layer structures: ``(WIFV ** 2)`` summed per head."""
    return (wifv(fluc, weight) ** 2).reshape(-1, head_dim).sum(dim=1)


def keep_ul(metric: Tensor, count: int) -> Tensor:
    """FLAP's per-layer mask: ``metric >= sort(metric)[count]`` (``count`` units pruned where metrics differ)."""
    thresh = torch.sort(metric)[0][count]
    return metric >= thresh


def compress_bias(mean: Tensor, keep: Tensor, weight: Tensor) -> Tensor:
    """``compress``'s new bias: ``(mean * ~mask) @ W.T`` (``keep``: one flag per input channel)."""
    return (mean.to(torch.float64) * ~keep) @ weight.to(torch.float64).T
