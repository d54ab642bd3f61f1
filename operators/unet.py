"""``unet3d``: 3D U-Net fault segmentation (FaultSeg3D) on torch, CPU, float32.

This module is cheap to import: torch and the network live in :mod:`operators.unet_net`,
imported by the first ``run``.
"""

from __future__ import annotations

import numpy as np

from operators.base import Operator, Shape, register

__all__ = ["HALO", "MULTIPLE", "UNet3D", "aligned_chunks", "aligned_halo", "dependency_reach", "padded_shape"]

#: Pooling levels of the network; a block is padded to a multiple of 2**LEVELS per axis.
LEVELS = 3
MULTIPLE = 2**LEVELS


def padded_shape(shape: Shape) -> Shape:
    """The shape the network sees: each dim rounded up to a multiple of 8."""
    return tuple(-(-int(n) // MULTIPLE) * MULTIPLE for n in shape)


def dependency_reach(levels: int = LEVELS) -> list[tuple[int, int]]:
    """How far (samples before, samples after) the inputs of an output sample reach, for an
    output at each position ``r = 0 .. 7`` modulo 8 of the pooling grid.

    Interval arithmetic on one axis (the network's supports are separable), the pooling
    grid anchored at sample 0: two 3x3x3 convolutions widen an interval by 2 at their
    level, a 2x max-pool maps positions ``[a, b]`` of the coarse level to ``[2a, 2b + 1]``
    of the finer one, a nearest 2x upsampling maps ``p`` to ``p // 2``, and a decoder level
    depends on its skip and on the upsampled deeper level. The zero padding of a
    convolution at a block face is covered: a coarse position whose neighbour lies outside
    the block reaches outside. For FaultSeg3D: (46, 45), (47, 44), (48, 51), (49, 50),
    (50, 49), (51, 48), (44, 47), (45, 46) (checked by perturbing single inputs in
    tests/test_unet.py).
    """

    def encoder(level: int, lo: int, hi: int) -> tuple[int, int]:
        lo, hi = lo - 2, hi + 2
        return (lo, hi) if level == 0 else encoder(level - 1, 2 * lo, 2 * hi + 1)

    def decoder(level: int, lo: int, hi: int) -> tuple[int, int]:
        if level == levels:  # the bottleneck: an encoder level without a skip
            return encoder(level, lo, hi)
        lo, hi = lo - 2, hi + 2
        skip, deep = encoder(level, lo, hi), decoder(level + 1, lo // 2, hi // 2)
        return min(skip[0], deep[0]), max(skip[1], deep[1])

    step = 2**levels
    return [(r - lo, hi - r) for r, (lo, hi) in ((r, decoder(0, r, r)) for r in range(step))]


def aligned_halo(levels: int = LEVELS) -> int:
    """The smallest halo, a multiple of ``2**levels``, that makes a block's trimmed output
    equal the whole volume's when the block's origin is on the whole volume's pooling grid.

    The halo must be a multiple of 8 for the origin (chunk boundary minus halo) to stay on
    the grid. The first kept output then sits at position ``h + r`` of its block, r = 0..7,
    and needs ``reach_before(r) <= h + r``; the last kept ones, ``7 - s`` modulo 8 at
    distance ``h + s`` from the block's end, need ``reach_after(7 - s) <= h + s``. Both
    give h >= 46 for FaultSeg3D (while the plain radius, over all positions, is 51): 48.
    """
    reach = dependency_reach(levels)
    step = 2**levels
    need = max(max(reach[r][0] - r, reach[step - 1 - r][1] - r) for r in range(step))
    return -(-need // step) * step


#: The halo on each axis (48 for FaultSeg3D).
HALO = aligned_halo()


def aligned_chunks(chunks: tuple[int, ...], halo: int, step: int = MULTIPLE) -> tuple[int, ...]:
    """One axis's chunks with every boundary on a multiple of ``step`` and every chunk at
    least ``halo`` long (so that ``map_overlap`` does not merge them again, off the grid).

    Each inner boundary is rounded to the nearest multiple of ``step``; going left to
    right, a boundary is kept only if the chunk it closes is at least ``halo`` long, and
    the last boundaries are dropped while the last chunk is shorter than ``halo``. Chunks
    that already satisfy both are returned unchanged; an axis no longer than ``halo``
    comes back in one chunk.
    """
    length = int(sum(chunks))
    kept: list[int] = []
    edge = 0
    for c in chunks[:-1]:
        edge += int(c)
        boundary = int(step * round(edge / step))
        if boundary - (kept[-1] if kept else 0) >= max(halo, 1) and boundary < length:
            kept.append(boundary)
    while kept and length - kept[-1] < halo:
        kept.pop()
    edges = [0, *kept, length]
    return tuple(b - a for a, b in zip(edges[:-1], edges[1:]))


@register
class UNet3D(Operator):
    """Fault probability from the FaultSeg3D 3D U-Net (Wu, Liang, Shi & Fomel 2019,
    "FaultSeg3D: using synthetic data sets to train an end-to-end convolutional neural
    network for 3D seismic fault segmentation", Geophysics 84(3), IM35-IM45; the authors'
    Keras code is ``unet3.py`` in github.com/xinwucwp/faultSeg).

    Network: a U-Net with 3 max-pool levels. Encoder levels of two 3x3x3 conv + ReLU with
    16, 32 and 64 filters, each followed by a 2x2x2 max-pool; a bottleneck of two 3x3x3
    conv + ReLU with 512 filters; decoder levels of 2x nearest upsampling, concatenation
    with the encoder's skip and two 3x3x3 conv + ReLU with 64, 32 and 16 filters; a 1x1x1
    convolution to one channel and a sigmoid. 9.42 M parameters (36 MiB of float32).
    Details in :mod:`operators.unet_net`.

    **Untrained weights**: He-normal weights and zero biases from ``torch.manual_seed(0)``,
    nothing downloaded. The memory and time are the network's; the output is a
    deterministic function of the input in [0, 1], not a trained fault probability. No
    normalisation is applied (FaultSeg3D standardises the whole volume beforehand; a
    per-block one would break the block form).

    **Padding**: each axis is padded at its end (never its start, so the pooling grid stays
    anchored at the block's first sample) to a multiple of 8, by ``reflect``; the output is
    trimmed back. Reflect rather than zeros: the pad becomes input of the network, and a
    zero pad would put an artificial amplitude edge (which a fault detector reads as a
    discontinuity) up to 7 samples inside its receptive field; reflection continues the
    reflectors. Either pad lies at the volume's end in both the whole and the block form, so
    the choice does not affect their agreement. Beyond the pad, the convolutions' own zero
    ("same") padding at the block's faces is the network's, as in FaultSeg3D.

    **Halo** 48 on each axis (:func:`aligned_halo`): an output sample's inputs reach up to
    51 samples away, depending on its position modulo 8 (:func:`dependency_reach`); with
    a block's origin on the whole volume's pooling grid (the halo a multiple of 8, the
    chunk boundaries multiples of 8), the kept outputs nearest a block face are the ones
    whose reach toward it is shortest, and 46 samples suffice, rounded up to 48. A halo of
    40 leaves differences up to 2e-3 (measured). The Dask form, the inherited
    ``map_overlap`` (``boundary="none"``) on chunks aligned by :meth:`dask`, equals ``run``
    on the whole volume to **max |block - whole| <= 1e-6** (probabilities; float32
    rounding of oneDNN kernels blocked per shape; 4.2e-7 is the largest difference
    measured, tests/test_unet.py). Without the alignment, chunk boundaries off the multiple
    of 8 shift a block's pooling grid and its output differs from the whole volume's in
    30-78% of the samples, not only at a seam (up to 0.17 measured, for outputs of std
    0.02-0.03): see :meth:`dask`.

    **Threads**: torch runs with one intra-op thread per process (``torch.set_num_threads(1)``
    at first use, which applies to the whole process, other torch code included); Dask's
    task threads give the parallelism. The memory model of unet3d is for one torch thread
    per task.

    **Memory**: the first ``run`` in a process imports torch and builds the network (36 MiB
    of weights, resident from then on, as in a Dask worker that has run one task). A run's
    peak is a function of the padded dims: its activations (channels-last, every
    convolution through oneDNN: see :mod:`operators.unet_net`), at least the transient
    reordered copy of the bottleneck's 27 MiB of weights.
    """

    name = "unet3d"
    description = ("Fault probability from the FaultSeg3D 3D U-Net (3 pool levels, 16/32/64/512 filters; "
                   "untrained seeded weights), torch CPU, 1 thread")
    halo = (HALO, HALO, HALO)
    whole_axes = ()
    block_multiple = (MULTIPLE, MULTIPLE, MULTIPLE)
    #: Bump when the network, its weights or the padding change (the module digest would
    #: not see operators/unet_net.py).
    version = "2"

    def overlap_depth(self, array):
        """The inherited depths on chunks aligned to the pooling grid.

        Chunks whose inner boundaries are multiples of 8 and are at least the halo long
        are used as given (the plain inherited form); others are first rechunked by
        :func:`aligned_chunks` (boundaries moved to the nearest multiple of 8, chunks
        shorter than the halo merged with a neighbour), so a task's block may differ from
        ``chunk + 2 * halo`` of the chunks asked for: plan multiples of 8. Without it a
        block's pooling grid would differ from the whole volume's and so would its output,
        in most samples, not only at a seam.
        """
        chunks = tuple(aligned_chunks(c, h) for c, h in zip(array.chunks, self.halo))
        if chunks != tuple(array.chunks):
            array = array.rechunk(chunks)
        return super().overlap_depth(array)

    def run(self, block: np.ndarray) -> np.ndarray:
        from operators import unet_net  # torch: imported here, on first use, never by `import operators`

        x = np.asarray(block, dtype=np.float32)
        if x.ndim != 3:
            raise ValueError(f"expected a 3D (inline, crossline, samples) block, got shape {x.shape}")
        pad = [(0, p - n) for n, p in zip(x.shape, padded_shape(x.shape))]
        if any(after for _, after in pad):
            x = np.pad(x, pad, mode="reflect")
        elif not (x.flags.c_contiguous and x.flags.writeable):
            x = np.array(x, order="C")  # torch.from_numpy wants its own writeable C array
        y = unet_net.forward(x)
        return np.ascontiguousarray(y[: block.shape[0], : block.shape[1], : block.shape[2]])
