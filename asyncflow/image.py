"""The ``af.image`` namespace: image ops (TensorFlow's ``tf.image`` / ``tf.io`` v1 ops).

Decoding and encoding need Pillow: ``pip install 'asyncflow[image]'``.
"""

from __future__ import annotations

from asyncflow.ops.image_ops import (
    decode_jpeg,
    decode_png,
    encode_jpeg,
    encode_png,
    resize,
    resize_bilinear,
    resize_nearest_neighbor,
)

__all__ = [
    "decode_jpeg",
    "decode_png",
    "encode_jpeg",
    "encode_png",
    "resize",
    "resize_bilinear",
    "resize_nearest_neighbor",
]
