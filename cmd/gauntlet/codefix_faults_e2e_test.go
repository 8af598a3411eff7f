package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/chlocal/chtest"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes"
)

// TestCodefixUnderStorageProfile runs codefix episodes whose plans come from a
// user-defined profile of storage and resource faults through the whole pipeline into
// ClickHouse, on the process runtime (pkg/env/codefix and pkg/sandbox/tools run the same
// faults on containerd too): the plan carries the faults (episodes.plan's boundary_spec),
// they fire on the agents' file tools and on the files their commands touch (the process
// runtime's FUSE layer) and are recorded in the faults table like the sim's, the ambient
// ones on step 0, and an episode rebuilt from its record with
// `gauntlet episode snapshot` meets the same faults and makes every observation again.
func TestCodefixUnderStorageProfile(t *testing.T) {
	if testing.Short() {
		t.Skip("needs ClickHouse and a sandbox runtime; run without -short")
	}
	path := filepath.Join(t.TempDir(), "bad-disk.yaml")
	spec := "name: bad-disk\nfaults:\n" +
		"  - {id: slow, kind: io_latency, params: {mean_ms: 30, jitter_ms: 10}}\n" +
		"  - {id: ro, kind: read_only, probability: 0.4, match: {ops: [write]}}\n" +
		"  - {id: full, kind: disk_full, probability: 0.2, match: {ops: [create]}}\n" +
		"  - {id: cpu, kind: cpu_throttle, params: {cpu_fraction: 0.5}}\n"
	if err := os.WriteFile(path, []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	sc := sandboxConfig(t, runtimes.Process)
	ch := chtest.Start(t)
	cfg := testConfig(t)
	cfg.ClickHouse = ch.Addr()
	cfg.Worker.Concurrency = 2
	cfg.Sandbox = sc
	cfg.Sandbox.PoolSize = 1
	s := startStack(t, cfg)
	db := cfg.Database
	conn := connect(t, ch.Addr(), db)
	o := runOpts{env: "codefix", params: "{}", policies: "oracle=1,random=1", profiles: "bad-disk=1", profileFiles: path,
		episodes: 6, seed: 9, maxInFlight: 4, label: t.Name()}
	req, err := o.request()
	if err != nil {
		t.Fatal(err)
	}
	final := runToEnd(t, s.app.getBus(), conn, db, req)
	if final.Ended != req.Episodes || final.InfraErrors != 0 {
		t.Fatalf("ended %d of %d, infra errors %d", final.Ended, req.Episodes, final.InfraErrors)
	}
	q := func(format string) string {
		return queryOne(t, conn, fmt.Sprintf(format, db, req.RunId))
	}
	// The plans are recorded by reference to the profile's template, which carries the
	// storage faults in its boundary spec.
	if got := queryOne(t, conn, fmt.Sprintf(`SELECT toString(count()) FROM %s.episodes_final WHERE run_id = '%s' AND plan_template IN
		(SELECT template FROM %s.plan_templates_final WHERE position(plan, 'boundary_spec') > 0 AND position(plan, 'read_only') > 0)`, db, req.RunId, db)); got != "6" {
		t.Fatalf("%s of 6 recorded plans carry the profile's storage faults", got)
	}
	kinds := q(`SELECT arrayStringConcat(arraySort(groupUniqArray(kind)), ',') FROM %s.faults_final WHERE run_id = '%s'`)
	for _, k := range []string{"cpu_throttle", "io_latency", "read_only"} {
		if !strings.Contains(kinds, k) {
			t.Errorf("fault kinds recorded: %s; want %s among them", kinds, k)
		}
	}
	if got := q(`SELECT toString(countIf(kind = 'cpu_throttle' AND step = 0)) FROM %s.faults_final WHERE run_id = '%s'`); got != "6" {
		t.Errorf("cpu_throttle recorded on step 0 of %s of 6 episodes", got)
	}
	if got := q(`SELECT toString(count()) FROM %s.steps FINAL WHERE run_id = '%s' AND position(observation, 'read-only file system') > 0`); got == "0" {
		t.Error("no agent observed a read-only file system")
	}
	// The agents' commands met storage faults too, through the process runtime's FUSE
	// layer, recorded on the step that ran them (target sandbox/shell.exec).
	if got := q(`SELECT toString(countIf(target = 'sandbox/shell.exec' AND kind = 'io_latency' AND position(detail, 'read /') = 1)) FROM %s.faults_final WHERE run_id = '%s'`); got == "0" {
		t.Error("no io_latency recorded on a command's read")
	}
	// Rebuild an episode that met a storage fault: the replay meets the same faults.
	ep := q(`SELECT any(episode_id) FROM %s.faults_final WHERE run_id = '%s' AND kind = 'read_only'`)
	var stdout, stderr bytes.Buffer
	args := []string{"episode", "snapshot", ep, "--step", "3", "--out", filepath.Join(t.TempDir(), "ws"),
		"--clickhouse", ch.Addr(), "--database", db, "--sandbox.runtime", runtimes.Process,
		"--sandbox.state-dir", sc.StateDir + "-cli"}
	if err := runMain(context.Background(), args, &stdout, &stderr); err != nil {
		t.Fatalf("%v: %v\n%s%s", args, err, stdout.String(), stderr.String())
	}
	if !strings.Contains(stdout.String(), "every observation identical") {
		t.Errorf("replay under storage faults not exact:\n%s", stdout.String())
	}
	t.Logf("fault kinds: %s\n%s", kinds, stdout.String())
}
