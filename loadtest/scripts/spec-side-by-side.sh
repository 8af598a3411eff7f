#!/usr/bin/env bash
# spec-side-by-side.sh OLD NEW: the pipeline's cost under a reward spec against default/1,
# for two gauntlet binaries side by side (docs/benchmarks.md). Each round, each binary
# serves a fresh pipeline (its own ClickHouse), warmed by 3,000 episodes of each spec, then
# runs EPISODES shop episodes under default/1 and under SPEC with the same seed, the order
# of the two switching from run to run, and the order of the binaries from round to round.
# One line per run: wall seconds of `gauntlet run` (it returns once every step is in
# ClickHouse) and the CPU seconds of the serve process and of its ClickHouse, from the
# run's start to 5 s after it returned.
#
#   loadtest/scripts/spec-side-by-side.sh /tmp/gauntlet-old bin/gauntlet
#
# Environment: EPISODES (default 100000), ROUNDS (4), SPEC
# (loadtest/specs/eight-with-three-cel.yaml). Run it from the repository's root, with
# nothing else on the machine.
set -uo pipefail
old=${1:?usage: spec-side-by-side.sh OLD NEW}
new=${2:?usage: spec-side-by-side.sh OLD NEW}
N=${EPISODES:-100000}
ROUNDS=${ROUNDS:-4}
spec=${SPEC:-loadtest/specs/eight-with-three-cel.yaml}
cpu() { awk '{printf "%.2f", ($14+$15)/100}' "/proc/$1/stat"; }
k=0
for r in $(seq "$ROUNDS"); do
  bins="old new"; (( r % 2 == 0 )) && bins="new old"
  for b in $bins; do
    bin=$old; [[ $b == new ]] && bin=$new
    D=$(mktemp -d /tmp/gauntlet-spec-side-by-side.XXXX)
    "$bin" serve --target pipeline --data-dir "$D" --clickhouse.port 0 --log.level warn > "$D/serve.log" 2>&1 &
    spid=$!
    sleep 20
    ch=$(pgrep -f "clickhouse.*$D" | head -1)
    for extra in "" "--reward-spec $spec"; do
      # shellcheck disable=SC2086 # extra is two words or none
      "$bin" run --data-dir "$D" --env shop --policies oracle=1,random=1 --profiles baseline=1 --episodes 3000 --seed 1 $extra > /dev/null 2>&1
    done
    k=$((k+1)); order="default spec"; (( k % 2 == 0 )) && order="spec default"
    for s in $order; do
      extra=""; [[ $s == spec ]] && extra="--reward-spec $spec"
      g0=$(cpu $spid); c0=$(cpu "$ch"); l0=$(cut -d' ' -f1 /proc/loadavg); t0=$(date +%s.%N)
      # shellcheck disable=SC2086
      "$bin" run --data-dir "$D" --env shop --policies oracle=1,random=1 --profiles baseline=1 --episodes "$N" --seed $((100+r)) $extra > /dev/null 2>&1
      t1=$(date +%s.%N)
      sleep 5
      g1=$(cpu $spid); c1=$(cpu "$ch"); l1=$(cut -d' ' -f1 /proc/loadavg)
      echo "$(date -u +%H:%M:%S) round $r bin $b spec $s load $l0-$l1 wall $(echo "$t1 - $t0" | bc) gauntlet_s $(echo "$g1 - $g0" | bc) clickhouse_s $(echo "$c1 - $c0" | bc)"
    done
    kill $spid; wait $spid 2>/dev/null; rm -rf "$D"
  done
done
