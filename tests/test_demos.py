"""Demonstrations: cutting episodes into sequences with drop / last / null_padding, and
clipping a policy's actions to the action box."""

import re

import numpy as np
import pytest

from offpolicy_ac import demos as demos_lib
from offpolicy_ac import envs
from offpolicy_ac.envs import FIRST
from offpolicy_ac.envs import LAST
from offpolicy_ac.envs import MID
from offpolicy_ac.training import evaluate


def _episodes(lengths):
  """Episodes of the given step counts; observation = (episode, step)."""
  fields = {k: [] for k in ("step_type", "reward", "discount", "observation", "action")}
  for e, n in enumerate(lengths):
    for t in range(n):
      fields["step_type"].append(FIRST if t == 0 else LAST if t == n - 1 else MID)
      fields["reward"].append(0.0 if t == 0 else 1.0)
      fields["discount"].append(0.0 if t == n - 1 else 1.0)
      fields["observation"].append([e, t])
      fields["action"].append(t % 2)
  out = {k: np.asarray(v) for k, v in fields.items()}
  out["observation"] = out["observation"].astype(np.float32)
  out["reward"] = out["reward"].astype(np.float32)
  out["discount"] = out["discount"].astype(np.float32)
  out["step_type"] = out["step_type"].astype(np.int32)
  out["episode_lengths"] = np.asarray(lengths)
  return out


def _pieces(traj):
  obs = traj.observation  # [L, S, 2]
  return [(int(obs[0, s, 0]), obs[:, s, 1].astype(int).tolist()) for s in range(obs.shape[1])]


def test_drop_keeps_only_full_pieces_sharing_one_step():
  # episode 0: 9 steps (8 transitions), L = 4 -> pieces of 3 transitions: [0..3], [3..6]
  traj = demos_lib.cut_episodes(_episodes([9, 7]), 4, "drop")
  assert _pieces(traj) == [
      (0, [0, 1, 2, 3]),
      (0, [3, 4, 5, 6]),
      (1, [0, 1, 2, 3]),
      (1, [3, 4, 5, 6]),
  ]
  # A NumPy integer, as a length computed from arrays is, cuts the same pieces.
  assert _pieces(demos_lib.cut_episodes(_episodes([9, 7]), np.int64(4), "drop")) == _pieces(traj)


def test_last_pads_the_residual_with_the_steps_before_it():
  traj = demos_lib.cut_episodes(_episodes([9, 7]), 4, "last")
  assert _pieces(traj) == [
      (0, [0, 1, 2, 3]),
      (0, [3, 4, 5, 6]),
      (0, [5, 6, 7, 8]),
      (1, [0, 1, 2, 3]),
      (1, [3, 4, 5, 6]),
  ]


def test_null_padding_masks_every_padded_transition():
  traj = demos_lib.cut_episodes(_episodes([9, 2]), 4, "null_padding")
  assert _pieces(traj) == [
      (0, [0, 1, 2, 3]),
      (0, [3, 4, 5, 6]),
      (0, [6, 7, 8, 8]),
      (1, [0, 1, 1, 1]),
  ]
  mask = np.asarray(envs.loss_inputs(traj, 0.99).mask)  # [3, S]
  # piece (0, [6, 7, 8, pad]): transitions 6->7, 7->8 real; 8 (LAST) -> pad masked.
  np.testing.assert_array_equal(mask[:, 2], [True, True, False])
  np.testing.assert_array_equal(mask[:, 3], [True, False, False])
  assert traj.reward[3, 2] == 0 and traj.step_type[3, 2] == LAST


def test_every_real_transition_is_kept_by_last_and_null_padding():
  lengths = [5, 13, 2, 8]
  for mode in ("last", "null_padding"):
    traj = demos_lib.cut_episodes(_episodes(lengths), 5, mode)
    mask = np.asarray(envs.loss_inputs(traj, 1.0).mask)
    obs = traj.observation
    seen = {
        (int(obs[t, s, 0]), int(obs[t, s, 1]))
        for t in range(4)
        for s in range(obs.shape[1])
        if mask[t, s]
    }
    expected = {(e, t) for e, n in enumerate(lengths) for t in range(n - 1)}
    assert seen == expected, mode


def test_bad_mode_and_length():
  with pytest.raises(ValueError, match="mode"):
    demos_lib.cut_episodes(_episodes([5]), 3, "pad")
  with pytest.raises(ValueError, match="length"):
    demos_lib.cut_episodes(_episodes([5]), 1)
  with pytest.raises(ValueError, match="no sequence"):
    demos_lib.cut_episodes(_episodes([3]), 5, "drop")


def heuristic_cartpole_policy(obs):
  """A PD controller on the pole: a decent CartPole demonstrator."""
  return (obs[:, 2] + 0.5 * obs[:, 3] > 0).astype(np.int32)


def test_record_save_load_roundtrip(tmp_path):
  env = envs.make("CartPole-v1", 3, 0, max_episode_steps=60)
  demos = demos_lib.record_episodes(env, heuristic_cartpole_policy, 3)
  env.close()
  lengths = demos["episode_lengths"]
  assert lengths.shape == (3,) and lengths.sum() == demos["step_type"].shape[0]
  starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
  assert np.all(demos["step_type"][starts] == FIRST)
  assert np.all(demos["step_type"][starts + lengths - 1] == LAST)
  assert np.all(lengths == 61)  # the heuristic balances until the 60-step limit
  path = tmp_path / "demos.npz"
  demos_lib.save_demos(path, demos, env_id="CartPole-v1")
  loaded = demos_lib.load_demos(path)
  assert loaded["env_id"] == "CartPole-v1"
  np.testing.assert_array_equal(loaded["observation"], demos["observation"])


def test_an_atari_recording_holds_whole_games_as_the_episodes_their_lives_end(tmp_path):
  """Each environment's first game (what its episode statistics count), recorded as the
  episodes its life losses end, as training sees them: a game is not cut at its first
  lost life, and its raw rewards add up to the game's score."""
  rng = np.random.default_rng(0)
  policy = lambda obs: rng.integers(0, 4, len(obs)).astype(np.int32)
  with envs.make_atari("Breakout-v5", 2, 6, train=False) as env:
    demos = demos_lib.record_episodes(env, policy, 2)
  with envs.make_atari("Breakout-v5", 2, 6, train=False) as env:
    rng = np.random.default_rng(0)
    scores = evaluate(env, lambda params, obs: policy(obs), None, 2)
  lengths = demos["episode_lengths"]
  assert len(lengths) == 10  # 2 games of 5 lives
  ends = np.cumsum(lengths)
  np.testing.assert_array_equal(demos["step_type"][ends - 1], LAST)
  np.testing.assert_array_equal(demos["discount"][ends - 1], 0.0)  # every life ends in 0
  halves = np.split(demos["reward"], [ends[4]])
  np.testing.assert_array_equal([h.sum() for h in halves], scores)
  demos_lib.save_demos(tmp_path / "demos.npz", demos, env_id="Breakout-v5")
  assert demos_lib.load_demos(tmp_path / "demos.npz")["episode_lengths"].tolist() == list(lengths)


def test_clip_to_box_clips_to_the_box_shrunk_around_its_centre():
  actions = np.array([[2.0, -3.0, 0.5], [0.1, 0.2, -0.9]], np.float32)
  policy = lambda obs: actions
  low, high = (-1.0, -1.0, -2.0), (1.0, 1.0, 0.0)
  whole = demos_lib.clip_to_box(policy, low, high)(None)
  np.testing.assert_array_equal(whole, np.array([[1.0, -1.0, 0.0], [0.1, 0.2, -0.9]], np.float32))
  inner = demos_lib.clip_to_box(policy, low, high, fraction=0.9)(None)  # third: [-1.9, -0.1]
  np.testing.assert_allclose(inner, [[0.9, -0.9, -0.1], [0.1, 0.2, -0.9]], rtol=1e-6)
  assert inner.dtype == np.float32


def test_clip_to_box_takes_flattened_bounds_for_shaped_actions():
  actions = np.full((4, 2, 3), 5.0)
  low, high = -np.arange(1.0, 7.0), np.arange(1.0, 7.0)  # one bound per component
  out = demos_lib.clip_to_box(lambda obs: actions, low, high, fraction=0.5)(None)
  assert out.shape == (4, 2, 3) and out.dtype == np.float64
  np.testing.assert_allclose(out[0].reshape(-1), 0.5 * np.arange(1.0, 7.0))


@pytest.mark.parametrize(
    "low, high, fraction, message",
    [
        ((-1.0,), (1.0,), 0.0, "fraction must lie in"),
        ((-1.0,), (1.0,), 1.5, "fraction must lie in"),
        ((1.0,), (1.0,), 1.0, "low < high"),
        ((-1.0, -1.0), (1.0,), 1.0, "low < high"),
        ((-np.inf, -1.0), (np.inf, 1.0), 0.9, "fraction 0.9 shrinks the action box around its"),
    ],
)
def test_clip_to_box_refuses_bad_input(low, high, fraction, message):
  with pytest.raises(ValueError, match=message):
    demos_lib.clip_to_box(lambda obs: obs, low, high, fraction)


def test_clip_to_box_clips_an_unbounded_dimension_at_its_finite_bound_only():
  # The centre of [-inf, inf] is NaN: every action of that dimension came out NaN.
  actions = np.array([[5.0, -5.0], [0.3, 0.1], [-7.0, 2.0]], np.float32)
  out = demos_lib.clip_to_box(lambda obs: actions, [-np.inf, 0.0], [np.inf, np.inf])(None)
  np.testing.assert_array_equal(out, np.float32([[5.0, 0.0], [0.3, 0.1], [-7.0, 2.0]]))


@pytest.mark.parametrize(
    "change, fragment",
    [
        ({"episode_lengths": np.array([5.0, 4.0])}, "`episode_lengths` must be integers >= 2"),
        ({"episode_lengths": np.array([-1, 10])}, "`episode_lengths` must be integers >= 2"),
        ({"episode_lengths": np.array(9)}, "one per episode, got int64[] [9]"),
        ({"reward": np.zeros((9, 1), np.float32)}, "`reward` must be [N], one per step"),
        ({"step_type": np.full(9, MID, np.int32)}, "each episode FIRST (0), MID (1) ..., LAST (2)"),
        ({"step_type": _episodes([5, 4])["step_type"].astype(np.float32)}, "`step_type` must be"),
        ({"discount": np.full(9, 5.0, np.float32)}, "`discount` must be floats in [0, 1]"),
        ({"discount": np.float32([1, 1, 0, 1, 0, 1, 1, 1, 0])},
         "`discount` must be 1 at FIRST and MID steps, got 0.0 at step 2"),  # fmt: skip
        ({"reward": np.zeros(9, np.int64)}, "`reward` must be floats, got int64"),
        ({"action": np.zeros(8, np.int32)}, "`action` has (8,) steps, episode lengths add up to 9"),
    ],
    ids=lambda c: str(c)[:30],
)
def test_demos_that_are_not_whole_episodes_are_neither_saved_nor_loaded(tmp_path, change,
                                                                        fragment):  # fmt: skip
  path = tmp_path / "demos.npz"
  bad = {**_episodes([5, 4]), **change}
  with pytest.raises(ValueError, match=re.escape(fragment)):
    demos_lib.save_demos(path, bad, env_id="CartPole-v1")
  assert not list(tmp_path.iterdir())
  np.savez_compressed(path, env_id=np.array("CartPole-v1"), **bad)  # written by other means
  with pytest.raises(ValueError, match=re.escape(fragment)):
    demos_lib.load_demos(path)


def test_save_demos_refuses_a_missing_field_and_a_directory(tmp_path):
  demos = _episodes([5, 4])
  with pytest.raises(ValueError, match=r"the demonstrations lack \['reward'\]: nothing written"):
    demos_lib.save_demos(tmp_path / "d.npz", {k: v for k, v in demos.items() if k != "reward"},
                         env_id="CartPole-v1")  # fmt: skip
  with pytest.raises(IsADirectoryError, match="is a directory"):
    demos_lib.save_demos(tmp_path, demos, env_id="CartPole-v1")
  assert not list(tmp_path.iterdir()) and not list(tmp_path.parent.glob("*.tmp.npz"))


def test_check_demos_refuses_observations_of_another_kind():
  spec = envs.spec("CartPole-v1")
  demos = _episodes([5, 4])
  demos["observation"] = np.zeros((9, 4), np.float32)
  demos_lib.check_demos(demos, spec)
  demos["observation"] = np.zeros((9, 4), np.int64)
  with pytest.raises(ValueError, match="int64 observations, the task's are float32"):
    demos_lib.check_demos(demos, spec)


def test_check_demos_refuses_integer_actions_for_a_continuous_task():
  spec = envs.spec("Pendulum-v1")
  demos = _episodes([5, 4])
  demos["observation"] = np.zeros((9, 3), np.float32)
  demos["action"] = np.zeros((9, 1), np.float32)
  demos_lib.check_demos(demos, spec)
  demos["action"] = np.zeros((9, 1), np.int32)  # rounded when the file was made
  with pytest.raises(ValueError, match=r"int32 actions, the task's are continuous \(floats\)"):
    demos_lib.check_demos(demos, spec)


def test_float32_actions_clipped_to_a_bound_not_exact_in_float32_are_in_the_box():
  """Humanoid's box is ±0.4: float32(0.4) is above the float64 bound, and clip_to_box's
  (as the agents') float32 actions at the edge are that value. They are in the box."""
  spec = envs.spec("Humanoid-v4")
  assert float(np.float32(spec.action_high[0])) > spec.action_high[0]  # 0.4: not exact in float32
  dims, obs = len(spec.action_low), np.zeros((9,) + spec.observation_shape, np.float32)
  pushing = lambda o: np.full((len(o), dims), 5.0, np.float32)
  edge = demos_lib.clip_to_box(pushing, spec.action_low, spec.action_high)(obs)
  demos = {**_episodes([5, 4]), "observation": obs, "action": -edge}
  demos_lib.check_demos(demos, spec)
  demos["action"] = edge
  demos_lib.check_demos(demos, spec)
  demos["action"] = np.nextafter(edge, np.float32(1))  # above the box in float32 too
  with pytest.raises(ValueError, match="actions outside the task's action box"):
    demos_lib.check_demos(demos, spec)


def test_cut_episodes_names_why_no_sequence_could_be_cut():
  demos = _episodes([5, 4])
  with pytest.raises(ValueError, match="the longest episode has 5 steps"):
    demos_lib.cut_episodes(demos, 6, "drop")
  empty = {k: v[:0] for k, v in demos.items()}
  with pytest.raises(ValueError, match="the demonstrations hold no episode"):
    demos_lib.cut_episodes(empty, 6, "last")


def test_what_load_demos_returns_saves_again(tmp_path):
  # load_demos's dict holds env_id: save_demos failed with numpy's TypeError.
  demos_lib.save_demos(tmp_path / "a.npz", _episodes([5, 4]), env_id="CartPole-v1")
  loaded = demos_lib.load_demos(tmp_path / "a.npz")
  kept = {k: v for k, v in loaded.items() if k != "episode_lengths"}
  demos_lib.save_demos(tmp_path / "b.npz", {**kept, "episode_lengths": np.array([5, 4])},
                       env_id=loaded["env_id"])  # fmt: skip
  again = demos_lib.load_demos(tmp_path / "b.npz")
  assert again["env_id"] == "CartPole-v1"
  np.testing.assert_array_equal(again["observation"], loaded["observation"])
  with pytest.raises(ValueError, match="the demonstrations are of CartPole-v1, and env_id is Ac"):
    demos_lib.save_demos(tmp_path / "c.npz", loaded, env_id="Acrobot-v1")
  with pytest.raises(ValueError, match="env_id must be a task id"):
    demos_lib.save_demos(tmp_path / "c.npz", _episodes([5, 4]), env_id=5)


@pytest.mark.parametrize(
    "env_id, fragment",
    [(np.bytes_(b"CartPole-v1"), "got bytes"), (np.array(["CartPole-v1"]), "got an array of "
     "shape (1,)"), (np.array(5), "got int")],
)  # fmt: skip
def test_a_file_whose_env_id_is_not_a_task_id_is_refused(tmp_path, env_id, fragment):
  # Its str() was taken as the task: "pass --env-id np.bytes_(b'CartPole-v1')".
  np.savez(tmp_path / "d.npz", **_episodes([5, 4]), env_id=env_id)
  with pytest.raises(
      ValueError, match=re.escape("its `env_id` must be a task id (a str), " + fragment)
  ):
    demos_lib.load_demos(tmp_path / "d.npz")


def test_a_file_of_no_episode_is_refused_naming_it(tmp_path):
  empty = {k: v[:0] for k, v in _episodes([5, 4]).items()}
  with pytest.raises(ValueError, match="the demonstrations to write: .* hold no episode"):
    demos_lib.save_demos(tmp_path / "e.npz", empty, env_id="CartPole-v1")
  np.savez_compressed(tmp_path / "e.npz", env_id=np.array("CartPole-v1"), **empty)
  with pytest.raises(ValueError, match="e.npz: the demonstrations hold no episode"):
    demos_lib.load_demos(tmp_path / "e.npz")


def test_save_and_load_expand_the_home_directory(tmp_path, monkeypatch):
  """record_demos.py --out=~/d.npz writes under the home directory; sqil.py --demos=~/d.npz
  (and `load_demos`) must read that file, not refuse a path named `~`."""
  monkeypatch.setenv("HOME", str(tmp_path))
  demos_lib.save_demos("~/demos.npz", _episodes([5, 4]), env_id="CartPole-v1")
  assert (tmp_path / "demos.npz").exists() and not list(tmp_path.glob("*.tmp.npz"))
  loaded = demos_lib.load_demos("~/demos.npz")
  assert loaded["env_id"] == "CartPole-v1" and loaded["episode_lengths"].tolist() == [5, 4]


def test_a_file_whose_compressed_data_is_damaged_is_refused_naming_it(tmp_path):
  # The zip's headers whole, a member's deflated bytes changed: zlib's own error escaped.
  path = tmp_path / "demos.npz"
  demos_lib.save_demos(path, _episodes([5, 4]), env_id="CartPole-v1")
  data = bytearray(path.read_bytes())
  data[60:80] = bytes(255 - b for b in data[60:80])
  path.write_bytes(bytes(data))
  with pytest.raises(ValueError, match="is not a readable demonstration file"):
    demos_lib.load_demos(path)


@pytest.mark.parametrize("action_shape", [(3, 1), (1, 3)])
def test_check_demos_reads_the_action_box_in_the_shape_of_an_action(action_shape):
  # The spec's bounds are flat, one per action dimension; (3, 1) actions in the box were
  # compared with all three bounds each and refused.
  spec = envs.EnvSpec("Custom-v0", (2,), "float32", False, None, action_shape, "float32",
                      (-1.0, -2.0, -3.0), (1.0, 2.0, 3.0), 1, 1)  # fmt: skip
  demos = _episodes([5, 4])
  edge = np.array([0.9, 1.9, 2.9], np.float32).reshape(action_shape)
  demos["action"] = np.tile(edge, (9, 1, 1))
  demos_lib.check_demos(demos, spec)
  demos["action"][3] = -edge - 0.2  # only the first dimension is outside its box
  demos["action"][3].reshape(-1)[1:] = 0.0
  with pytest.raises(ValueError, match="actions outside the task's action box"):
    demos_lib.check_demos(demos, spec)


def test_check_demos_leaves_the_range_of_a_last_steps_action_unchecked_but_not_a_nan():
  """A LAST step's action is never stepped: out of range there changes no update (SQIL's
  parameters after 64 updates were the same with 7 or 0 there), and is accepted (it was
  refused). A NaN there is refused, in sequences too: the file is damaged."""
  discrete = envs.EnvSpec("Custom-v0", (2,), "float32", True, 2, (), "int32", None, None, 1, 1)
  demos = _episodes([5, 4])
  demos["action"] = demos["action"].astype(np.int32)
  demos["action"][demos["step_type"] == LAST] = 7
  demos_lib.check_demos(demos, discrete)
  demos["action"][2] = 7  # a MID step's
  with pytest.raises(ValueError, match=r"actions must lie in \[0, 2\).*got \[7\] \(1 of 9"):
    demos_lib.check_demos(demos, discrete)
  spec = envs.EnvSpec("Custom-v0", (2,), "float32", False, None, (1,), "float32", (-1.0,),
                      (1.0,), 1, 1)  # fmt: skip
  box = _episodes([5, 4])
  box["action"] = np.zeros((9, 1), np.float32)
  box["action"][box["step_type"] == LAST] = 3.0
  demos_lib.check_demos(box, spec)
  box["action"][box["step_type"] == LAST] = np.nan
  with pytest.raises(ValueError, match="or not finite"):
    demos_lib.check_demos(box, spec)
  with pytest.raises(ValueError, match="or not finite"):
    demos_lib.check_demo_sequences(demos_lib.cut_episodes(box, 3, "null_padding"), spec)
