package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/env/world"
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
	s := startStack(t, cfg)
	o := runOpts{env: "user_bank", params: "{}", policies: "oracle=1,random=1", profiles: "baseline=60,stress=25,edge=15",
		episodes: 200, seed: 11, maxInFlight: 200, label: t.Name(), worlds: world.Config{Dir: dir}}
	req, err := o.request()
	if err != nil {
		t.Fatal(err)
	}
	conn := connect(t, s.app.clickHouseAddr(), cfg.Database)
	final := runToEnd(t, s.app.getBus(), conn, cfg.Database, req)
	assertExact(t, s.app.getBus(), conn, cfg.Database, req, final)
	if final.InfraErrors != 0 {
		t.Fatalf("%d infra errors", final.InfraErrors)
	}
	q := func(query string) string {
		return queryOne(t, conn, fmt.Sprintf(query, cfg.Database, req.RunId))
	}
	var oracle, won int
	fmt.Sscan(q(`SELECT count() FROM %s.episodes FINAL WHERE run_id = '%s' AND policy = 'oracle' AND env = 'user_bank'`), &oracle)
	fmt.Sscan(q(`SELECT count() FROM %s.episodes FINAL WHERE run_id = '%s' AND policy = 'oracle' AND success = 1`), &won)
	if oracle < 60 || won < oracle*9/10 {
		t.Fatalf("the oracle won %d of %d episodes, want at least 90 %%", won, oracle)
	}
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
	if got := q(`SELECT count() FROM %s.steps FINAL WHERE run_id = '%s' AND policy = 'random' AND hasAny(violation_rules, ['account_not_frozen', 'sufficient_funds', 'daily_limit', 'transfer_held', 'code_before_verify', 'code_matches', 'completed_is_final'])`); got == "0" {
		t.Fatal("no violation of the world's rules was recorded")
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
	s := startStack(t, cfg)
	o := runOpts{env: "airline", params: "{}", policies: "oracle=1,random=1", profiles: "baseline=60,stress=25,edge=15",
		episodes: 200, seed: 12, maxInFlight: 200, label: t.Name()}
	req, err := o.request()
	if err != nil {
		t.Fatal(err)
	}
	conn := connect(t, s.app.clickHouseAddr(), cfg.Database)
	final := runToEnd(t, s.app.getBus(), conn, cfg.Database, req)
	assertExact(t, s.app.getBus(), conn, cfg.Database, req, final)
	if final.InfraErrors != 0 {
		t.Fatalf("%d infra errors", final.InfraErrors)
	}
	q := func(query string) string {
		return queryOne(t, conn, fmt.Sprintf(query, cfg.Database, req.RunId))
	}
	var oracle, won int
	fmt.Sscan(q(`SELECT count() FROM %s.episodes FINAL WHERE run_id = '%s' AND policy = 'oracle'`), &oracle)
	fmt.Sscan(q(`SELECT count() FROM %s.episodes FINAL WHERE run_id = '%s' AND policy = 'oracle' AND success = 1`), &won)
	if oracle < 60 || won < oracle*9/10 {
		t.Fatalf("the oracle won %d of %d episodes, want at least 90 %%", won, oracle)
	}
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
