package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/chlocal/chtest"
	"github.com/gauntlet-rl/gauntlet/pkg/env/codefix"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes/runtimestest"
	"github.com/gauntlet-rl/gauntlet/pkg/trajectory"
)

// TestCodefixEndToEnd runs codefix episodes through the whole pipeline (embedded NATS,
// scheduler, faults, reward, a worker whose sandboxes come from a real runtime, the store)
// into a real ClickHouse, once per runtime; then rebuilds recorded episodes with
// `gauntlet episode snapshot` and `gauntlet episode fork`.
func TestCodefixEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("needs ClickHouse and a sandbox runtime; run without -short")
	}
	for _, rt := range []string{runtimes.Process, runtimes.Containerd} {
		t.Run(rt, func(t *testing.T) {
			sc := sandboxConfig(t, rt)
			ch := chtest.Start(t)
			cfg := testConfig(t)
			cfg.ClickHouse = ch.Addr()
			cfg.Worker.Concurrency = 4
			cfg.Sandbox = sc
			// Warm pools and concurrent episodes on both runtimes: snapshots, forks and
			// the pool's resets run side by side (under -race in CI).
			cfg.Sandbox.PoolSize = 2
			s := startStack(t, cfg)
			db := cfg.Database
			conn := connect(t, ch.Addr(), db)

			o := runOpts{env: "codefix", params: "{}", policies: "oracle=1,random=1", profiles: "baseline=1",
				episodes: 12, seed: 5, maxInFlight: 8, label: t.Name()}
			req, err := o.request()
			if err != nil {
				t.Fatal(err)
			}
			final := runToEnd(t, s.app.getBus(), conn, db, req)
			if final.Ended != req.Episodes || final.InfraErrors != 0 {
				t.Fatalf("ended %d of %d, infra errors %d", final.Ended, req.Episodes, final.InfraErrors)
			}
			assertExact(t, s.app.getBus(), conn, db, req, final)

			_, rows, err := trajectory.Query(context.Background(), conn, fmt.Sprintf(
				`SELECT policy, count(), sum(success), groupArray(error) FROM %s.episodes FINAL WHERE run_id = '%s' GROUP BY policy ORDER BY policy`, db, req.RunId))
			if err != nil {
				t.Fatal(err)
			}
			got := map[string][]string{}
			for _, r := range rows {
				got[r[0]] = r[1:]
			}
			if o := got["oracle"]; len(o) == 0 || o[0] != o[1] {
				t.Errorf("oracle episodes (count, successes, errors) = %v: every one must succeed", o)
			}
			if r := got["random"]; len(r) == 0 || r[1] != "0" {
				t.Errorf("random episodes (count, successes, errors) = %v: none may succeed", r)
			}

			// The sandbox's metering reached ClickHouse, per step: every command that ran to
			// its end (not aborted by an injected fault, not killed at its timeout) was
			// measured.
			m := strings.Fields(queryOne(t, conn, fmt.Sprintf(`SELECT concat(toString(countIf(runtime != '%s')), ' ',
				toString(countIf(ran AND cpu_ns > 0 AND processes > 0 AND peak_memory_bytes > 0)), ' ',
				toString(countIf(ran)), ' ', toString(sum(written_bytes) > 0))
				FROM (SELECT *, tool = 'shell.exec' AND position(observation, '"exit_code"') > 0 AND position(observation, '"timed_out"') = 0 AS ran
				      FROM %s.steps FINAL WHERE run_id = '%s')`, rt, db, req.RunId)))
			if m[0] != "0" || m[1] != m[2] || m[2] == "0" || m[3] != "1" {
				t.Errorf("metering: %s steps of another runtime, %s of %s shell commands fully metered, bytes written > 0: %s", m[0], m[1], m[2], m[3])
				_, rows, _ := trajectory.Query(context.Background(), conn, fmt.Sprintf(`SELECT tool, cpu_ns, processes, peak_memory_bytes, read_bytes, written_bytes, substring(observation, 1, 120) FROM %s.steps FINAL WHERE run_id = '%s' AND tool = 'shell.exec'`, db, req.RunId))
				for _, r := range rows {
					t.Log(r)
				}
			}

			// Rebuild an oracle episode: after 2 steps (read, patch) its library is fixed,
			// after 1 it is not.
			oracleEp := queryOne(t, conn, fmt.Sprintf(`SELECT any(episode_id) FROM %s.episodes FINAL WHERE run_id = '%s' AND policy = 'oracle'`, db, req.RunId))
			cli := []string{"--clickhouse", ch.Addr(), "--database", db, "--sandbox.runtime", rt,
				"--sandbox.state-dir", sc.StateDir + "-cli", "--sandbox.image", sc.Image,
				"--sandbox.containerd", sc.Containerd, "--sandbox.agent", sc.AgentBinary}
			for _, n := range []int{1, 2} {
				out := filepath.Join(t.TempDir(), "ws")
				var stdout, stderr bytes.Buffer
				args := append([]string{"episode", "snapshot", oracleEp, "--step", strconv.Itoa(n), "--out", out}, cli...)
				if err := runMain(context.Background(), args, &stdout, &stderr); err != nil {
					t.Fatalf("%v: %v\n%s%s", args, err, stdout.String(), stderr.String())
				}
				if !strings.Contains(stdout.String(), "every observation identical") {
					t.Errorf("snapshot --step %d: replay not exact:\n%s", n, stdout.String())
				}
				lib, err := os.ReadFile(filepath.Join(out, "src", "lib.sh"))
				if err != nil {
					t.Fatal(err)
				}
				test, err := os.ReadFile(filepath.Join(out, "tests", "test_lib.sh"))
				if err != nil || len(test) == 0 {
					t.Fatalf("snapshot has no test file: %v", err)
				}
				if fixed := snapshotFixed(t, lib); fixed != (n == 2) {
					t.Errorf("snapshot --step %d: library fixed = %v\n%s", n, fixed, lib)
				}
			}

			// Fork a random episode at its start and let the oracle go on, in two branches.
			randomEp := queryOne(t, conn, fmt.Sprintf(`SELECT any(episode_id) FROM %s.episodes FINAL WHERE run_id = '%s' AND policy = 'random'`, db, req.RunId))
			var stdout, stderr bytes.Buffer
			args := append([]string{"episode", "fork", randomEp, "--step", "1", "--policy", "oracle", "--branches", "2"}, cli...)
			if err := runMain(context.Background(), args, &stdout, &stderr); err != nil {
				t.Fatalf("%v: %v\n%s%s", args, err, stdout.String(), stderr.String())
			}
			if n := strings.Count(stdout.String(), "success=true"); n != 2 {
				t.Errorf("fork: %d of 2 branches succeeded:\n%s", n, stdout.String())
			}
		})
	}
}

// snapshotFixed reports whether a library exported by a snapshot is fixed: no known bug
// is left in it.
func snapshotFixed(t *testing.T, lib []byte) bool {
	t.Helper()
	for _, c := range codefix.CandidateFixes() {
		if bytes.Contains(lib, []byte(c.Edits[0].Old)) {
			return false
		}
	}
	return true
}

func sandboxConfig(t *testing.T, name string) runtimes.Config {
	t.Helper()
	return runtimestest.Config(t, name)
}
