package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/trajectory"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// TestCustomProfileRun submits a run whose mix names a user-defined YAML profile beside
// baseline, through `gauntlet run`'s request builder, and checks through ClickHouse that
// episodes drew both, by their declared ratio, each recording its own plan.
func TestCustomProfileRun(t *testing.T) {
	if testing.Short() {
		t.Skip("needs ClickHouse; run without -short")
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "flaky-shop.yaml")
	spec := "name: flaky-shop\nfaults:\n" +
		"  - {id: pay-429, kind: http_error, probability: 0.3, match: {services: [payment]}, params: {status: 429, retry_after_ms: 1500}}\n" +
		"  - {id: lat, kind: latency, params: {mean_ms: 80, jitter_ms: 10}}\n"
	if err := os.WriteFile(path, []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	o := runOpts{env: "shop", params: "{}", policies: "oracle=1", profiles: "baseline=1,flaky-shop=3", profileFiles: path,
		episodes: 200, seed: 5, maxInFlight: 200, label: t.Name()}
	req, err := o.request()
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t)
	s := startStack(t, cfg)
	conn := connect(t, s.app.clickHouseAddr(), cfg.Database)
	runToEnd(t, s.app.getBus(), conn, cfg.Database, req)

	q := func(where string) string {
		return queryOne(t, conn, fmt.Sprintf(`SELECT count() FROM %s.episodes_final WHERE run_id = '%s' AND %s`, cfg.Database, req.RunId, where))
	}
	custom, base := q("profile = 'flaky-shop'"), q("profile = 'baseline'")
	var nc, nb int
	fmt.Sscan(custom, &nc)
	fmt.Sscan(base, &nb)
	if nc+nb != 200 || nc < 120 || nc > 175 {
		t.Fatalf("flaky-shop %d, baseline %d episodes: want 200 in about a 3:1 ratio", nc, nb)
	}
	// Plans are recorded by reference: every flaky-shop episode names the profile's one
	// template, whose row holds its rules; the built-in plans name none.
	holds := fmt.Sprintf(`plan = '' AND plan_digest != '' AND plan_template IN (SELECT template FROM %s.plan_templates_final
		WHERE profile = 'flaky-shop' AND position(plan, '"id":"payment.pay-429"') > 0 AND position(plan, 'http_503') = 0)`, cfg.Database)
	if got := q("profile = 'flaky-shop' AND " + holds); got != custom {
		t.Fatalf("%s of %d flaky-shop plans name a template holding the profile's rules and only them", got, nc)
	}
	if got := q("profile = 'baseline' AND plan_template = '' AND plan_digest != ''"); got != base {
		t.Fatalf("%s of %d baseline plans are recorded by their inputs alone", got, nb)
	}
	if got := queryOne(t, conn, fmt.Sprintf(`SELECT count() FROM %s.plan_templates_final`, cfg.Database)); got != "1" {
		t.Fatalf("%s plan templates recorded, want 1", got)
	}
	// Each recorded plan re-derives, digest checked, to what the episode met.
	eps, err := trajectory.RunEpisodes(context.Background(), conn, cfg.Database, req.RunId)
	if err != nil {
		t.Fatal(err)
	}
	for _, row := range eps {
		plan, err := trajectory.EpisodePlan(context.Background(), conn, cfg.Database, row, envServices(t, "shop"))
		if err != nil {
			t.Fatal(err)
		}
		if row.Profile == "flaky-shop" && !slices.ContainsFunc(plan.Rules, func(r *gauntletv1.FaultRule) bool { return r.Id == "payment.pay-429" }) {
			t.Fatalf("episode %s: re-derived plan lacks the profile's 429: %v", row.EpisodeID, plan)
		}
	}
	if got := queryOne(t, conn, fmt.Sprintf(`SELECT count() FROM %s.faults_final WHERE run_id = '%s' AND fault_id = 'payment.pay-429'`, cfg.Database, req.RunId)); got == "0" {
		t.Fatal("the profile's 429 never fired in 150 episodes")
	}
}

// envServices is the services of a registered env, which plans are derived over.
func envServices(t *testing.T, name string) []string {
	t.Helper()
	e, err := env.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	return e.Spec().Services
}
