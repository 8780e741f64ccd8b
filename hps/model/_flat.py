"""Dense tensors as views of one flat buffer, so a step over all of them is one pass over one array.

The model's dense parameters are views, in the order of its ``params`` dict, of one 1-D C-contiguous
buffer (:func:`flat_views`), and so are a mini-batch's dense gradients (the first chunk's backward writes
them into a new such buffer, ``FieldModel._grad_targets``; later chunks are added into it in chunk order)
and the dense optimizer's state (``_dense_optim``). The optimizer then steps the three buffers with one
kernel call on the host, or one CUDA launch or 13 CuPy operations on a GPU, where it took one per tensor
(for the default MLP with Adam: 6 kernel calls, or 78 CuPy operations, each a launch that hands the GIL
back). The operations are element-wise, so stepping the buffer gives the bits stepping the tensors gave.

:class:`Tiled` is the ``{name: view}`` dict that knows its buffer while it holds the views it was made
with: a caller may put other arrays in it (the dense all-reduce puts its sums), and whoever steps flat
asks :func:`flat_of` first (a few identity checks, not a pointer per array) and steps tensor by tensor
otherwise. NumPy and CuPy arrays alike. Not thread-safe (as a dict).
"""

from __future__ import annotations

import math

__all__ = ["Tiled", "flat_views", "flat_of"]


class Tiled(dict):
    """``{name: view}`` of the views of one flat buffer :func:`flat_views` made, in layout order; a dict."""

    def __init__(self, flat, views: dict):
        super().__init__(views)
        self.flat = flat
        #: the views as made, in buffer order: ``(name, view)`` pairs
        self.views = tuple(views.items())
        #: ``(name, shape)`` of each view in buffer order: two dicts of one layout step as one buffer
        self.layout = tuple((k, v.shape) for k, v in self.views)


def flat_views(xp, shapes: dict, dtype, flat=None) -> Tiled:
    """A :class:`Tiled` of views, one after the other in the order of ``shapes`` (``{name: shape}``), of a
    new uninitialised 1-D ``xp`` buffer of ``dtype`` exactly as long as they are together, or of ``flat``
    (such a buffer, C-contiguous; its length is checked by the slicing: a short one fails to reshape)."""
    sizes = [math.prod(int(d) for d in s) for s in shapes.values()]
    if flat is None:
        flat = xp.empty(sum(sizes), dtype=dtype)
    views, at = {}, 0
    for (name, shape), n in zip(shapes.items(), sizes):
        views[name] = flat[at:at + n].reshape(shape)
        at += n
    return Tiled(flat, views)


def flat_of(d) -> object | None:
    """The buffer of ``d`` when it is a :class:`Tiled` of two or more views that still holds exactly the
    views it was made with; else None."""
    if not isinstance(d, Tiled) or len(d) != len(d.views) or len(d.views) < 2:
        return None
    for k, v in d.views:
        if dict.get(d, k) is not v:
            return None
    return d.flat
