package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/env/mcpenv"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/inject"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes/runtimestest"
	"github.com/gauntlet-rl/gauntlet/pkg/trajectory"
)

// notesEnvDir builds examples/mcp-notes-server into a folder beside a copy of its
// declaration (examples/mcp-notes-server/notes.yaml), as docs/mcp.md tells a user to, and
// returns it with the path of a copy of the example's fault profile (kept out of the
// folder: --env.mcp reads every YAML file there as a declaration). It is made once per
// test binary and shared: the env is registered once per process, from the first folder
// it is given, so every test that plays it must give the same one. TestMain removes it.
func notesEnvDir(t *testing.T) (string, string) {
	t.Helper()
	notesOnce.Do(func() {
		root, err := os.MkdirTemp("", "gauntlet-notes-")
		if err != nil {
			notesErr = err
			return
		}
		notesRoot = root
		dir := filepath.Join(root, "env")
		cmd := exec.Command("go", "build", "-o", filepath.Join(dir, "bin", "mcp-notes-server"), "./examples/mcp-notes-server")
		cmd.Dir = "../.."
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0") // static, for containerd's root too
		if out, err := cmd.CombinedOutput(); err != nil {
			notesErr = fmt.Errorf("build the notes server: %v: %s", err, out)
			return
		}
		for _, c := range []struct{ from, to string }{
			{"../../examples/mcp-notes-server/profiles/flaky-notes.yaml", filepath.Join(root, "flaky-notes.yaml")},
			{"../../examples/mcp-notes-server/notes.yaml", filepath.Join(dir, "notes.yaml")},
		} {
			b, err := os.ReadFile(c.from)
			if err == nil {
				err = os.WriteFile(c.to, b, 0o644)
			}
			if err != nil {
				notesErr = err
				return
			}
		}
		notesDir, notesProfile = dir, filepath.Join(root, "flaky-notes.yaml")
	})
	if notesErr != nil {
		t.Fatal(notesErr)
	}
	return notesDir, notesProfile
}

var (
	notesOnce                         sync.Once
	notesRoot, notesDir, notesProfile string
	notesErr                          error
)

// TestMCPHarnessRun: a user's MCP server, declared as `env: mcp` in --env.mcp, runs
// through the whole pipeline in sandboxes of each runtime (`process`, `containerd`): the
// scheduler accepts it, workers start the server in each episode's sandbox and play the
// declaration's oracle with the stress profile's faults firing on its calls, the reward
// service scores the CEL verifier's verdicts, and ClickHouse holds every step exactly
// once, with the server's answers in the state diffs. One recorded episode then replays
// from ClickHouse alone, without the server or a sandbox, to the same observations; and
// (process) `episode fork` replays its calls into a fresh server and goes on from there.
func TestMCPHarnessRun(t *testing.T) {
	if testing.Short() {
		t.Skip("needs ClickHouse and a sandbox runtime; run without -short")
	}
	for _, rt := range []string{runtimes.Process, runtimes.Containerd} {
		t.Run(rt, func(t *testing.T) { testMCPHarnessRun(t, rt) })
	}
}

func testMCPHarnessRun(t *testing.T, rt string) {
	dir, profile := notesEnvDir(t)
	cfg := testConfig(t)
	cfg.Sandbox = sandboxConfig(t, rt)
	cfg.MCP = mcpenv.Config{Dir: dir}
	s := startStack(t, cfg)
	o := runOpts{env: "notes", params: "{}", policies: "oracle=1", profiles: "stress=1,flaky-notes=3", profileFiles: profile,
		episodes: 16, seed: 3, maxInFlight: 4, label: t.Name(), mcp: mcpenv.Config{Dir: dir}}
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
	var won, faulted, aborted int
	fmt.Sscan(q(`SELECT count() FROM %s.episodes FINAL WHERE run_id = '%s' AND env = 'notes' AND success = 1`), &won)
	fmt.Sscan(q(`SELECT count() FROM %s.steps FINAL WHERE run_id = '%s' AND length(fault_ids) > 0`), &faulted)
	fmt.Sscan(q(`SELECT count() FROM %s.steps FINAL WHERE run_id = '%s' AND has(fault_kinds, 'http_error') AND position(observation, 'injected status') > 0`), &aborted)
	if won < 12 || faulted == 0 || aborted == 0 {
		_, rows, _ := trajectory.Query(context.Background(), conn, fmt.Sprintf(`SELECT step, tool, args, substring(observation, 1, 300), fault_kinds FROM %s.steps FINAL WHERE run_id = '%s' ORDER BY episode_id, step LIMIT 25`, cfg.Database, req.RunId))
		for _, r := range rows {
			t.Log(r)
		}
		t.Fatalf("the oracle won %d of 16 episodes (want at least 12), %d steps met faults and %d were aborted (want some)", won, faulted, aborted)
	}
	if got := q(`SELECT count() FROM %s.steps FINAL WHERE run_id = '%s' AND runtime = '` + rt + `' AND tool_calls = 1 AND position(state_diff, '"answer":{"result":') > 0`); got == "0" {
		t.Fatalf("no step recorded a server's answer from a %s sandbox", rt)
	}
	if got := q(`SELECT count() FROM %s.steps FINAL WHERE run_id = '%s' AND success = 1 AND r_task > 0`); got == "0" {
		t.Fatal("no successful step was rewarded")
	}

	// The episode with the most aborted calls replays from its recording alone.
	id := q(`SELECT episode_id FROM %s.steps FINAL WHERE run_id = '%s' GROUP BY episode_id ORDER BY sum(has(fault_kinds, 'http_error')) DESC, sum(length(fault_ids)) DESC, episode_id LIMIT 1`)
	ctx := context.Background()
	steps, err := trajectory.EpisodeSteps(ctx, conn, cfg.Database, id)
	if err != nil {
		t.Fatal(err)
	}
	eps, err := trajectory.RunEpisodes(ctx, conn, cfg.Database, req.RunId)
	if err != nil {
		t.Fatal(err)
	}
	var row trajectory.EpisodeRow
	for _, e := range eps {
		if e.EpisodeID == id {
			row = e
		}
	}
	e, err := env.Lookup("notes")
	if err != nil {
		t.Fatal(err)
	}
	plan, err := trajectory.EpisodePlan(ctx, conn, cfg.Database, row, e.Spec().Services)
	if err != nil {
		t.Fatal(err)
	}
	in, err := inject.NewInjector(plan)
	if err != nil {
		t.Fatal(err)
	}
	diffs := make([][]byte, len(steps))
	for i, st := range steps {
		diffs[i] = []byte(st.StateDiff)
	}
	cas, err := mcpenv.CassetteFrom(diffs)
	if err != nil {
		t.Fatal(err)
	}
	params, err := json.Marshal(map[string]any{"cassette": cas})
	if err != nil {
		t.Fatal(err)
	}
	ep, err := e.NewEpisode(env.Config{Seed: row.Seed, Params: params, Faults: in}) // no sandboxes: no server
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close(ep)
	if _, err := ep.Reset(); err != nil {
		t.Fatal(err)
	}
	for i, st := range steps {
		r, err := ep.Step(env.Action{Tool: st.Tool, Args: json.RawMessage(st.Args)})
		if err != nil {
			t.Fatalf("replay step %d: %v", i, err)
		}
		if !bytes.Equal(r.Observation, []byte(st.Observation)) || len(r.Faults) != len(st.FaultIDs) {
			t.Fatalf("replay step %d: %s (%d faults), recorded %s (%d)", i, r.Observation, len(r.Faults), st.Observation, len(st.FaultIDs))
		}
	}
	t.Logf("episode %s: %d steps, replayed from ClickHouse without the server; the run: %d of 16 won, %d steps met faults, %d calls aborted", id, len(steps), won, faulted, aborted)

	if rt == runtimes.Process {
		// `episode fork` goes on from before the episode's last step: the recorded calls
		// are replayed into a fresh server (checked against the recorded answers), and the
		// oracle finishes the task on it.
		state := runtimestest.Config(t, runtimes.Process).StateDir
		fork := []string{"episode", "fork", "--clickhouse", s.app.clickHouseAddr(), "--database", cfg.Database, "--data-dir", t.TempDir(),
			"--env.mcp", dir, "--sandbox.runtime", runtimes.Process, "--sandbox.state-dir", state, id, "--step", strconv.Itoa(len(steps) - 1), "--policy", "oracle"}
		var out, errOut strings.Builder
		if err := runMain(ctx, fork, &out, &errOut); err != nil {
			t.Fatalf("episode fork: %v\n%s%s", err, out.String(), errOut.String())
		}
		if !strings.Contains(out.String(), "every observation identical to the recording") || !strings.Contains(out.String(), "success=true") {
			t.Fatalf("episode fork of %s at step %d:\n%s", id, len(steps)-1, out.String())
		}
	}

	// `reward explain` replays it the same way: with the server's binary gone, every
	// reward is re-derived bit for bit.
	bin := filepath.Join(dir, "bin", "mcp-notes-server")
	if err := os.Rename(bin, bin+".away"); err != nil {
		t.Fatal(err)
	}
	defer func() { // other tests of this binary play the notes env after this one
		if err := os.Rename(bin+".away", bin); err != nil {
			t.Error(err)
		}
	}()
	cli := []string{"--clickhouse", s.app.clickHouseAddr(), "--database", cfg.Database, "--data-dir", t.TempDir(), "--env.mcp", dir}
	var out, errOut strings.Builder
	if err := runMain(ctx, append([]string{"reward", "explain"}, append(cli, id)...), &out, &errOut); err != nil {
		t.Fatalf("reward explain: %v\n%s%s", err, out.String(), errOut.String())
	}
	if want := fmt.Sprintf("re-derived rewards: %d of %d steps equal to the recorded ones, bit for bit", len(steps), len(steps)); !strings.Contains(out.String(), want) ||
		strings.Contains(out.String(), "WARNING") {
		t.Fatalf("reward explain does not say %q:\n%s", want, out.String())
	}
}
