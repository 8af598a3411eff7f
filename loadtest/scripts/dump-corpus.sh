#!/usr/bin/env bash
# dump-corpus.sh BINARY OUT: plays one fixed, seeded campaign on a fresh stack run by
# BINARY and dumps every recorded step and episode to OUT.steps.tsv and OUT.episodes.tsv,
# ordered, with the columns that differ between identical runs left out (wall-clock times,
# worker ids, the run id's random prefix). Two binaries that play episodes the same way
# give byte-identical dumps: `cmp` them to prove a refactor changed no behaviour.
#
#   loadtest/scripts/dump-corpus.sh /tmp/gauntlet-old /tmp/old
#   loadtest/scripts/dump-corpus.sh bin/gauntlet /tmp/new && cmp /tmp/old.steps.tsv /tmp/new.steps.tsv
#
# Environment: EPISODES (default 3000), ENV (shop), POLICIES (oracle=1,random=1), UP_FLAGS
# (extra flags for `gauntlet up`, e.g. --sandbox.runtime=process for codefix; compare
# codefix with POLICIES=oracle=1, since the random policy's commands hit wall-clock
# timeouts). The stack listens on loopback ports 14222 (NATS) and 19123 (ClickHouse).
set -euo pipefail
bin=$1
out=$2
dir=$(mktemp -d /tmp/gauntlet-corpus.XXXXXX)
"$bin" up --data-dir "$dir" --nats.port 14222 --clickhouse.port 19123 --http 127.0.0.1:19464 \
	--envapi.addr "" --temporal.port 17233 --temporal.ui-port -1 --log.level warn ${UP_FLAGS:-} >"$dir/up.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 1 120); do
	if [[ -f $dir/stack.json ]] && "$bin" sql --data-dir "$dir" "SELECT 1" >/dev/null 2>&1; then
		break
	fi
	sleep 1
done
"$bin" run --data-dir "$dir" --env "${ENV:-shop}" --episodes "${EPISODES:-3000}" --seed 7 \
	--policies "${POLICIES:-oracle=1,random=1}" --profiles baseline=1,stress=1,edge=1 >"$dir/run.log" 2>&1 ||
	{ cat "$dir/run.log" "$dir/up.log" >&2; exit 1; }
q() { clickhouse-client --port 19123 -d gauntlet --query "$1"; }
episode="substring(episode_id, position(episode_id, '-') + 1) AS e"
q "SELECT $episode, step, env, policy, profile, tool, args, observation, state_diff, fault_ids, fault_kinds,
	fault_targets, fault_details, tool_calls, errors, virtual_ns, bytes_in, bytes_out, progress, invalid_action,
	success, violation_rules, violation_reasons, safety_events, spend, terminated, truncated, reason,
	virtual_time_ns, reward, r_task, r_cost, r_safety, r_timeliness, r_causal, reward_names
	FROM steps FINAL ORDER BY e, step FORMAT TSV" >"$out.steps.tsv"
q "SELECT $episode, idx, env, params, seed, policy, profile, plan, steps, terminated, truncated, reason,
	infra_error, error, success, total_reward, faults_fired, virtual_time_ns
	FROM episodes FINAL ORDER BY e FORMAT TSV" >"$out.episodes.tsv"
wc -l "$out.steps.tsv" "$out.episodes.tsv"
