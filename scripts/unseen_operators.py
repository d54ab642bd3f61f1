"""Three operator families nobody tuned the memory model for: the benchmark's operator
families for issue 33, item 7.

They were written and committed before their first measurement and not changed after
(2026-11-26).  They are written the way a user would write them: plain code that declares
a halo and the axes that must stay whole, and nothing else (default ``axis_classes``,
default ``block_multiple``).

They are not part of the product's registry (``operators/__init__.py`` does not import this
module); they are loaded through ``EXPLORER_PLUGINS``::

    EXPLORER_PLUGINS=unseen_operators PYTHONPATH=scripts ...      # or, from the repo root:
    EXPLORER_PLUGINS=scripts.unseen_operators ...

* ``unseen_fft_samples``: a Butterworth band-pass along the samples axis, through a
  zero-padded rfft of a fast length;
* ``unseen_median``: a 3 x 3 x 5 median filter (``scipy.ndimage.median_filter``);
* ``unseen_torch_conv``: a small seeded stack of three 3x3x3 torch convolutions, CPU.

Imports only numpy, scipy, operators, and torch (inside ``run``).
"""

from __future__ import annotations

import numpy as np
import scipy.fft
import scipy.ndimage

from operators import Operator, register


@register
class UnseenFftSamples(Operator):
    """A band-pass filter along the samples axis, in the frequency domain.

    Each trace is zero-padded to ``n = scipy.fft.next_fast_len(2 * ns)`` (no wrap-around),
    transformed with ``scipy.fft.rfft``, multiplied by a Butterworth band-pass magnitude
    response (order 4, corners at ``low`` and ``high`` in cycles per sample), transformed
    back with ``irfft`` and cropped to ``ns``.  The samples axis is never chunked.
    """

    name = "unseen_fft_samples"
    description = "Butterworth band-pass along samples via a zero-padded rfft (benchmark plugin)"
    halo = (0, 0, 0)
    whole_axes = (2,)

    low = 0.02  # cycles per sample
    high = 0.2
    order = 4

    def response(self, n: int) -> np.ndarray:
        """The filter's magnitude on the rfft frequencies of length ``n``."""
        f = scipy.fft.rfftfreq(n)
        highpass = np.ones_like(f)
        nonzero = f > 0
        highpass[nonzero] = 1.0 / np.sqrt(1.0 + (self.low / f[nonzero]) ** (2 * self.order))
        highpass[~nonzero] = 0.0
        lowpass = 1.0 / np.sqrt(1.0 + (f / self.high) ** (2 * self.order))
        return (highpass * lowpass).astype(np.float32)

    def run(self, block: np.ndarray) -> np.ndarray:
        block = np.asarray(block, dtype=np.float32)
        ns = block.shape[2]
        n = scipy.fft.next_fast_len(2 * ns)
        spectrum = scipy.fft.rfft(block, n=n, axis=2)
        spectrum *= self.response(n)
        filtered = scipy.fft.irfft(spectrum, n=n, axis=2)
        return np.ascontiguousarray(filtered[:, :, :ns], dtype=np.float32)


@register
class UnseenMedian(Operator):
    """A 3 x 3 x 5 median filter (a rank filter), reflecting at the volume's edges."""

    name = "unseen_median"
    description = "3x3x5 median filter, mode reflect (benchmark plugin)"
    halo = (1, 1, 2)

    size = (3, 3, 5)

    def run(self, block: np.ndarray) -> np.ndarray:
        block = np.asarray(block, dtype=np.float32)
        return scipy.ndimage.median_filter(block, size=self.size, mode="reflect").astype(np.float32, copy=False)


#: The network of ``unseen_torch_conv``, built by its first run in a process.
_NETWORK = None


def _network():
    global _NETWORK
    if _NETWORK is None:
        import torch
        from torch import nn

        torch.manual_seed(0)
        net = nn.Sequential(
            nn.Conv3d(1, 4, 3, padding=1),
            nn.ReLU(),
            nn.Conv3d(4, 4, 3, padding=1),
            nn.ReLU(),
            nn.Conv3d(4, 1, 3, padding=1),
        )
        net.eval()
        _NETWORK = net
    return _NETWORK


@register
class UnseenTorchConv(Operator):
    """A small 3D convolution network on torch, CPU, float32, one thread.

    Three 3x3x3 ``Conv3d`` layers (1 -> 4 -> 4 -> 1 channels, zero padding 1, ReLU between),
    weights from ``torch.manual_seed(0)``, built once per process on the first run and
    evaluated under ``torch.inference_mode()``.
    """

    name = "unseen_torch_conv"
    description = "three seeded 3x3x3 Conv3d layers with ReLU, torch CPU, 1 thread (benchmark plugin)"
    halo = (3, 3, 3)

    def run(self, block: np.ndarray) -> np.ndarray:
        import torch

        torch.set_num_threads(1)
        net = _network()
        x = np.array(block, dtype=np.float32, order="C")  # torch.from_numpy wants its own writeable array
        with torch.inference_mode():
            y = net(torch.from_numpy(x)[None, None])
        return y[0, 0].numpy().astype(np.float32, copy=False)
