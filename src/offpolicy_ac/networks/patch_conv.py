"""A 2-D convolution computed as one matrix product over the input's patches on XLA:CPU.

XLA:CPU runs the derivatives of `lax.conv_general_dilated` far slower inside a loop
(`lax.scan`, `lax.while_loop`: a learner's replayed updates, a compiled training program)
than on their own (jax-ml/jax#12868). Gathered patches and a `dot` run at full speed in
both, and so do their derivatives (slices, pads and `dot`s). `experiments/bench_conv.py`
times both on a 2-core CPU: the Nature CNN's gradient step on 160 frames took 214 ms called
directly and 4,126 ms per step inside a `lax.scan`, as patch products 137 ms and 110 ms;
the IMPALA ResNet's (3x3 convolutions on large maps) is slower called directly (1.6x) and
13.5x faster in a loop. Other backends keep the library convolution.

Where the patches would repeat each input element more than 4 times over a large map
(the ResNet's 3x3 stride-1 kernels: 9 times), gathering them costs more than the library's
forward pass: there the values are the library's and only the derivatives are patch
products (a `custom_jvp`, so forward mode works too). The ResNet acts on 16 frames in the
library's time (17.6 ms against 17.5; 39 ms as patch products).

    nn.Conv(features, (8, 8), (4, 4), conv_general_dilated=conv_general_dilated)

The function and its parameters (`nn.Conv`'s kernel [kh, kw, C, F]) are the library's:
only the order of the sums differs.
"""

from __future__ import annotations

import jax
from jax import lax
from jax.custom_derivatives import SymbolicZero
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
  pads = _patch_pads(*args) if jax.default_backend() == "cpu" else None
  if pads is None:
    return lax.conv_general_dilated(*args)

  def product(lhs, rhs):
    kh, kw, c, f = rhs.shape
    x = patches(jnp.pad(lhs, ((0, 0), *pads, (0, 0))), (kh, kw), window_strides)
    return jnp.matmul(x, rhs.reshape(kh * kw * c, f), precision=precision,
                      preferred_element_type=preferred_element_type)  # fmt: skip

  (kh, kw), (sh, sw) = rhs.shape[:2], window_strides
  if kh * kw > _MAX_REPEATS * sh * sw and lhs.shape[1] * lhs.shape[2] > _SMALL_MAP:
    library = lambda lhs, rhs: lax.conv_general_dilated(lhs, rhs, *args[2:])  # noqa: E731
    return _with_derivatives_of(library, product)(lhs, rhs)
  return product(lhs, rhs)


_MAX_REPEATS = 4
"""The most times the patches may repeat an input element for the product to compute the
values too (the Nature CNN's 8x8/4 and 4x4/2 kernels: 4 times)."""

_SMALL_MAP = 100
"""Input positions (height x width) up to which gathering patches is cheap whatever the
kernel (the Nature CNN's third layer: 3x3/1 on 9 x 9)."""


def _with_derivatives_of(function, product):
  """`function(lhs, rhs)`'s values, with the derivatives of `product`, the same bilinear
  function computed otherwise: its JVP is `product(dlhs, rhs) + product(lhs, drhs)`,
  which reverse mode transposes into patch products."""

  def jvp(primals, tangents):
    (lhs, rhs), (dlhs, drhs) = primals, tangents
    out = function(lhs, rhs)
    terms = [product(*pair) for pair, tangent in (((dlhs, rhs), dlhs), ((lhs, drhs), drhs))
             if not isinstance(tangent, SymbolicZero)]  # fmt: skip
    return out, sum(terms[1:], terms[0]) if terms else jnp.zeros_like(out)

  wrapped = jax.custom_jvp(function)
  wrapped.defjvp(jvp, symbolic_zeros=True)
  return wrapped


def patches(x: jnp.ndarray, kernel_size: tuple[int, int],
            strides: tuple[int, int] = (1, 1)) -> jnp.ndarray:  # fmt: skip
  """[B, H, W, C] -> [B, h, w, kh * kw * C]: the input under each position of a VALID
  (kh, kw) window moved by `strides`, ordered (i, j, c) as a kernel's [kh, kw, C] axes,
  so that `patches(x, (kh, kw), s) @ kernel.reshape(-1, F)` is the convolution."""
  (kh, kw), (sh, sw) = kernel_size, strides
  h, w = (x.shape[1] - kh) // sh + 1, (x.shape[2] - kw) // sw + 1
  return jnp.concatenate(
      [x[:, i : i + sh * (h - 1) + 1 : sh, j : j + sw * (w - 1) + 1 : sw, :]
       for i in range(kh) for j in range(kw)],  # fmt: skip
      axis=-1,
  )


def _patch_pads(lhs, rhs, window_strides, padding, lhs_dilation, rhs_dilation,
                dimension_numbers, feature_group_count, batch_group_count, precision,
                preferred_element_type) -> tuple[tuple[int, int], ...] | None:  # fmt: skip
  """The explicit (low, high) padding of the two spatial axes when the patch product
  computes this convolution; None otherwise (a kernel past the padded input included:
  the library raises its own error)."""
  del precision, preferred_element_type
  if lhs.ndim != 4 or rhs.ndim != 4 or len(window_strides) != 2:
    return None
  if any(d != 1 for d in (*(lhs_dilation or ()), *(rhs_dilation or ()))):
    return None
  if feature_group_count != 1 or batch_group_count != 1 or lhs.shape[-1] != rhs.shape[2]:
    return None
  nhwc = lax.conv_dimension_numbers(lhs.shape, rhs.shape, _NHWC)
  if lax.conv_dimension_numbers(lhs.shape, rhs.shape, dimension_numbers) != nhwc:
    return None
  if isinstance(padding, str):
    if padding not in ("SAME", "VALID"):
      return None
    padding = lax.padtype_to_pads(lhs.shape[1:3], rhs.shape[:2], window_strides, padding)
  if len(padding) != 2:
    return None
  pads = tuple((int(low), int(high)) for low, high in padding)
  for size, kernel, (low, high) in zip(lhs.shape[1:3], rhs.shape[:2], pads):
    if low < 0 or high < 0 or size + low + high < kernel:  # negative pads crop
      return None
  return pads
