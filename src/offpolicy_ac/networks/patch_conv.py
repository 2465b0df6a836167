"""A 2-D convolution computed as one matrix product over the input's patches on XLA:CPU.

XLA:CPU runs the derivatives of `lax.conv_general_dilated` far slower inside a loop
(`lax.scan`, `lax.while_loop`: a learner's replayed updates, a compiled training program)
than on their own (jax-ml/jax#12868). Gathered patches and a `dot` run at full speed in
both, and so do their derivatives (slices, pads and `dot`s). `experiments/bench_conv.py`
times both on a 2-core CPU: the Nature CNN's gradient step on 160 frames took 214 ms called
directly and 4,126 ms per step inside a `lax.scan`, as patch products 137 ms and 110 ms;
the IMPALA ResNet's (3x3 convolutions on large maps) is slower called directly (1.5x) and
12x faster in a loop. Other backends keep the library convolution.

    nn.Conv(features, (8, 8), (4, 4), conv_general_dilated=conv_general_dilated)

The function and its parameters (`nn.Conv`'s kernel [kh, kw, C, F]) are the library's:
only the order of the sums differs.
"""

from __future__ import annotations

import jax
from jax import lax
import jax.numpy as jnp

_NHWC = ("NHWC", "HWIO", "NHWC")


def conv_general_dilated(lhs, rhs, window_strides, padding, lhs_dilation=None,
                         rhs_dilation=None, dimension_numbers=None, feature_group_count=1,
                         batch_group_count=1, precision=None,
                         preferred_element_type=None):  # fmt: skip
  """`lax.conv_general_dilated`, as a product over patches for what `nn.Conv` passes on
  XLA:CPU (2-D, [B, H, W, C] inputs, [kh, kw, C, F] kernels, no dilation or feature
  groups); anything else, and every other backend, is `lax.conv_general_dilated` itself."""
  args = (lhs, rhs, window_strides, padding, lhs_dilation, rhs_dilation, dimension_numbers,
          feature_group_count, batch_group_count, precision, preferred_element_type)  # fmt: skip
  if jax.default_backend() != "cpu" or not _patch_product_applies(*args):
    return lax.conv_general_dilated(*args)
  pads = padding
  if isinstance(padding, str):
    pads = lax.padtype_to_pads(lhs.shape[1:3], rhs.shape[:2], window_strides, padding)
  for size, kernel, (low, high) in zip(lhs.shape[1:3], rhs.shape[:2], pads):
    if size + low + high < kernel:  # the library's own error for a kernel past the input
      return lax.conv_general_dilated(*args)
  kh, kw, c, f = rhs.shape
  x = jnp.pad(lhs, ((0, 0), *(tuple(pair) for pair in pads), (0, 0)))
  sh, sw = window_strides
  h, w = (x.shape[1] - kh) // sh + 1, (x.shape[2] - kw) // sw + 1
  # [B, h, w, kh * kw * C], ordered (i, j, c) as the kernel's leading axes.
  patches = jnp.concatenate(
      [x[:, i : i + sh * (h - 1) + 1 : sh, j : j + sw * (w - 1) + 1 : sw, :]
       for i in range(kh) for j in range(kw)],  # fmt: skip
      axis=-1,
  )
  return jnp.matmul(patches, rhs.reshape(kh * kw * c, f), precision=precision,
                    preferred_element_type=preferred_element_type)  # fmt: skip


def _patch_product_applies(lhs, rhs, window_strides, padding, lhs_dilation, rhs_dilation,
                           dimension_numbers, feature_group_count, batch_group_count,
                           precision, preferred_element_type) -> bool:  # fmt: skip
  del precision, preferred_element_type
  if lhs.ndim != 4 or rhs.ndim != 4 or len(window_strides) != 2:
    return False
  if any(d != 1 for d in (*(lhs_dilation or ()), *(rhs_dilation or ()))):
    return False
  if feature_group_count != 1 or batch_group_count != 1 or lhs.shape[-1] != rhs.shape[2]:
    return False
  if isinstance(padding, str):
    if padding not in ("SAME", "VALID"):
      return False
  elif len(padding) != 2 or any(p < 0 for pair in padding for p in pair):  # negative: crops
    return False
  nhwc = lax.conv_dimension_numbers(lhs.shape, rhs.shape, _NHWC)
  return lax.conv_dimension_numbers(lhs.shape, rhs.shape, dimension_numbers) == nhwc
