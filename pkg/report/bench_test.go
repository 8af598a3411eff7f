package report

import (
	"context"
	"flag"
	"strconv"
	"strings"
	"testing"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/gauntlet-rl/gauntlet/pkg/chlocal/chtest"
	"github.com/gauntlet-rl/gauntlet/pkg/trajectory"
)

var benchEpisodes = flag.Int("report.episodes", 20_000, "episodes of the synthetic run BenchmarkReport reports on (10 steps each)")

// BenchmarkReport measures Build, every query of the report, on one run of
// -report.episodes episodes of 10 steps each and a fault for every fourth step, made in
// ClickHouse by INSERT ... SELECT (a shape like shop's: a few tools, some repeated
// arguments, safety events and broken rules on a few steps). The ClickHouse server is a
// child of the test, so `nice` on the test applies to it too.
func BenchmarkReport(b *testing.B) {
	ctx := context.Background()
	ch := chtest.Start(b)
	conn, err := trajectory.Connect(ctx, ch.Addr(), "bench")
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	if err := trajectory.Migrate(ctx, conn, "bench"); err != nil {
		b.Fatal(err)
	}
	n := *benchEpisodes
	for _, stmt := range []string{
		`INSERT INTO bench.episodes (run_id, episode_id, idx, env, policy, profile, requested_at, steps, success, total_reward,
			faults_fired, infra_error, truncated, reason, version)
		SELECT 'rbench', concat('rbench-', toString(number)), number, 'shop', if(number % 2 = 1, 'oracle', 'random'),
			arrayElement(['baseline', 'stress', 'edge'], number % 3 + 1), toDateTime('2026-12-01 00:00:00'), 10,
			number % 3 = 0, (number % 100) / 100, number % 4, number % 97 = 0, number % 5 = 0 AND number % 3 != 0,
			if(number % 5 = 0 AND number % 3 != 0, 'max_steps', if(number % 3 = 0, 'success', 'failure')), 1
		FROM numbers({n})`,
		`INSERT INTO bench.steps (run_id, episode_id, step, requested_at, env, policy, tool, args, reward, r_safety, r_causal,
			safety_events, violation_rules, spend, tool_calls, bytes_in, bytes_out, wall_ns, virtual_ns, version)
		SELECT 'rbench', concat('rbench-', toString(intDiv(number, 10))), number % 10, toDateTime('2026-12-01 00:00:00'), 'shop',
			if(intDiv(number, 10) % 2 = 1, 'oracle', 'random'), arrayElement(['search', 'add_to_cart', 'checkout', 'pay'], number % 4 + 1),
			concat('{"q":', toString(number % 7), '}'), (number % 10) / 10, if(number % 50 = 0, -1, 0), if(number % 30 = 0, -1, 0),
			if(number % 50 = 0, ['destructive_command'], emptyArrayString()), if(number % 30 = 0, ['pay_before_cart'], emptyArrayString()),
			0.01, 1, 200, 400, 30000, 1000000, 1
		FROM numbers({steps})`,
		`INSERT INTO bench.faults (run_id, episode_id, step, seq, requested_at, profile, fault_id, kind, target, version)
		SELECT 'rbench', concat('rbench-', toString(number % {n})), intDiv(number, {n}), 0, toDateTime('2026-12-01 00:00:00'), 'stress',
			concat('f', toString(number)), arrayElement(['latency', 'http_error', 'timeout', 'truncate'], number % 4 + 1), 'payment', 1
		FROM numbers({faults})`,
	} {
		stmt = strings.NewReplacer("{n}", strconv.Itoa(n), "{steps}", strconv.Itoa(10*n), "{faults}", strconv.Itoa(10*n/4)).Replace(stmt)
		if err := conn.Exec(ctx, stmt); err != nil {
			b.Fatalf("%v\n%s", err, stmt)
		}
	}
	var r *Report
	b.ResetTimer()
	for b.Loop() {
		if r, err = Build(ctx, conn, Options{Database: "bench", RunIDs: []string{"rbench"}}); err != nil {
			b.Fatal(err)
		}
		if r.Episodes != uint64(n) {
			b.Fatalf("report of %d episodes; want %d", r.Episodes, n)
		}
	}
	b.StopTimer()
	checkAgainstDocs(b, ctx, conn, r)
}

// checkAgainstDocs runs docs/querying.md's overview and per-policy queries, as printed
// there, on the benchmark's run and checks the report's numbers against theirs: the
// numbers timed are the numbers documented, at the benchmark's scale.
func checkAgainstDocs(b *testing.B, ctx context.Context, conn driver.Conn, r *Report) {
	docs := map[string]string{}
	for _, blk := range sqlBlocks(b) {
		if blk.marker != "" {
			docs[blk.marker] = strings.ReplaceAll(blk.sql, "gauntlet.", "{db}.")
		}
	}
	sc := Scope{Database: "bench", Runs: []string{"rbench"}}
	ov, err := Run(ctx, conn, docs["overview"], sc)
	if err != nil || len(ov) != 1 {
		b.Fatalf("docs' overview query: %v (%d rows)", err, len(ov))
	}
	o := ov[0]
	if r.Episodes != o.u("episodes") || r.InfraErrors != o.u("infra_errors") || r.Success.Trials != o.u("scored") ||
		r.Success.Successes != o.u("succeeded") || r.RewardMean != o.f("reward_mean") ||
		r.Reward != o.q("reward_p50_p90_p99") || r.Steps != o.q("steps_p50_p90_p99") {
		b.Errorf("report overview %d episodes, %d infra, %d of %d, mean %v, reward %+v, steps %+v; docs' SQL gives %v",
			r.Episodes, r.InfraErrors, r.Success.Successes, r.Success.Trials, r.RewardMean, r.Reward, r.Steps, o)
	}
	pol, err := Run(ctx, conn, docs["by_policy"], sc)
	if err != nil || len(pol) != len(r.ByPolicy) {
		b.Fatalf("docs' by_policy query: %v (%d rows; the report has %d)", err, len(pol), len(r.ByPolicy))
	}
	for i, row := range pol {
		g := r.ByPolicy[i]
		if g.Key != row["policy"] || g.Episodes != row.u("episodes") || g.Success.Successes != row.u("succeeded") || g.Success.Trials != row.u("scored") {
			b.Errorf("report, policy %s: %d episodes, %d of %d; docs' SQL gives %v", g.Key, g.Episodes, g.Success.Successes, g.Success.Trials, row)
		}
	}
}
