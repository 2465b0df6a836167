"""networks.patch_conv: the convolution as a product over patches on XLA:CPU is
`lax.conv_general_dilated`, value and gradients, and the torsos keep `nn.Conv`'s
parameters."""

import flax.linen as nn
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from offpolicy_ac import networks
from offpolicy_ac.networks import torsos
from offpolicy_ac.networks.patch_conv import conv_general_dilated

NHWC = ("NHWC", "HWIO", "NHWC")


def _both(x, kernel, strides, padding, jit=False, **kwargs):
  """(patch product, library convolution) of sum(conv ** 2), with both gradients; `jit`
  compiles each as one program (eagerly, each operation compiles on its own)."""

  def value_and_grads(conv):
    def loss(x, k):
      return jnp.sum(conv(x, k, strides, padding, dimension_numbers=NHWC, **kwargs) ** 2)

    both = jax.value_and_grad(loss, (0, 1))
    return jax.jit(both) if jit else both

  with jax.default_matmul_precision("highest"):
    ours = value_and_grads(conv_general_dilated)(x, kernel)
    theirs = value_and_grads(jax.lax.conv_general_dilated)(x, kernel)
  return ours, theirs


def _assert_close(ours, theirs):
  for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs)):
    assert a.shape == b.shape
    np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5 * float(jnp.abs(b).max()))


@settings(max_examples=20, deadline=None)
@given(
    batch=st.integers(1, 3),
    height=st.integers(1, 11),
    width=st.integers(1, 11),
    channels=st.integers(1, 3),
    features=st.integers(1, 3),
    kernel=st.tuples(st.integers(1, 4), st.integers(1, 4)),
    strides=st.tuples(st.integers(1, 3), st.integers(1, 3)),
    padding=st.sampled_from(["VALID", "SAME", ((1, 0), (2, 1))]),
    seed=st.integers(0, 2**16),
)
def test_patch_product_is_the_convolution(batch, height, width, channels, features, kernel,
                                          strides, padding, seed):  # fmt: skip
  """Random shapes, strides and paddings (VALID, SAME, explicit): the same value and
  gradients as `lax.conv_general_dilated`, and the same refusal of a kernel larger than
  the padded input."""
  kx, kk = jax.random.split(jax.random.PRNGKey(seed))
  x = jax.random.normal(kx, (batch, height, width, channels))
  w = jax.random.normal(kk, (*kernel, channels, features))
  try:
    theirs = jax.lax.conv_general_dilated(x, w, strides, padding, dimension_numbers=NHWC)
  except (TypeError, ValueError) as error:
    with pytest.raises(type(error)):
      conv_general_dilated(x, w, strides, padding, dimension_numbers=NHWC)
    return
  if theirs.size == 0:
    assert conv_general_dilated(x, w, strides, padding, dimension_numbers=NHWC).shape == (
        theirs.shape
    )
    return
  _assert_close(*_both(x, w, strides, padding, jit=True))


@pytest.mark.parametrize("jitted", [False, True])
def test_nature_cnn_layers_jitted_and_in_a_loop(jitted):
  """The Nature CNN's three layers (8x8/4, 4x4/2, 3x3/1 on 84 x 84 frames), jitted or
  not, and inside a `lax.scan` (where XLA:CPU ran the library's gradients slowly)."""
  x = jax.random.uniform(jax.random.PRNGKey(0), (2, 84, 84, 4))
  for i, (features, size, stride) in enumerate(((32, 8, 4), (64, 4, 2), (64, 3, 1))):
    w = jax.random.normal(jax.random.PRNGKey(i + 1), (size, size, x.shape[-1], features))
    w = w / np.sqrt(size * size * x.shape[-1])
    ours, theirs = _both(x, w, (stride, stride), "VALID")
    _assert_close(ours, theirs)
    x = jax.nn.relu(jax.lax.conv_general_dilated(x, w, (stride, stride), "VALID",
                                                 dimension_numbers=NHWC))  # fmt: skip

  def grads(conv):
    def loss(k):
      out = conv(x0, k, (4, 4), "VALID", dimension_numbers=NHWC)
      return jnp.sum(out**2)

    def body(k, _):
      return k - 1e-3 * jax.grad(loss)(k), loss(k)

    run = lambda k: jax.lax.scan(body, k, None, length=2)  # noqa: E731
    return (jax.jit(run) if jitted else run)(w0)

  x0 = jax.random.uniform(jax.random.PRNGKey(5), (2, 84, 84, 4))
  w0 = jax.random.normal(jax.random.PRNGKey(6), (8, 8, 4, 32)) / 16
  with jax.default_matmul_precision("highest"):
    _assert_close(grads(conv_general_dilated), grads(jax.lax.conv_general_dilated))


@pytest.mark.parametrize(
    "x_shape,w_shape,kwargs",
    [
        ((2, 9, 9, 4), (3, 3, 4, 4), dict(rhs_dilation=(2, 2))),
        ((2, 9, 9, 4), (3, 3, 4, 4), dict(lhs_dilation=(2, 1))),
        ((2, 9, 9, 4), (3, 3, 2, 4), dict(feature_group_count=2)),
        ((2, 4, 9, 9), (4, 4, 3, 3), dict(dimension_numbers=("NCHW", "OIHW", "NCHW"))),
        ((2, 9, 9, 4), (3, 3, 4, 4), dict(padding=((-1, 0), (1, 1)))),
    ],
    ids=["kernel dilation", "input dilation", "feature groups", "channels first", "cropping"],
)
def test_what_the_patch_product_does_not_cover_is_the_library_convolution(x_shape, w_shape, kwargs):
  x = jax.random.normal(jax.random.PRNGKey(0), x_shape)
  w = jax.random.normal(jax.random.PRNGKey(1), w_shape)
  kwargs = {"dimension_numbers": NHWC, "padding": ((0, 0), (1, 1)), **kwargs}
  ours = conv_general_dilated(x, w, (1, 1), **kwargs)
  theirs = jax.lax.conv_general_dilated(x, w, (1, 1), **kwargs)
  np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("kind", ["nature_cnn", "small_cnn", "impala_resnet"])
def test_pixel_torsos_keep_flax_convolutions_parameters_and_function(kind, monkeypatch):
  """The torsos built on the patch product have `nn.Conv`'s parameters (names, shapes and
  initial values: checkpoints of either load in the other) and compute the same features
  and gradients."""
  frames = jax.random.randint(jax.random.PRNGKey(0), (2, 4, 84, 84), 0, 256).astype(jnp.uint8)
  torso = networks.make_torso(kind, (4, 84, 84))
  params = torso.init(jax.random.PRNGKey(1), frames)

  def loss(p):
    return jnp.sum(torso.apply(p, frames) ** 2)

  with jax.default_matmul_precision("highest"):
    ours = jax.value_and_grad(loss)(params)
    monkeypatch.setattr(torsos, "_Conv", nn.Conv)  # flax's own convolution
    library = torso.init(jax.random.PRNGKey(1), frames)
    theirs = jax.value_and_grad(loss)(params)
  assert jax.tree.structure(library) == jax.tree.structure(params)
  for a, b in zip(jax.tree.leaves(library), jax.tree.leaves(params)):
    np.testing.assert_array_equal(a, b)
  assert any("Conv_0" in str(path) for path, _ in jax.tree_util.tree_leaves_with_path(params))
  _assert_close(ours, theirs)


def test_a_torsos_update_in_a_loop_has_no_library_convolution_on_the_cpu():
  """On XLA:CPU the Nature CNN's gradients inside `lax.scan` (a learner's replayed updates)
  lower to products over patches, with no convolution for XLA:CPU's slow in-loop path."""
  if jax.default_backend() != "cpu":
    pytest.skip("the patch product is XLA:CPU's")
  torso = networks.make_torso("nature_cnn", (4, 84, 84))
  frames = jnp.zeros((2, 4, 84, 84), jnp.uint8)
  params = torso.init(jax.random.PRNGKey(1), frames)

  def updates(p):
    step = lambda p, _: (jax.tree.map(lambda v, g: v - g, p, jax.grad(  # noqa: E731
        lambda p: jnp.sum(torso.apply(p, frames)))(p)), None)  # fmt: skip
    return jax.lax.scan(step, p, None, length=2)[0]

  assert "convolution" not in jax.jit(updates).lower(params).as_text()


def test_kernels_that_repeat_inputs_over_a_large_map_keep_the_librarys_values():
  """A 3x3 stride-1 kernel on 12 x 12 (patches would repeat each input 9 times): the values
  are the library's exactly, forward mode works (`jax.jvp`, `jax.jacfwd`) and both modes'
  derivatives are the library's; on the CPU, a ResNet update inside a `lax.scan` lowers with
  convolutions for its forward pass alone (one per layer), its derivatives patch products."""
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 12, 12, 3))
  w = jax.random.normal(jax.random.PRNGKey(1), (3, 3, 3, 4))
  ours, theirs = (lambda x, w: conv(x, w, (1, 1), "SAME", dimension_numbers=NHWC)
                  for conv in (conv_general_dilated, jax.lax.conv_general_dilated))  # fmt: skip
  np.testing.assert_array_equal(ours(x, w), theirs(x, w))
  with jax.default_matmul_precision("highest"):
    _assert_close(jax.jvp(ours, (x, w), (w.sum() * x, x.sum() * w)),
                  jax.jvp(theirs, (x, w), (w.sum() * x, x.sum() * w)))  # fmt: skip
    _assert_close(jax.jacfwd(lambda w: ours(x, w).sum(axis=(1, 2)))(w),
                  jax.jacfwd(lambda w: theirs(x, w).sum(axis=(1, 2)))(w))  # fmt: skip
    _assert_close(*_both(x, w, (1, 1), "SAME"))
  if jax.default_backend() != "cpu":
    return
  torso = networks.make_torso("impala_resnet", (4, 84, 84))
  frames = jnp.zeros((2, 4, 84, 84), jnp.uint8)
  params = torso.init(jax.random.PRNGKey(1), frames)
  layers = sum("Conv" in str(path) and "kernel" in str(path)
               for path, _ in jax.tree_util.tree_leaves_with_path(params))  # fmt: skip

  def updates(p):
    step = lambda p, _: (jax.tree.map(lambda v, g: v - g, p, jax.grad(  # noqa: E731
        lambda p: jnp.sum(torso.apply(p, frames) ** 2))(p)), None)  # fmt: skip
    return jax.lax.scan(step, p, None, length=2)[0]

  assert layers > 10
  assert jax.jit(updates).lower(params).as_text().count("stablehlo.convolution") == layers
