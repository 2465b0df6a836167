#!/usr/bin/env bash
# One command on the device machine (one H200, 16 CPU cores): Atari throughput, then a table
# run in the time left, with what comes back under $OUT. See benchmarks/gpu/README.md.
#
#   OUT=/tmp/out bash benchmarks/gpu/atari.sh                      # every phase, Pong, IMPALA
#   PHASES=train GAME=Qbert-v5 OUT=/tmp/out bash benchmarks/gpu/atari.sh
#
# Phases (PHASES, comma-separated, default raw,noop,learner,xla_noop,xla,train):
#   raw       raw envpool stepping over RAW_CONFIGS (raw_sweep.py; K x N[:threads[:batch]])
#   noop      the training loop with a no-op learner (experiments/bench_async.py async_nolearn)
#   learner   the same with the real learner (bench_async.py async), NUM_ACTORS x NUM_ENVS
#   xla_noop  noop with the compiled rollout (async_xla_nolearn: acting on the CPU)
#   xla       learner with the compiled rollout (async_xla)
#   train     experiments/$AGENT.py --preset atari --env-id $GAME for the time left, stopped
#             by SIGTERM before BUDGET_S, with the rollout TRAIN_ROLLOUT names (auto: the
#             faster of learner and xla); resumed from $CKPT/run.tgz* when that is there;
#             AGENT=sqil first records DEMO_EPISODES games of the run packed in DEMO_RUN
#             (resumed, it takes the demonstrations packed with the run: --resume compares
#             their file's contents)
#   layouts   after training, in the time left: LAYOUT_MODES (async_xla) at each of
#             BENCH_LAYOUTS, K actors x N envs[:BATCH] (BATCH: batched stepping,
#             --env-batch-size); not in the default PHASES
# $OUT gets at most 8 files: log.txt, summary.txt, results.json, metrics.jsonl, config.json,
# plot.png, and the run (its newest checkpoint, for --resume) as run.tgz or run.tgz.0, .1.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
START=$(date +%s)
: "${OUT:?set OUT (the folder whose files come back)}"
BUDGET_S=${BUDGET_S:-570}          # the whole command, install to packing (timeout_s 600)
PHASES=${PHASES:-raw,noop,learner,xla_noop,xla,train}
GAME=${GAME:-Pong-v5}
AGENT=${AGENT:-impala}             # impala, acer, sql or sqil (each has an atari preset)
SEED=${SEED:-0}
TOTAL_STEPS=${TOTAL_STEPS:-10000000}
NUM_ENVS=${NUM_ENVS:-16}
NUM_ACTORS=${NUM_ACTORS:-4}
LAG=${LAG:-8}
TORSO=${TORSO:-small_cnn}            # the table run's and the bench's network
UNROLL=${UNROLL:-10}                 # and unroll length
default_train_args="--torso $TORSO --unroll-length $UNROLL --num-envs $NUM_ENVS --actors async"
default_train_args+=" --num-actors $NUM_ACTORS --max-policy-lag $LAG --log-every 100000"
default_train_args+=" --eval-every 1000000 --checkpoint-every 1000000"
TRAIN_ARGS=${TRAIN_ARGS:-$default_train_args}
TRAIN_EXTRA_ARGS=${TRAIN_EXTRA_ARGS:-} # more flags after TRAIN_ARGS (an agent's own settings)
TRAIN_ROLLOUT=${TRAIN_ROLLOUT:-auto} # host, compiled, or auto: a resumed run's own, else the
                                     # faster of the bench's learner and xla phases, else host
RAW_CONFIGS=${RAW_CONFIGS:-1x64:16:64 1x64:16:32 1x128:16:64 4x16 4x32 8x16}
RAW_SECONDS=${RAW_SECONDS:-2}
BENCH_STEPS=${BENCH_STEPS:-150000}
BENCH_TORSO=${BENCH_TORSO:-$TORSO}
BENCH_ARGS=${BENCH_ARGS:---pong-unroll $UNROLL}
BENCH_LAYOUTS=${BENCH_LAYOUTS:-4x16:8 2x32:16 4x32:16 8x8}  # K x N[:BATCH], the layouts phase
LAYOUT_MODES=${LAYOUT_MODES:-async_xla}
PHASE_MAX_S=${PHASE_MAX_S:-200}    # a cap on each of raw, the bench (its four modes), layouts
RESERVE_S=${RESERVE_S:-60}         # kept after training: its stop, the plot, packing
MIN_TRAIN_S=${MIN_TRAIN_S:-60}     # train only with at least this much time left
TRAIN_MAX_S=${TRAIN_MAX_S:-}       # a cap on the training time (default: all that is left)
KILL_AFTER_S=${KILL_AFTER_S:-60}   # SIGKILL this long after the SIGTERM (a stop waits for the
                                   # iteration or checkpoint under way)
DEMO_RUN=${DEMO_RUN:-}             # sqil: a packed run (run.tgz, its parts, or their folder)
DEMO_EPISODES=${DEMO_EPISODES:-30} # whose player records this many games (record_demos.py)
DEMO_POLICY=${DEMO_POLICY:-greedy} # with its greedy or its behaviour policy
CKPT_MAX_PARTS=${CKPT_MAX_PARTS:-2}
PART_BYTES=${PART_BYTES:-15728640} # the packed run is split into files of at most this (15 MiB)
WHEELS=${WHEELS:-.whl}
CKPT=${CKPT:-.ckpt}                # a carried folder with run.tgz or run.tgz.0, .1, ...
WORK=${WORK:-/tmp/atari_gpu}
SKIP_INSTALL=${SKIP_INSTALL:-0}    # 1: the Python environment already has everything
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1

mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
elapsed() { echo $(($(date +%s) - START)); }
left() { echo $((START + BUDGET_S - $(date +%s))); }
has() { [[ ",$PHASES," == *",$1,"* ]]; }
say() { echo "=== [$(elapsed) s] $*"; }
# The parts of a packed run: SRC is run.tgz, its first part, or a folder holding them.
run_parts() {
  if [[ -d "$1" ]]; then ls "$1"/run.tgz "$1"/run.tgz.* 2>/dev/null | sort -V
  elif [[ -f "$1" && "$1" == *.tgz.* ]]; then ls "${1%.*}".* | sort -V
  elif [[ -f "$1" ]]; then echo "$1"
  fi
}

say "atari.sh: PHASES=$PHASES GAME=$GAME AGENT=$AGENT SEED=$SEED BUDGET_S=$BUDGET_S"
# Settings checked before any work: a typo would spend a start of the machine on nothing.
refuse() { say "$*"; exit 2; }
known_phases=",raw,noop,learner,xla_noop,xla,train,layouts,"
IFS=, read -ra asked <<<"$PHASES"
for phase in "${asked[@]}"; do
  [[ "$known_phases" == *",$phase,"* ]] ||
    refuse "PHASES: '$phase' is not a phase; the phases are ${known_phases:1:-1}"
done
[[ "$AGENT" =~ ^(impala|acer|sql|sqil)$ ]] ||
  refuse "AGENT=$AGENT: the agents with an atari preset are impala, acer, sql and sqil"
[[ "$TRAIN_ROLLOUT" =~ ^(auto|host|compiled)$ ]] ||
  refuse "TRAIN_ROLLOUT=$TRAIN_ROLLOUT: give auto, host or compiled"
for var in BUDGET_S TOTAL_STEPS NUM_ENVS NUM_ACTORS UNROLL BENCH_STEPS PHASE_MAX_S DEMO_EPISODES \
           CKPT_MAX_PARTS PART_BYTES ${TRAIN_MAX_S:+TRAIN_MAX_S}; do
  [[ "${!var}" =~ ^[0-9]+$ && "${!var}" -gt 0 ]] || refuse "$var=${!var}: give a whole number > 0"
done
for var in SEED LAG RESERVE_S MIN_TRAIN_S KILL_AFTER_S; do
  [[ "${!var}" =~ ^[0-9]+$ ]] || refuse "$var=${!var}: give a whole number >= 0"
done
[[ "$RAW_SECONDS" =~ ^[0-9]*\.?[0-9]+$ ]] || refuse "RAW_SECONDS=$RAW_SECONDS: give a number of seconds > 0"
if has raw; then
  for config in $RAW_CONFIGS; do
    [[ "$config" =~ ^[0-9]+x[0-9]+(:[0-9]+)?(:[0-9]+)?$ ]] ||
      refuse "RAW_CONFIGS: '$config' is not KxN[:THREADS[:BATCH]] (such as 1x64:16:32)"
  done
fi
if has layouts; then
  for layout in $BENCH_LAYOUTS; do
    [[ "$layout" =~ ^[0-9]+x[0-9]+(:[0-9]+)?$ ]] ||
      refuse "BENCH_LAYOUTS: '$layout' is not K x N[:BATCH] (such as 4x16:8)"
  done
fi
failed=()  # the phases that failed or ran past PHASE_MAX_S: the command fails with them
phase_failed() { say "$1: exit code $2$( (($2 == 124)) && echo ", stopped at PHASE_MAX_S=$PHASE_MAX_S s")"; failed+=("$1"); }
if [[ "$AGENT" == sqil ]] && has train && [[ -z "$(run_parts "$DEMO_RUN")" ]]; then
  refuse "AGENT=sqil trains from demonstrations: set DEMO_RUN to a packed run whose player records them (run.tgz, its parts, or their folder; now '${DEMO_RUN}')"
fi
rm -rf "$WORK" && mkdir -p "$WORK"
if [[ "$SKIP_INSTALL" != 1 ]]; then
  say "installing $(ls "$WHEELS"/*.whl 2>/dev/null | wc -l) wheels from $WHEELS into /tmp/site"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$WHEELS"/*.whl || { say "install failed"; exit 1; }
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$ROOT/src${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || echo "no nvidia-smi"
echo "$(nproc) CPU cores; load average $(cut -d' ' -f1-3 /proc/loadavg)"
"$PY" -c "import jax, envpool, offpolicy_ac; print('python', __import__('sys').version.split()[0], '| jax', jax.__version__, jax.devices(), '| envpool', envpool.__version__)" ||
  { say "the Python environment is not complete"; exit 1; }
"$PY" -c "import sys, envpool; sys.exit(sys.argv[1] not in envpool.list_all_envs())" "$GAME" ||
  refuse "GAME=$GAME: not an envpool task (Atari games are named like Pong-v5, Qbert-v5)"

if has raw; then
  say "raw envpool stepping (at most $PHASE_MAX_S s)"
  # shellcheck disable=SC2086
  timeout --signal=TERM --kill-after=10 "$PHASE_MAX_S" "$PY" benchmarks/gpu/raw_sweep.py \
    --task "$GAME" --configs $RAW_CONFIGS --seconds "$RAW_SECONDS" --out "$WORK/raw.json" ||
    phase_failed raw $?
fi

modes=()
has noop && modes+=(async_nolearn)
has learner && modes+=(async)
has xla_noop && modes+=(async_xla_nolearn)
has xla && modes+=(async_xla)
if ((${#modes[@]})); then
  say "training loop, ${modes[*]}, $NUM_ACTORS actors x $NUM_ENVS envs (at most $PHASE_MAX_S s)"
  # shellcheck disable=SC2086
  timeout --signal=TERM --kill-after=10 "$PHASE_MAX_S" "$PY" experiments/bench_async.py \
    --tasks "$GAME" --modes "${modes[@]}" --actors "$NUM_ACTORS" --pong-envs "$NUM_ENVS" \
    --pong-torso "$BENCH_TORSO" --pong-steps "$BENCH_STEPS" --max-policy-lag "$LAG" \
    --repeats 1 --raw-seconds "$RAW_SECONDS" --probe-seconds 1 --out "$WORK/bench" $BENCH_ARGS ||
    phase_failed "${modes[*]}" $?
fi

RUN=$WORK/run
start_steps=0
train_s=
train_rc=
if has train; then
  resume=()
  parts=$(run_parts "$CKPT")
  if [[ -n "$parts" ]]; then
    mkdir -p "$RUN"
    # shellcheck disable=SC2086
    cat $parts | tar -xzf - -C "$RUN" || { say "cannot unpack $CKPT"; exit 1; }
    start_steps=$(ls "$RUN/checkpoints" | grep -E '^[0-9]+$' | sort -n | tail -1)
    resume=(--resume)
    say "resuming from the checkpoint at ${start_steps:-?} env steps ($(echo $parts))"
    start_steps=${start_steps:-0}
  fi
  rollout=$TRAIN_ROLLOUT
  if [[ "$rollout" == auto ]]; then
    rollout=$("$PY" benchmarks/gpu/summarize.py rollout --work "$WORK") || rollout=host
  fi
  demos=()
  if [[ "$AGENT" == sqil && -f "$RUN/demos.npz" ]]; then
    # the run's own demonstrations, packed with it: recorded again, the file would differ
    mv "$RUN/demos.npz" "$WORK/demos.npz"
    [[ -f "$RUN/demos.txt" ]] && mv "$RUN/demos.txt" "$WORK/demos.txt"
    say "sqil: the demonstrations packed with the run"
    demos=(--demos "$WORK/demos.npz")
  elif [[ "$AGENT" == sqil ]]; then
    mkdir -p "$WORK/demo_run"
    say "sqil: recording $DEMO_EPISODES games of $DEMO_RUN's player ($DEMO_POLICY policy)"
    # shellcheck disable=SC2046
    if cat $(run_parts "$DEMO_RUN") | tar -xzf - -C "$WORK/demo_run" &&
      timeout --signal=TERM --kill-after=10 "$PHASE_MAX_S" "$PY" experiments/record_demos.py \
        --run-dir "$WORK/demo_run" --episodes "$DEMO_EPISODES" --policy "$DEMO_POLICY" \
        --out "$WORK/demos.npz" | tee "$WORK/demos.txt"; then
      demos=(--demos "$WORK/demos.npz")
    else
      phase_failed "sqil: recording demonstrations from $DEMO_RUN (no training)" $?
    fi
  fi
  limit=$(($(left) - RESERVE_S))
  if [[ -n "$TRAIN_MAX_S" ]] && ((TRAIN_MAX_S < limit)); then limit=$TRAIN_MAX_S; fi
  if [[ "$AGENT" == sqil && ${#demos[@]} == 0 ]]; then
    :
  elif ((limit < MIN_TRAIN_S)); then
    say "train: only $limit s left (MIN_TRAIN_S=$MIN_TRAIN_S): skipped"
  else
    say "train: $AGENT on $GAME, --rollout $rollout, for at most $limit s, then SIGTERM"
    t0=$(date +%s)
    # shellcheck disable=SC2086
    timeout --signal=TERM --kill-after="$KILL_AFTER_S" "$limit" "$PY" "experiments/$AGENT.py" \
      --preset atari --env-id "$GAME" --seed "$SEED" --total-env-steps "$TOTAL_STEPS" \
      --run-dir "$RUN" --rollout "$rollout" $TRAIN_ARGS $TRAIN_EXTRA_ARGS "${demos[@]}" \
      "${resume[@]}"
    train_rc=$?
    train_s=$(($(date +%s) - t0))
    case $train_rc in
      0) why="the run ended" ;;
      124) why="stopped by SIGTERM at the limit" ;;
      2) why="the run was refused: its error is above" ;;
      *) why="the run failed: its error is above" ;;
    esac
    say "train: exit code $train_rc after $train_s s ($why)"
  fi
fi

if [[ -f "$RUN/metrics.jsonl" ]]; then
  cp "$RUN/metrics.jsonl" "$RUN/config.json" "$OUT/" 2>/dev/null
  if timeout 60 "$PY" experiments/plot.py "$RUN" --out-dir "$WORK/plots" --reps 200 >/dev/null 2>&1 &&
    ls "$WORK"/plots/*.png >/dev/null 2>&1; then
    cp "$(ls "$WORK"/plots/*.png | head -1)" "$OUT/plot.png"
  elif [[ -f "$RUN/learning_curve.png" ]]; then
    say "experiments/plot.py failed: plot.png is the run's learning_curve.png"
    cp "$RUN/learning_curve.png" "$OUT/plot.png"
  else
    say "no plot.png: the run logged no return to plot ($(wc -l <"$RUN/metrics.jsonl") metrics lines; see --log-every in TRAIN_ARGS)"
  fi
  newest=$(ls "$RUN/checkpoints" 2>/dev/null | grep -E '^[0-9]+$' | sort -n | tail -1)
  if [[ -n "$newest" ]]; then
    # the run without its older checkpoints, final parameters, TensorBoard files and lock
    pack=$WORK/pack
    packed=0
    for with_best in 1 0; do
      rm -rf "$pack" "$WORK/run.tgz" "$OUT"/run.tgz*
      mkdir -p "$pack/checkpoints"
      cp -r "$RUN/checkpoints/$newest" "$pack/checkpoints/"
      for f in config.json metrics.jsonl summary.json learning_curve.png; do
        [[ -e "$RUN/$f" ]] && cp "$RUN/$f" "$pack/"
      done
      if [[ "$AGENT" == sqil && ${#demos[@]} != 0 ]]; then  # --resume needs the same file
        cp "$WORK/demos.npz" "$pack/"
        [[ -f "$WORK/demos.txt" ]] && cp "$WORK/demos.txt" "$pack/"
      fi
      if ((with_best)); then  # with the steps they were trained for (best.json)
        cp "$RUN"/best_params.msgpack* "$RUN"/best.json "$pack/" 2>/dev/null
        # and the checkpoint's, once a later evaluation replaced them (--resume needs them)
        if [[ -d "$RUN/best_at_checkpoint" ]]; then cp -r "$RUN/best_at_checkpoint" "$pack/"; fi
      fi
      tar -czf "$WORK/run.tgz" -C "$pack" .
      size=$(stat -c %s "$WORK/run.tgz")
      nparts=$(((size + PART_BYTES - 1) / PART_BYTES))
      if ((nparts <= CKPT_MAX_PARTS)); then
        if ((nparts == 1)); then
          cp "$WORK/run.tgz" "$OUT/run.tgz"
        else
          split -b "$PART_BYTES" -d -a 1 "$WORK/run.tgz" "$OUT/run.tgz."
        fi
        say "packed the run at its checkpoint of $newest env steps: $((size / 1024)) KiB in $nparts file(s)$( ((with_best)) || echo ', without best_params')"
        packed=1
        break
      fi
    done
    ((packed)) || say "the run's checkpoint ($((size / 1048576)) MiB) does not fit $CKPT_MAX_PARTS files: not packed"
  else
    say "the run wrote no checkpoint: nothing to resume from"
  fi
fi

if has layouts; then
  # after training, in the time left (the summary takes a few seconds)
  phase_end=$(($(date +%s) + PHASE_MAX_S))
  ((phase_end <= START + BUDGET_S - 10)) || phase_end=$((START + BUDGET_S - 10))
  say "training loop layouts, $LAYOUT_MODES: $BENCH_LAYOUTS (at most $((phase_end - $(date +%s))) s in all)"
  for layout in $BENCH_LAYOUTS; do
    [[ "$layout" =~ ^([0-9]+)x([0-9]+)(:([0-9]+))?$ ]]  # (checked at the start)
    k=${BASH_REMATCH[1]} n=${BASH_REMATCH[2]} b=${BASH_REMATCH[4]:-0}
    rest=$((phase_end - $(date +%s)))
    ((rest > 10)) || { say "layouts: no time left for $layout"; break; }
    # shellcheck disable=SC2086
    timeout --signal=TERM --kill-after=10 "$rest" "$PY" experiments/bench_async.py \
      --tasks "$GAME" --modes $LAYOUT_MODES --actors "$k" --pong-envs "$n" \
      --env-batch-size "$b" --pong-torso "$BENCH_TORSO" --pong-steps "$BENCH_STEPS" \
      --max-policy-lag "$LAG" --repeats 1 --raw-seconds "$RAW_SECONDS" --probe-seconds 1 \
      --out "$WORK/layout_${k}x${n}_$b" $BENCH_ARGS
    rc=$?
    # The layouts take the time left: one cut by it (124) ends the phase, not a failure.
    if ((rc == 124)); then say "layout $layout: cut by the time left"; break; fi
    ((rc == 0)) || phase_failed "layout $layout" "$rc"
  done
fi

[[ -f "$WORK/bench.txt" ]] && cat "$WORK/bench.txt"
"$PY" benchmarks/gpu/summarize.py summary --work "$WORK" --out "$OUT" --game "$GAME" \
  --agent "$AGENT" --start-env-steps "$start_steps" ${train_s:+--train-seconds "$train_s"} \
  ${train_rc:+--train-rc "$train_rc"} || say "summary failed"
"$PY" benchmarks/gpu/summarize.py check "$OUT"
check_rc=$?
say "done: $(ls "$OUT" | tr '\n' ' ')"
if [[ -n "${train_rc:-}" && "$train_rc" != 0 && "$train_rc" != 124 ]]; then
  exit "$train_rc" # a refused or failed table run fails the command, its files written
fi
if ((${#failed[@]})); then
  say "failed: ${failed[*]} (their errors are above); the other results are written"
  exit 1
fi
exit "$check_rc"
