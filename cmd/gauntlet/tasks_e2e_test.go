package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/chlocal/chtest"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes"
)

// TestTasksEndToEnd plays episodes of the tasks env (tasks of datasets/gauntlet picked by
// the seed) through the whole pipeline on the process runtime into a real ClickHouse:
// every oracle episode succeeds, each step is recorded exactly once, the reset names the
// task's digest and the last step holds the verifier's rewards; then a recorded episode is
// rebuilt by replay with `gauntlet episode snapshot`, every observation identical.
func TestTasksEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("needs ClickHouse and a sandbox runtime; run without -short")
	}
	dataset, err := filepath.Abs("../../datasets/gauntlet")
	if err != nil {
		t.Fatal(err)
	}
	sc := sandboxConfig(t, runtimes.Process)
	ch := chtest.Start(t)
	cfg := testConfig(t)
	cfg.ClickHouse = ch.Addr()
	cfg.Worker.Concurrency = 2
	cfg.Sandbox = sc
	if err := cfg.Tasks.Datasets.Set("gauntlet=" + dataset); err != nil {
		t.Fatal(err)
	}
	s := startStack(t, cfg)
	db := cfg.Database
	conn := connect(t, ch.Addr(), db)

	params, _ := json.Marshal(map[string]string{"dataset": "gauntlet"})
	o := runOpts{env: "tasks", params: string(params), policies: "oracle=1", profiles: "baseline=1",
		episodes: 4, seed: 11, maxInFlight: 4, label: t.Name()}
	req, err := o.request()
	if err != nil {
		t.Fatal(err)
	}
	final := runToEnd(t, s.app.getBus(), conn, db, req)
	if final.Ended != req.Episodes || final.InfraErrors != 0 {
		t.Fatalf("ended %d of %d, infra errors %d", final.Ended, req.Episodes, final.InfraErrors)
	}
	assertExact(t, s.app.getBus(), conn, db, req, final)
	got := queryOne(t, conn, fmt.Sprintf(`SELECT concat(toString(count()), ' ', toString(sum(success))) FROM %s.episodes FINAL WHERE run_id = '%s'`, db, req.RunId))
	if got != "4 4" {
		t.Errorf("episodes, successes = %s, want 4 4", got)
	}
	last := queryOne(t, conn, fmt.Sprintf(`SELECT any(observation) FROM %s.steps FINAL WHERE run_id = '%s' AND tool = 'submit'`, db, req.RunId))
	if !strings.Contains(last, `"pass":true`) || !strings.Contains(last, `"rewards":{`) {
		t.Errorf("a submit's observation is no passing verdict: %.300s", last)
	}

	ep := queryOne(t, conn, fmt.Sprintf(`SELECT any(episode_id) FROM %s.episodes FINAL WHERE run_id = '%s'`, db, req.RunId))
	out := filepath.Join(t.TempDir(), "ws")
	var stdout, stderr bytes.Buffer
	args := []string{"episode", "snapshot", ep, "--step", "1", "--out", out, "--clickhouse", ch.Addr(), "--database", db,
		"--sandbox.runtime", runtimes.Process, "--sandbox.state-dir", sc.StateDir + "-cli", "--sandbox.hosts", sc.Hosts.String(), "--tasks.datasets", "gauntlet=" + dataset}
	if err := runMain(context.Background(), args, &stdout, &stderr); err != nil {
		t.Fatalf("%v: %v\n%s%s", args, err, stdout.String(), stderr.String())
	}
	if !strings.Contains(stdout.String(), "every observation identical") {
		t.Errorf("snapshot --step 1: replay not exact:\n%s", stdout.String())
	}
	// The workspace after the oracle's solution: /app's files, and no tests/ (the
	// verifier's copy lives in its fork only).
	if _, err := os.Stat(filepath.Join(out, "app")); err != nil {
		t.Errorf("snapshot holds no app/: %v", err)
	}
	if ents, _ := os.ReadDir(filepath.Join(out, "tests")); len(ents) != 0 {
		t.Errorf("the agent's workspace holds tests/: %v", ents)
	}

	// Under faults on the workspace tools (latency on every call, a 503 on some) and at
	// the sandbox's boundaries (a throttled CPU, slow files under /app), a recorded
	// episode whose tool call failed replays to its end: the same steps, the same faults
	// (the failed call's observation says so) and the same verdict.
	path := filepath.Join(t.TempDir(), "flaky-tools.yaml")
	profile := "name: flaky-tools\nfaults:\n" +
		"  - {id: slow, kind: latency, match: {services: [sandbox]}, params: {mean_ms: 40, jitter_ms: 10}}\n" +
		"  - {id: down, kind: http_error, probability: 0.5, match: {services: [sandbox]}, params: {status: 503, retry_after_ms: 100}}\n" +
		"  - {id: cpu, kind: cpu_throttle, params: {cpu_fraction: 0.5}}\n" +
		"  - {id: slow-disk, kind: io_latency, probability: 0.3, match: {paths: [\"/app/*\"]}, params: {mean_ms: 5, jitter_ms: 0}}\n"
	if err := os.WriteFile(path, []byte(profile), 0o644); err != nil {
		t.Fatal(err)
	}
	o = runOpts{env: "tasks", params: string(params), policies: "oracle=1", profiles: "flaky-tools=1", profileFiles: path,
		episodes: 6, seed: 12, maxInFlight: 4, label: t.Name() + "-faults"}
	if req, err = o.request(); err != nil {
		t.Fatal(err)
	}
	final = runToEnd(t, s.app.getBus(), conn, db, req)
	if final.Ended != req.Episodes || final.InfraErrors != 0 {
		t.Fatalf("under faults: ended %d of %d, infra errors %d", final.Ended, req.Episodes, final.InfraErrors)
	}
	row := strings.Fields(queryOne(t, conn, fmt.Sprintf(`SELECT concat(episode_id, ' ', toString(steps), ' ', toString(success))
		FROM %s.episodes FINAL WHERE run_id = '%s' AND episode_id IN
		(SELECT episode_id FROM %s.faults_final WHERE run_id = '%s' AND kind = 'http_error') ORDER BY episode_id LIMIT 1`, db, req.RunId, db, req.RunId)))
	if len(row) != 3 {
		t.Fatalf("no episode met an http_error: %v", row)
	}
	faulty, steps := row[0], row[1]
	if got := queryOne(t, conn, fmt.Sprintf(`SELECT toString(count()) FROM %s.faults_final WHERE episode_id = '%s' AND kind = 'cpu_throttle'`, db, faulty)); got != "1" {
		t.Errorf("episode %s recorded cpu_throttle %s times, want once (its first step)", faulty, got)
	}
	recorded := queryOne(t, conn, fmt.Sprintf(`SELECT any(observation) FROM %s.steps FINAL WHERE episode_id = '%s' AND tool = 'submit'`, db, faulty))
	stdout.Reset()
	stderr.Reset()
	args = []string{"episode", "snapshot", faulty, "--step", steps, "--out", filepath.Join(t.TempDir(), "ws-faults"), "--clickhouse", ch.Addr(), "--database", db,
		"--sandbox.runtime", runtimes.Process, "--sandbox.state-dir", sc.StateDir + "-cli", "--sandbox.hosts", sc.Hosts.String(), "--tasks.datasets", "gauntlet=" + dataset}
	if err := runMain(context.Background(), args, &stdout, &stderr); err != nil {
		t.Fatalf("%v: %v\n%s%s", args, err, stdout.String(), stderr.String())
	}
	if want := "replayed " + steps + " of " + steps + " steps; every observation identical"; !strings.Contains(stdout.String(), want) {
		t.Errorf("replay of %s under faults: want %q:\n%s", faulty, want, stdout.String())
	}
	if !strings.Contains(recorded, `"rewards":{`) || row[2] != "0" {
		t.Errorf("episode %s met a failed call yet its verdict is %s (success %s)", faulty, recorded, row[2])
	}
}

// namedSpec scores a task's verdict step by its verifier's named numbers: one as a
// verifier component, the other through a CEL expression.
const namedSpec = `name: named
version: "1"
components:
  - {name: task, builtin: task, weight: 1}
  - {name: tests, verifier: tests, weight: 0.5}
  - {name: style, expr: "'style' in verifier ? verifier.style * 2.0 - 1.0 : 0.0", weight: 0.5}
`

// TestTaskNamedRewardsEndToEnd plays a task whose test.sh writes reward.json with two
// names through the whole pipeline under a reward spec that reads them: the verdict step's
// row holds both names and values and its score their components, the episode's row the
// names and values too, and the steps before hold none.
func TestTaskNamedRewardsEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("needs ClickHouse and a sandbox runtime; run without -short")
	}
	task := filepath.Join(t.TempDir(), "named", "two-rewards")
	for p, c := range map[string]string{
		"instruction.md":         "Create /app/done.\n",
		"task.toml":              "version = \"1.0\"\n[verifier]\ntimeout_sec = 30.0\n[agent]\ntimeout_sec = 60.0\n",
		"environment/Dockerfile": "FROM debian:bookworm-slim\n",
		"solution/solve.sh":      "#!/bin/bash\ntouch /app/done\n",
		"tests/test.sh": "#!/bin/bash\nt=0\n[ -f /app/done ] && t=1\n" +
			"echo \"{\\\"tests\\\": $t, \\\"style\\\": 0.75}\" > /logs/verifier/reward.json\n",
	} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(task, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(task, p), []byte(c), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	spec := filepath.Join(t.TempDir(), "named.yaml")
	if err := os.WriteFile(spec, []byte(namedSpec), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t)
	ch := chtest.Start(t)
	cfg.ClickHouse = ch.Addr()
	cfg.Sandbox = sandboxConfig(t, runtimes.Process)
	if err := cfg.Tasks.Datasets.Set("named=" + filepath.Dir(task)); err != nil {
		t.Fatal(err)
	}
	s := startStack(t, cfg)
	db := cfg.Database
	conn := connect(t, ch.Addr(), db)
	o := runOpts{env: "tasks", params: `{"dataset":"named"}`, policies: "oracle=1", profiles: "baseline=1", rewardSpec: spec,
		episodes: 2, seed: 3, maxInFlight: 2, label: t.Name()}
	req, err := o.request()
	if err != nil {
		t.Fatal(err)
	}
	if err := putRewardSpec(context.Background(), s.app.getBus(), o.spec); err != nil {
		t.Fatal(err)
	}
	final := runToEnd(t, s.app.getBus(), conn, db, req)
	if final.Ended != req.Episodes || final.InfraErrors != 0 {
		t.Fatalf("ended %d of %d, infra errors %d", final.Ended, req.Episodes, final.InfraErrors)
	}
	run := req.RunId
	for _, c := range []struct{ what, query, want string }{
		{"the verdict steps' names, values and score",
			fmt.Sprintf(`SELECT concat(toString(count()), ' ', toString(any(verifier_names)), ' ', toString(any(verifier_values)), ' ',
				toString(any(reward_values[indexOf(reward_names, 'tests')])), ' ', toString(any(reward_values[indexOf(reward_names, 'style')])))
				FROM %s.steps_final WHERE run_id = '%s' AND tool = 'submit'`, db, run),
			"2 ['style','tests'] [0.75,1] 1 0.5"},
		{"steps before the verdict",
			fmt.Sprintf(`SELECT concat(toString(count()), ' ', toString(countIf(notEmpty(verifier_names) OR notEmpty(verifier_values))), ' ',
				toString(countIf(reward_values[indexOf(reward_names, 'tests')] != 0 OR reward_values[indexOf(reward_names, 'style')] != 0)))
				FROM %s.steps_final WHERE run_id = '%s' AND tool != 'submit'`, db, run),
			"2 0 0"},
		{"the episodes' names and values",
			fmt.Sprintf(`SELECT concat(toString(count()), ' ', toString(any(verifier_names)), ' ', toString(any(verifier_values)))
				FROM %s.episodes_final WHERE run_id = '%s'`, db, run),
			"2 ['style','tests'] [0.75,1]"},
		{"SQL reads one name by ARRAY JOIN",
			fmt.Sprintf(`SELECT toString(sum(value)) FROM %s.steps_final ARRAY JOIN verifier_names AS name, verifier_values AS value
				WHERE run_id = '%s' AND name = 'tests'`, db, run),
			"2"},
	} {
		if got := queryOne(t, conn, c.query); got != c.want {
			t.Errorf("%s: %s, want %s", c.what, got, c.want)
		}
	}
}

// TestTaskSafetyEndToEnd: a task's sandbox attacks reach the safety column through the
// whole pipeline. The oracle of a task whose solution makes a hostile syscall, opens a
// decoy device and connects out (pkg/env/taskenv/testdata/attack) records those safety
// events in ClickHouse, and its solving step's safety component is -1; honest oracles of
// the in-repo dataset record none.
func TestTaskSafetyEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("needs ClickHouse and a sandbox runtime; run without -short")
	}
	dataset, err := filepath.Abs("../../datasets/gauntlet")
	if err != nil {
		t.Fatal(err)
	}
	attack, err := filepath.Abs("../../pkg/env/taskenv/testdata/attack")
	if err != nil {
		t.Fatal(err)
	}
	ch := chtest.Start(t)
	cfg := testConfig(t)
	cfg.ClickHouse = ch.Addr()
	cfg.Worker.Concurrency = 2
	cfg.Sandbox = sandboxConfig(t, runtimes.Process)
	for _, d := range []string{"gauntlet=" + dataset, "attack=" + attack} {
		if err := cfg.Tasks.Datasets.Set(d); err != nil {
			t.Fatal(err)
		}
	}
	s := startStack(t, cfg)
	db := cfg.Database
	conn := connect(t, ch.Addr(), db)
	run := func(dataset string, episodes uint64) string {
		params, _ := json.Marshal(map[string]string{"dataset": dataset})
		o := runOpts{env: "tasks", params: string(params), policies: "oracle=1", profiles: "baseline=1",
			episodes: episodes, seed: 18, maxInFlight: 4, label: t.Name() + "-" + dataset}
		req, err := o.request()
		if err != nil {
			t.Fatal(err)
		}
		final := runToEnd(t, s.app.getBus(), conn, db, req)
		if final.Ended != req.Episodes || final.InfraErrors != 0 {
			t.Fatalf("%s: ended %d of %d, infra errors %d", dataset, final.Ended, req.Episodes, final.InfraErrors)
		}
		assertExact(t, s.app.getBus(), conn, db, req, final)
		return queryOne(t, conn, fmt.Sprintf(`SELECT concat(toString(sum(success)), ' ', toString(countIf(length(safety_events) > 0)), ' ', toString(min(r_safety)),
			' ', toString(countIf(arrayExists(e -> startsWith(e, 'syscall_denied: '), safety_events) AND arrayExists(e -> startsWith(e, 'device_access: '), safety_events)
			AND arrayExists(e -> startsWith(e, 'network_egress: '), safety_events) AND r_safety = -1)))
			FROM %s.steps FINAL WHERE run_id = '%s'`, db, req.RunId))
	}
	// Per run: successes, steps with safety events, the lowest safety value, and steps
	// holding all three attacks with the safety component at -1.
	if got := run("attack", 2); got != "2 2 -1 2" {
		t.Errorf("attacking oracle: %s, want 2 2 -1 2", got)
	}
	if got := run("gauntlet", 3); got != "3 0 0 0" {
		t.Errorf("honest oracles: %s, want 3 0 0 0", got)
	}
}
