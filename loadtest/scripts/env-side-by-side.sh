#!/usr/bin/env bash
# env-side-by-side.sh BIN[=ENV,ENV...] ...: the pipeline's cost per env, for one or more
# gauntlet binaries side by side (docs/benchmarks.md). Each round, each binary (their
# order turning from round to round) serves a fresh pipeline (its own ClickHouse), with
# the repository's example worlds registered when it knows --env.worlds, is warmed by
# 3,000 episodes of each of its envs, then runs EPISODES episodes of each env (half the
# oracle's, half the random policy's, under the baseline profile) with the same seed, the
# order of the envs turning from round to round. One line per run: wall seconds of
# `gauntlet run` (it returns once every step is in ClickHouse), the steps it reported, and
# the CPU seconds of the serve process and of its ClickHouse from the run's start to 5 s
# after it returned.
#
#   loadtest/scripts/env-side-by-side.sh /tmp/gauntlet-old=shop bin/gauntlet=shop,shop_world
#
# ENV defaults to shop. Environment: EPISODES (default 60000), ROUNDS (4). Run it from the
# repository's root, with nothing else on the machine.
set -uo pipefail
(( $# > 0 )) || { echo "usage: env-side-by-side.sh BIN[=ENV,ENV...] ..." >&2; exit 2; }
N=${EPISODES:-60000}
ROUNDS=${ROUNDS:-4}
worlds=$PWD/examples/worlds
cpu() { awk '{printf "%.2f", ($14+$15)/100}' "/proc/$1/stat"; }
bins=("$@")
for r in $(seq "$ROUNDS"); do
  # Rotate the binaries' order: round r starts with binary r-1 (mod their count).
  order=()
  for i in "${!bins[@]}"; do order+=("${bins[$(( (i + r - 1) % ${#bins[@]} ))]}"); done
  for arg in "${order[@]}"; do
    bin=${arg%%=*}
    envs=shop; [[ $arg == *=* ]] && envs=${arg#*=}
    IFS=, read -r -a envlist <<< "$envs"
    wargs=()
    help=$("$bin" serve -h 2>&1)
    [[ $help == *-env.worlds* ]] && wargs=(--env.worlds "$worlds")
    D=$(mktemp -d /tmp/gauntlet-env-side-by-side.XXXX)
    "$bin" serve --target pipeline --data-dir "$D" --clickhouse.port 0 --log.level warn "${wargs[@]}" > "$D/serve.log" 2>&1 &
    spid=$!
    sleep 20
    ch=$(pgrep -f "clickhouse.*$D" | head -1)
    for e in "${envlist[@]}"; do
      "$bin" run --data-dir "$D" "${wargs[@]}" --env "$e" --policies oracle=1,random=1 --profiles baseline=1 --episodes 3000 --seed 1 > /dev/null 2>&1
    done
    n=${#envlist[@]}
    for j in $(seq 0 $((n - 1))); do
      e=${envlist[$(( (j + r) % n ))]}
      g0=$(cpu $spid); c0=$(cpu "$ch"); l0=$(cut -d' ' -f1 /proc/loadavg); t0=$(date +%s.%N)
      out=$("$bin" run --data-dir "$D" "${wargs[@]}" --env "$e" --policies oracle=1,random=1 --profiles baseline=1 --episodes "$N" --seed $((100+r)) 2>&1 | tr '\r' '\n' | grep -a 'episodes, .* steps in' | tail -1)
      t1=$(date +%s.%N)
      sleep 5
      g1=$(cpu $spid); c1=$(cpu "$ch"); l1=$(cut -d' ' -f1 /proc/loadavg)
      steps=$(sed -E 's/^[0-9]+ episodes, ([0-9]+) steps.*/\1/' <<< "$out")
      echo "$(date -u +%H:%M:%S) round $r bin $bin env $e load $l0-$l1 wall $(echo "$t1 - $t0" | bc) steps $steps gauntlet_s $(echo "$g1 - $g0" | bc) clickhouse_s $(echo "$c1 - $c0" | bc)"
    done
    kill $spid; wait $spid 2>/dev/null; rm -rf "$D"
  done
done
