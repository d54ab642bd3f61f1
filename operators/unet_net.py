"""The torch half of ``unet3d`` (imported on first use by :mod:`operators.unet`, never by
``import operators``): the FaultSeg3D network, its seeded weights and one block's forward pass.

Architecture, from the authors' code (``unet3.py`` of github.com/xinwucwp/faultSeg, Keras)
and Wu, Liang, Shi & Fomel (2019), Geophysics 84(3), IM35-IM45; every convolution is 3x3x3
with zero ("same") padding and a ReLU unless stated::

    level 1 (full res)  enc 1 -> 16 -> 16             skip s1   dec 48 -> 16 -> 16, 1x1x1 conv -> 1, sigmoid
    level 2 (/2)        maxpool, enc 16 -> 32 -> 32   skip s2   dec 96 -> 32 -> 32, up 2
    level 3 (/4)        maxpool, enc 32 -> 64 -> 64   skip s3   dec 576 -> 64 -> 64, up 2
    bottleneck (/8)     maxpool, 64 -> 512 -> 512, up 2

A decoder level's input is ``concatenate([upsample2(deeper), skip])`` (Keras
``UpSampling3D``: nearest neighbour, the upsampled channels first).

The forward pass is written for memory, with the arithmetic of the plain one (equal to
float32 rounding): ReLUs in place, every activation released as soon as its last consumer
has run, the nearest upsampling written straight into the concatenation buffer (no
upsampled temporary), and two choices measured on this machine (in-process peaks, 1 thread):

* every convolution runs through oneDNN (``torch.ops.aten.mkldnn_convolution``). PyTorch's
  own dispatch sends a 3x3x3 convolution of one sample with ``C * D * H <= 20480`` (input
  channels times the first two spatial dims of its level) to ``slow_conv3d``, whose
  vol2col buffer holds ``27 * C`` floats per voxel of that level: a peak that jumps with
  ``n1 * n2`` but not ``n3`` (64 MiB at 32^3 and 575 B/voxel at 40x64x64 and 48^3, against
  30 MiB and 448 B/voxel with oneDNN everywhere);
* activations are channels-last (NDHWC), a layout oneDNN convolves directly; in PyTorch's
  default NCDHW layout each convolution's input is first reordered to oneDNN's blocked
  layout, a transient copy (448 B/voxel at the peak instead of 320, and 20% slower).

Without oneDNN in the torch build the convolutions fall back to ``torch.nn.Conv3d``.
"""

from __future__ import annotations

import threading

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

#: Filters of the encoder levels (the decoder mirrors them) and of the bottleneck.
ENCODER_FILTERS = (16, 32, 64)
BOTTLENECK_FILTERS = 512
#: Seed of the untrained weights.
SEED = 0
#: Layout of the weights and activations (see the module docstring).
LAYOUT = torch.channels_last_3d
_ONEDNN = torch.backends.mkldnn.is_available()


def conv3d(conv: nn.Conv3d, x: torch.Tensor) -> torch.Tensor:
    """``conv(x)`` through oneDNN whatever the size (PyTorch's dispatch would pick
    ``slow_conv3d`` for small inputs; see the module docstring). Other dtypes than float32
    (oneDNN has no float64) go through PyTorch's dispatch."""
    if not _ONEDNN or x.dtype != torch.float32:
        return conv(x)
    return torch.ops.aten.mkldnn_convolution(x, conv.weight, conv.bias, conv.padding, conv.stride, conv.dilation,
                                             conv.groups)


class DoubleConv(nn.Module):
    """Two 3x3x3 convolutions with zero padding, each followed by an in-place ReLU."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.conv1 = nn.Conv3d(in_channels, out_channels, 3, padding=1)
        self.conv2 = nn.Conv3d(out_channels, out_channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu_(conv3d(self.conv1, x))
        return torch.relu_(conv3d(self.conv2, x))


def upsample_concat(deep: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
    """``concatenate([nearest_upsample_2x(deep), skip], channels)`` in one channels-last buffer."""
    n, c, d, h, w = deep.shape
    out = torch.empty((n, c + skip.shape[1], 2 * d, 2 * h, 2 * w), dtype=deep.dtype, memory_format=LAYOUT)
    # Splitting each spatial dim in two is a view of any strided tensor: (d,2,h,2,w,2).
    out[:, :c].view(n, c, d, 2, h, 2, w, 2).copy_(
        deep[:, :, :, None, :, None, :, None].expand(n, c, d, 2, h, 2, w, 2))
    out[:, c:].copy_(skip)
    return out


class FaultSeg3D(nn.Module):
    """The FaultSeg3D U-Net (3 pooling levels; 16, 32, 64 filters; 512 in the bottleneck)."""

    def __init__(self):
        super().__init__()
        f1, f2, f3 = ENCODER_FILTERS
        self.enc1 = DoubleConv(1, f1)
        self.enc2 = DoubleConv(f1, f2)
        self.enc3 = DoubleConv(f2, f3)
        self.bottleneck = DoubleConv(f3, BOTTLENECK_FILTERS)
        self.dec3 = DoubleConv(BOTTLENECK_FILTERS + f3, f3)
        self.dec2 = DoubleConv(f3 + f2, f2)
        self.dec1 = DoubleConv(f2 + f1, f1)
        self.head = nn.Conv3d(f1, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Fault probability of ``x`` (1, 1, n1, n2, n3), each n a multiple of 8."""
        s1 = self.enc1(x)
        s2 = self.enc2(F.max_pool3d(s1, 2))
        s3 = self.enc3(F.max_pool3d(s2, 2))
        y = self.bottleneck(F.max_pool3d(s3, 2))
        y = upsample_concat(y, s3)
        del s3
        y = self.dec3(y)
        y = upsample_concat(y, s2)
        del s2
        y = self.dec2(y)
        y = upsample_concat(y, s1)
        del s1
        y = self.dec1(y)
        return torch.sigmoid_(conv3d(self.head, y))


def build(seed: int = SEED) -> FaultSeg3D:
    """The network with untrained weights drawn from ``seed``, in evaluation mode.

    He (Kaiming) normal weights for ReLU (fan-in, gain sqrt(2)) and zero biases: they keep
    the activations' scale through the 15 layers, so the output varies with the input
    (PyTorch's default uniform initialisation shrinks it to a near-constant 0.5). Drawn
    under a forked RNG: the caller's torch random state is left as it was.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = FaultSeg3D()
        for module in model.modules():
            if isinstance(module, nn.Conv3d):
                nn.init.kaiming_normal_(module.weight, nonlinearity="relu")
                nn.init.zeros_(module.bias)
    return model.eval().requires_grad_(False).to(memory_format=LAYOUT)


_lock = threading.Lock()
_model: FaultSeg3D | None = None


def model() -> FaultSeg3D:
    """The process's one network, built on first use, when torch is also set to one
    intra-op thread (Dask's threads are the parallelism; see :mod:`operators.unet`)."""
    global _model
    if _model is None:
        with _lock:
            if _model is None:
                torch.set_num_threads(1)
                _model = build()
    return _model


def forward(padded: np.ndarray) -> np.ndarray:
    """Fault probability of a float32 C-contiguous block whose dims are multiples of 8.

    torch reports a failed CPU allocation as a ``RuntimeError`` ("DefaultCPUAllocator:
    can't allocate memory"); it is raised as ``MemoryError``, as NumPy does, so that a
    profile capped by ``RLIMIT_DATA`` ends ``exceeded`` (a lower bound), not ``error``.
    """
    net = model()
    try:
        with torch.inference_mode():
            # One channel: the NCDHW view of the block is already channels-last (no copy).
            x = torch.from_numpy(padded)[None, None].contiguous(memory_format=LAYOUT)
            return net(x)[0, 0].numpy()
    except RuntimeError as exc:
        if "can't allocate memory" in str(exc):
            raise MemoryError(str(exc).splitlines()[0]) from None
        raise
