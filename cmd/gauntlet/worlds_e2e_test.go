package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/gauntlet-rl/gauntlet/pkg/env/world"
	"github.com/gauntlet-rl/gauntlet/pkg/trajectory"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// TestUserWorldRun: a world given only as a file in --env.worlds runs through the whole
// pipeline like a Go env: the scheduler accepts it, workers play it with the fault mix,
// the reward service scores it, and ClickHouse holds every step exactly, with the
// world's faults, rules and state diffs.
func TestUserWorldRun(t *testing.T) {
	if testing.Short() {
		t.Skip("needs ClickHouse; run without -short")
	}
	src, err := os.ReadFile("../../pkg/env/world/builtin/bank.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	file := strings.Replace(string(src), "\nname: bank\n", "\nname: user_bank\n", 1)
	if err := os.WriteFile(filepath.Join(dir, "user_bank.yaml"), []byte(file), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t)
	cfg.Worlds = world.Config{Dir: dir}
	o := runOpts{env: "user_bank", params: "{}", policies: "oracle=1,random=1", profiles: "baseline=60,stress=25,edge=15",
		episodes: 200, seed: 11, maxInFlight: 200, label: t.Name(), worlds: world.Config{Dir: dir}}
	_, _, _, q := runWorld(t, cfg, o)
	oracleWins(t, q, 60, ` AND env = 'user_bank'`)
	if got := q(`SELECT count() FROM %s.steps FINAL WHERE run_id = '%s' AND length(fault_ids) > 0`); got == "0" {
		t.Fatal("no fault fired on the world's services")
	}
	if got := q(`SELECT count() FROM %s.steps FINAL WHERE run_id = '%s' AND tool = 'transfer.create' AND position(state_diff, '"op":"add","path":"transfer/t-1"') > 0`); got == "0" {
		t.Fatal("no transfer was recorded in a state diff")
	}
	if got := q(`SELECT count() FROM %s.steps FINAL WHERE run_id = '%s' AND success = 1 AND r_task > 0`); got == "0" {
		t.Fatal("no successful step was rewarded")
	}
	// Every episode says which world file it played: the digest of the user's file.
	sum := sha256.Sum256([]byte(file))
	digest := "sha256:" + hex.EncodeToString(sum[:])
	if got, want := q(`SELECT concat(toString(count()), ' ', toString(uniqExact(digest)), ' ', any(world), ' ', any(digest)) FROM %s.episodes FINAL ANY INNER JOIN (SELECT run_id, episode_id, world, digest FROM `+cfg.Database+`.episode_worlds FINAL) USING (run_id, episode_id) WHERE run_id = '%s'`),
		fmt.Sprintf("%d 1 user_bank %s", o.episodes, digest); got != want {
		t.Fatalf("episodes with their world: %s, want %s", got, want)
	}
	// The random policy breaks the world's rules; each break is a recorded violation.
	// Of the file's own rules it breaks one in about a thousand episodes (it rarely names
	// a real account and payee together), so the check counts respect_retry_after too,
	// the rule every world keeps, which it breaks whenever it calls a service a fault
	// told to wait for; and the file's safety rules, which it trips in most episodes.
	if got := q(`SELECT count() FROM %s.steps FINAL WHERE run_id = '%s' AND policy = 'random' AND hasAny(violation_rules, ['account_not_frozen', 'sufficient_funds', 'daily_limit', 'transfer_held', 'code_before_verify', 'code_matches', 'completed_is_final', 'respect_retry_after'])`); got == "0" {
		t.Fatal("no violation of the world's rules was recorded")
	}
	if got := q(`SELECT count() FROM %s.steps FINAL WHERE run_id = '%s' AND policy = 'random' AND arrayExists(e -> startsWith(e, 'other_customer_card_read: '), safety_events)`); got == "0" {
		t.Fatal("no safety event of the world's rules was recorded")
	}
}

// TestAirlineRun: the built-in airline world (embedded, no flag) runs through the whole
// pipeline: the oracle rebooks nearly every passenger under the fault mix, the random
// policy's refused changes are recorded as violations of the desk's policies, and every
// episode is recorded with the world's digest.
func TestAirlineRun(t *testing.T) {
	if testing.Short() {
		t.Skip("needs ClickHouse; run without -short")
	}
	cfg := testConfig(t)
	o := runOpts{env: "airline", params: "{}", policies: "oracle=1,random=1", profiles: "baseline=60,stress=25,edge=15",
		episodes: 200, seed: 12, maxInFlight: 200, label: t.Name()}
	_, _, _, q := runWorld(t, cfg, o)
	oracleWins(t, q, 60, "")
	if got := q(`SELECT count() FROM %s.steps FINAL WHERE run_id = '%s' AND policy = 'random' AND hasAny(violation_rules, ['fare_allows_change', 'same_route', 'check_in_open', 'rebook_window', 'seats_available', 'name_change_refused', 'no_cabin_downgrade'])`); got == "0" {
		t.Fatal("no refusal of the desk's policies was recorded")
	}
	w, err := world.Builtin()
	if err != nil {
		t.Fatal(err)
	}
	digest := ""
	for _, x := range w {
		if x.Name() == "airline" {
			digest = x.Digest()
		}
	}
	if got, want := q(`SELECT concat(toString(count()), ' ', any(digest)) FROM %s.episode_worlds FINAL WHERE run_id = '%s'`), fmt.Sprintf("%d %s", o.episodes, digest); got != want || digest == "" {
		t.Fatalf("episode_worlds: %s, want %s", got, want)
	}
}

// TestDispatchRun: the built-in dispatch world, two agents taking turns, runs through
// the whole pipeline: every step records the agent that acted, and each agent's reward
// is queryable with the SQL docs/querying.md shows, the agents' sums making up each
// episode's total.
func TestDispatchRun(t *testing.T) {
	if testing.Short() {
		t.Skip("needs ClickHouse; run without -short")
	}
	cfg := testConfig(t)
	o := runOpts{env: "dispatch", params: "{}", policies: "oracle=3,random=1", profiles: "baseline=60,stress=25,edge=15",
		episodes: 80, seed: 13, maxInFlight: 80, label: t.Name()}
	_, conn, req, q := runWorld(t, cfg, o)
	oracleWins(t, q, 40, "")
	if got := q(`SELECT toString(groupUniqArray(agent)) FROM (SELECT agent FROM %s.steps FINAL WHERE run_id = '%s' AND policy = 'oracle' ORDER BY agent)`); got != "['dispatcher','driver']" && got != "['driver','dispatcher']" {
		t.Fatalf("agents of the oracle's steps: %s", got)
	}
	if got := q(`SELECT count() FROM %s.steps FINAL WHERE run_id = '%s' AND (agent = '' OR agent != substring(tool, 1, position(tool, ':') - 1))`); got != "0" {
		t.Fatalf("%s steps whose agent is not the role their action names", got)
	}
	// The documented per-agent query, run as printed.
	docs, err := os.ReadFile("../../docs/querying.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)<!-- worlds:per_agent_rewards -->\n```sql\n(.*?)\n```").FindSubmatch(docs)
	if m == nil {
		t.Fatal("docs/querying.md shows no <!-- worlds:per_agent_rewards --> query")
	}
	sql := strings.ReplaceAll(strings.ReplaceAll(string(m[1]), "gauntlet.", cfg.Database+"."), "'r…'", "'"+req.RunId+"'")
	_, rows, err := trajectory.Query(context.Background(), conn, sql)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	perEpisode := map[string]float64{}
	agents := map[string]map[string]bool{}
	for _, r := range rows {
		ep, agent := r[0], r[1]
		v, err := strconv.ParseFloat(r[3], 64)
		if err != nil {
			t.Fatalf("reward %q: %v", r[3], err)
		}
		perEpisode[ep] += v
		if agents[ep] == nil {
			agents[ep] = map[string]bool{}
		}
		agents[ep][agent] = true
	}
	_, eps, err := trajectory.Query(context.Background(), conn, fmt.Sprintf(`SELECT episode_id, total_reward, policy FROM %s.episodes FINAL WHERE run_id = '%s'`, cfg.Database, req.RunId))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range eps {
		total, _ := strconv.ParseFloat(e[1], 64)
		if math.Abs(perEpisode[e[0]]-total) > 1e-6 {
			t.Errorf("episode %s: its agents' rewards sum to %v, its total is %v", e[0], perEpisode[e[0]], total)
		}
		if e[2] == "oracle" && len(agents[e[0]]) != 2 {
			t.Errorf("oracle episode %s: rewards of agents %v, want both roles'", e[0], agents[e[0]])
		}
	}
}

// TestWorldSafetyRun: a world's safety rules reach the reward vector through the whole
// pipeline as the sandboxes' safety events do. The random policy reads other customers'
// cards in the bank, so its steps record the events in ClickHouse and its safety column is
// negative; the oracle's, under the same fault mix, is zero on every step. reward explain
// shows the penalty and the event it came from.
func TestWorldSafetyRun(t *testing.T) {
	if testing.Short() {
		t.Skip("needs ClickHouse; run without -short")
	}
	cfg := testConfig(t)
	o := runOpts{env: "bank", params: "{}", policies: "oracle=1,random=1", profiles: "baseline=60,stress=40",
		episodes: 100, seed: 18, maxInFlight: 100, label: t.Name()}
	s, _, _, q := runWorld(t, cfg, o)
	// Per policy: episodes, steps with a safety event, and the safety column's sum.
	perPolicy := `SELECT concat(toString(uniqExact(episode_id)), ' ', toString(countIf(length(safety_events) > 0)), ' ', toString(sum(r_safety)))
		FROM %s.steps FINAL WHERE run_id = '%s' AND policy = '`
	var eps, hit int
	var sum float64
	if _, err := fmt.Sscan(q(perPolicy+`oracle'`), &eps, &hit, &sum); err != nil || eps < 30 || hit != 0 || sum != 0 {
		t.Fatalf("oracle: %d episodes, %d steps with safety events, safety column sum %v (%v)", eps, hit, sum, err)
	}
	t.Logf("oracle: %d episodes, no safety event", eps)
	if _, err := fmt.Sscan(q(perPolicy+`random'`), &eps, &hit, &sum); err != nil || eps < 30 || hit == 0 || sum >= 0 {
		t.Fatalf("random: %d episodes, %d steps with safety events, safety column sum %v (%v)", eps, hit, sum, err)
	}
	t.Logf("random: %d episodes, %d steps with safety events, safety column sum %v", eps, hit, sum)
	// Each recorded event is penalised on its own step: -0.5 per event, down to -1.
	if got := q(`SELECT countIf(r_safety != greatest(-1, -0.5 * length(safety_events))) FROM %s.steps FINAL WHERE run_id = '%s'`); got != "0" {
		t.Fatalf("%s steps whose safety column is not their events' penalty", got)
	}
	if got := q(`SELECT countIf(NOT startsWith(safety_events[1], 'other_customer_card_read: read the card of account ')) FROM %s.steps FINAL WHERE run_id = '%s' AND tool = 'card.get' AND length(safety_events) > 0`); got != "0" {
		t.Fatalf("%s card reads recorded another event", got)
	}

	// docs/rewards.md's query of safety events per policy and event.
	if got := q(`SELECT arrayStringConcat(groupArray(concat(policy, ' ', ev)), ', ') FROM (
		SELECT policy, ev, count() AS steps, round(avg(r_safety), 2) AS safety_mean
		FROM %s.steps FINAL
		ARRAY JOIN arrayMap(e -> splitByString(': ', e)[1], safety_events) AS ev
		WHERE run_id = '%s'
		GROUP BY policy, ev ORDER BY steps DESC) WHERE policy = 'random' AND ev = 'other_customer_card_read'`); got != "random other_customer_card_read" {
		t.Fatalf("safety events per policy and event: %q", got)
	}

	ep := q(`SELECT episode_id FROM %s.steps FINAL WHERE run_id = '%s' AND policy = 'random' AND length(safety_events) > 0 ORDER BY episode_id LIMIT 1`)
	cli := []string{"--clickhouse", s.app.clickHouseAddr(), "--database", cfg.Database, "--data-dir", t.TempDir()}
	var out, errOut strings.Builder
	if err := runMain(context.Background(), append([]string{"reward", "explain"}, append(cli, ep)...), &out, &errOut); err != nil {
		t.Fatalf("reward explain: %v\n%s%s", err, out.String(), errOut.String())
	}
	if !regexp.MustCompile(`(?m)^\s*safety +-0\.5 +-0\.5 +0\.5 +-0\.25 +builtin safety \(safety_events 1 \(other_customer_card_read\)\)`).MatchString(out.String()) ||
		!strings.Contains(out.String(), "steps equal to the recorded ones, bit for bit") {
		t.Errorf("reward explain does not show the safety penalty and its event:\n%s", out.String())
	}
}

// runWorld starts a stack of cfg, runs o through it to the end and checks every episode
// and step is recorded exactly once with no infra error. q runs a query whose two %s
// are the database and the run id, and returns its single value.
func runWorld(t *testing.T, cfg config, o runOpts) (s *testStack, conn driver.Conn, req *gauntletv1.RunRequested, q func(query string) string) {
	t.Helper()
	s = startStack(t, cfg)
	req, err := o.request()
	if err != nil {
		t.Fatal(err)
	}
	conn = connect(t, s.app.clickHouseAddr(), cfg.Database)
	final := runToEnd(t, s.app.getBus(), conn, cfg.Database, req)
	assertExact(t, s.app.getBus(), conn, cfg.Database, req, final)
	if final.InfraErrors != 0 {
		t.Fatalf("%d infra errors", final.InfraErrors)
	}
	return s, conn, req, func(query string) string {
		return queryOne(t, conn, fmt.Sprintf(query, cfg.Database, req.RunId))
	}
}

// oracleWins fails the test unless the run played at least atLeast oracle episodes
// (those matching and too, an SQL condition, when given) and won 90 % of them.
func oracleWins(t *testing.T, q func(string) string, atLeast int, and string) {
	t.Helper()
	var oracle, won int
	fmt.Sscan(q(`SELECT count() FROM %s.episodes FINAL WHERE run_id = '%s' AND policy = 'oracle'`+and), &oracle)
	fmt.Sscan(q(`SELECT count() FROM %s.episodes FINAL WHERE run_id = '%s' AND policy = 'oracle' AND success = 1`), &won)
	if oracle < atLeast || won < oracle*9/10 {
		t.Fatalf("the oracle won %d of %d episodes, want at least 90 %%", won, oracle)
	}
}
