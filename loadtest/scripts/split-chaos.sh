#!/usr/bin/env bash
# split-chaos.sh: the split stack's chaos proof. Brings the split stack up
# (scripts/split.sh, in its own data dir) with seeded chaos (`gauntlet split up
# --chaos.seed`: one NATS node, one worker, one store, the scheduler leader and one
# ClickHouse replica killed with SIGKILL per round, in a seeded order, at seeded random
# times, each brought back by the stack's supervision), runs EPISODES episodes through it,
# waits until the stores have written them, and checks with FINAL that every episode and
# step is in ClickHouse exactly once and none is an infra error. Then it prints the chaos
# record and takes the stack down. Exits non-zero on any difference.
#
#   loadtest/scripts/split-chaos.sh                                   # 100,000 episodes
#   EPISODES=20000 SEED=7 ROUNDS=2 loadtest/scripts/split-chaos.sh
#
# Environment: EPISODES (100000), SEED (1; the run's seed and the chaos's), ROUNDS (chaos
# rounds, 4), MIN_WAIT/MAX_WAIT (waits before each kill, 10s/40s), GAUNTLET_DATA (the
# stack's data dir, default a new /tmp/gauntlet-chaos.XXXX, removed at the end unless
# KEEP=1), MAX_IN_FLIGHT (2000).
set -euo pipefail
cd "$(dirname "$0")/../.."

EPISODES=${EPISODES:-100000}
SEED=${SEED:-1}
ROUNDS=${ROUNDS:-4}
DATA=${GAUNTLET_DATA:-$(mktemp -d /tmp/gauntlet-chaos.XXXX)}
export GAUNTLET_DATA=$DATA
BIN=bin/gauntlet

down() {
	scripts/split.sh down >/dev/null 2>&1 || true
	[[ ${KEEP:-0} == 1 ]] || rm -rf "$DATA"
}
trap down EXIT

begin=$SECONDS
scripts/split.sh up --chaos.seed "$SEED" --chaos.rounds "$ROUNDS" \
	--chaos.min-wait "${MIN_WAIT:-10s}" --chaos.max-wait "${MAX_WAIT:-40s}" -- --log.level=warn
echo "split stack up in $((SECONDS - begin)) s"

# sql prints the first value of a query's first row (gauntlet sql prints a header, a rule,
# the rows and a count).
sql() { "$BIN" sql --data-dir "$DATA" "$1" | sed -n '3{s/ *$//;p}'; }

run_begin=$SECONDS
echo "run starts at $(date -u +%T)"
"$BIN" run --data-dir "$DATA" --episodes "$EPISODES" --policies oracle=1,random=1 \
	--seed "$SEED" --max-in-flight "${MAX_IN_FLIGHT:-2000}" --label "split-chaos seed $SEED" | tee "$DATA/run.txt"
echo "run ended at $(date -u +%T), after $((SECONDS - run_begin)) s"
run_id=$(sql "SELECT run_id FROM gauntlet.runs FINAL WHERE label = 'split-chaos seed $SEED' ORDER BY submitted_at DESC LIMIT 1")
[[ -n $run_id ]] || { echo "split-chaos: no run labelled 'split-chaos seed $SEED' in ClickHouse" >&2; exit 1; }

# The run ends when its episodes have ended; the stores may still be writing the last batch.
deadline=$((SECONDS + 600))
while :; do
	got=$(sql "SELECT count() FROM gauntlet.episodes FINAL WHERE run_id = '$run_id'")
	[[ $got == "$EPISODES" ]] && break
	if ((SECONDS > deadline)); then
		echo "split-chaos: $got of $EPISODES episodes in ClickHouse after 10 minutes" >&2
		exit 1
	fi
	sleep 2
done

fail=0
check() { # name, query, want
	local got
	got=$(sql "$2")
	if [[ $got == "$3" ]]; then
		printf '%-48s %s\n' "$1" "$got"
	else
		printf '%-48s %s, want %s\n' "$1" "$got" "$3" >&2
		fail=1
	fi
}
steps=$(sql "SELECT sum(steps) FROM gauntlet.episodes FINAL WHERE run_id = '$run_id'")
check "episodes (FINAL)" "SELECT count() FROM gauntlet.episodes FINAL WHERE run_id = '$run_id'" "$EPISODES"
check "distinct episode ids" "SELECT uniqExact(episode_id) FROM gauntlet.episodes FINAL WHERE run_id = '$run_id'" "$EPISODES"
check "steps (FINAL) = the episodes' step counts" "SELECT count() FROM gauntlet.steps FINAL WHERE run_id = '$run_id'" "$steps"
check "distinct (episode, step)" "SELECT uniqExact(episode_id, step) FROM gauntlet.steps FINAL WHERE run_id = '$run_id'" "$steps"
check "infra errors" "SELECT count() FROM gauntlet.episodes FINAL WHERE run_id = '$run_id' AND infra_error = 1" "0"

echo
"$BIN" split status --data-dir "$DATA" | tail -n 1
echo "chaos record ($DATA/chaos.jsonl):"
cat "$DATA/chaos.jsonl" 2>/dev/null || echo "(none)"
exit $fail
