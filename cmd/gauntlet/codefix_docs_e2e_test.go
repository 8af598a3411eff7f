package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/chlocal/chtest"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes"
)

// TestCodefixDocsServiceEndToEnd runs codefix episodes whose sandbox reaches the docs
// service through the fault gateway (param docs=1) through the whole pipeline on the
// process runtime: the faults the agent's requests met inside the sandbox reach
// ClickHouse's faults table, on the step that made the request.
func TestCodefixDocsServiceEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("needs ClickHouse and a sandbox runtime; run without -short")
	}
	sc := sandboxConfig(t, runtimes.Process)
	ch := chtest.Start(t)
	cfg := testConfig(t)
	cfg.ClickHouse = ch.Addr()
	cfg.Worker.Concurrency = 2
	cfg.Sandbox = sc
	s := startStack(t, cfg)
	db := cfg.Database
	conn := connect(t, ch.Addr(), db)

	o := runOpts{env: "codefix", params: `{"docs":1}`, policies: "oracle=1", profiles: "baseline=1",
		episodes: 4, seed: 9, maxInFlight: 4, label: t.Name()}
	req, err := o.request()
	if err != nil {
		t.Fatal(err)
	}
	final := runToEnd(t, s.app.getBus(), conn, db, req)
	if final.Ended != req.Episodes || final.InfraErrors != 0 {
		t.Fatalf("ended %d of %d, infra errors %d", final.Ended, req.Episodes, final.InfraErrors)
	}
	assertExact(t, s.app.getBus(), conn, db, req, final)
	if got := queryOne(t, conn, fmt.Sprintf(`SELECT sum(success) FROM %s.episodes FINAL WHERE run_id = '%s'`, db, req.RunId)); got != "4" {
		t.Errorf("oracle successes = %s of 4", got)
	}
	// Each oracle episode reads the guide once, at step 0, and baseline latency always
	// fires: one docs latency fault per episode, at step 0, plus whatever rarer docs
	// fault the plans drew.
	got := strings.Fields(queryOne(t, conn, fmt.Sprintf(`SELECT concat(toString(countIf(kind = 'latency')), ' ',
		toString(uniqExact(episode_id)), ' ', toString(max(step)), ' ', toString(min(position(detail, 'GET /guide') > 0)))
		FROM %s.faults FINAL WHERE run_id = '%s' AND target = 'docs'`, db, req.RunId)))
	if strings.Join(got, " ") != "4 4 0 1" {
		t.Errorf("docs faults in ClickHouse (latency rows, episodes, last step, all on GET /guide) = %v, want 4 4 0 1", got)
	}
}
