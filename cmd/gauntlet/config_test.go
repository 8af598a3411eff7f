package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A bad component flag is refused together with every other bad flag, before NATS,
// ClickHouse or Temporal start: nothing appears under the data dir.
func TestServeValidatesWholeConfigFirst(t *testing.T) {
	base := []string{"--nats.port", "-1", "--clickhouse.port", "0", "--temporal.port", "0", "--temporal.ui-port", "-1",
		"--http", "", "--envapi.addr", "127.0.0.1:0", "--log.level", "warn"}
	cases := []struct {
		name string
		args []string
		want []string
	}{
		{"up", []string{"up", "--worker.concurrency", "0"}, []string{"worker.concurrency: 0"}},
		{"serve", []string{"serve", "--target", "worker", "--worker.concurrency", "-1"}, []string{"worker.concurrency: -1"}},
		{"every problem at once", []string{"up", "--worker.concurrency", "0", "--store.batch-rows", "0",
			"--scheduler.assign-batch", "0", "--envapi.score-batch", "0", "--sandbox.runtime", "docker", "--policy.http.url", "ftp://x"},
			[]string{"worker.concurrency", "store.batch-rows", "scheduler.assign-batch", "envapi.score-batch", "sandbox.runtime", "policy.http.url"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			args := append(append(tc.args, "--data-dir", dir), base...)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			var out, errOut bytes.Buffer
			err := runMain(ctx, args, &out, &errOut)
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %q", err, w)
				}
			}
			entries, _ := os.ReadDir(dir)
			var started []string
			for _, e := range entries {
				started = append(started, e.Name())
			}
			if len(started) > 0 {
				t.Errorf("refused only after starting things: %v under the data dir", started)
			}
		})
	}
}

// Every client command that finds the stack through stack.json says, when there is none,
// which data dir it looked in and how to point it elsewhere.
func TestNoStackNamesDataDir(t *testing.T) {
	t.Setenv("GAUNTLET_DATA", "")
	dir := t.TempDir() + "/nowhere"
	for _, args := range [][]string{
		{"run", "--data-dir", dir, "--episodes", "1"},
		{"sql", "--data-dir", dir, "SELECT 1"},
		{"episode", "show", "--data-dir", dir, "ep-1"},
		{"episode", "snapshot", "--data-dir", dir, "ep-1", "--step", "1"},
		{"episode", "fork", "--data-dir", dir, "ep-1", "--step", "1"},
		{"curriculum", "status", "--data-dir", dir, "c-1"},
		{"batch", "start", "--data-dir", dir, "--episodes", "1"},
		{"faults", "drift", "--data-dir", dir, "show"},
	} {
		t.Run(strings.Join(args[:2], " "), func(t *testing.T) {
			var out, errOut bytes.Buffer
			err := runMain(context.Background(), args, &out, &errOut)
			if err == nil {
				t.Fatal("accepted without a stack")
			}
			for _, w := range []string{"no running stack found in " + dir, "--data-dir", "GAUNTLET_DATA"} {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

// The YAML file overlays every flag, the components' as the process's, by its name;
// the command line wins, and unknown keys are refused by name.
func TestConfigFileOverlay(t *testing.T) {
	path := t.TempDir() + "/gauntlet.yaml"
	if err := os.WriteFile(path, []byte("worker:\n  concurrency: 7\nstore.batch-rows: 99\npolicy:\n  http:\n    url: http://127.0.0.1:1/v1\nclickhouse:\n  database: other\nlog.level: debug\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var cfg config
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	cfg.register(fs)
	if err := fs.Parse([]string{"--log.level", "warn"}); err != nil {
		t.Fatal(err)
	}
	if err := overlay(fs, path); err != nil {
		t.Fatal(err)
	}
	if cfg.Worker.Concurrency != 7 || cfg.Store.BatchRows != 99 || cfg.PolicyHTTP.URL != "http://127.0.0.1:1/v1" || cfg.Database != "other" || cfg.LogLevel != "warn" {
		t.Errorf("after overlay: concurrency %d, batch rows %d, policy url %q, database %q, log level %q",
			cfg.Worker.Concurrency, cfg.Store.BatchRows, cfg.PolicyHTTP.URL, cfg.Database, cfg.LogLevel)
	}
	if cfg.Scheduler.AssignBatch != 512 || cfg.EnvAPI.Addr != "127.0.0.1:9470" {
		t.Errorf("defaults lost: assign batch %d, envapi addr %q", cfg.Scheduler.AssignBatch, cfg.EnvAPI.Addr)
	}
	if err := cfg.validate(); err != nil {
		t.Fatal(err)
	}
	if cfg.Store.Database != "other" || cfg.Sandbox.StateDir != filepath.Join(cfg.DataDir, "sandbox") {
		t.Errorf("resolved: store database %q, sandbox state dir %q", cfg.Store.Database, cfg.Sandbox.StateDir)
	}
	if err := os.WriteFile(path, []byte("worker:\n  concurency: 7\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := overlay(fs, path); err == nil || !strings.Contains(err.Error(), `unknown key "worker.concurency"`) {
		t.Errorf("overlay with a misspelt key: %v", err)
	}
}

// The serving flags keep their names and defaults wherever they are declared: what a
// user types, or keeps in a --config file, means what it meant.
func TestServingFlagsUnchanged(t *testing.T) {
	t.Setenv(dataDirEnv, "")
	var cfg config
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	cfg.register(fs)
	var got strings.Builder
	fs.VisitAll(func(f *flag.Flag) { fmt.Fprintf(&got, "%s=%s\n", f.Name, f.DefValue) })
	want, err := os.ReadFile("testdata/serving-flags.txt")
	if err != nil {
		t.Fatal(err)
	}
	if got.String() != string(want) {
		t.Errorf("serving flags (name=default) changed:\n%s\nwant (testdata/serving-flags.txt):\n%s", got.String(), want)
	}
}

// The stack flags name parts directly; what they leave out comes from stack.json, which
// is needed only then.
func TestStackFlagsResolve(t *testing.T) {
	parse := func(args ...string) *stackFlags {
		t.Helper()
		var sf stackFlags
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		sf.register(fs, partNATS|partClickHouse|partTemporal)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		return &sf
	}
	none := t.TempDir()
	sf := parse("--data-dir", none, "--nats", "nats://n:1", "--clickhouse", "c:2")
	if url, err := sf.natsURL(); err != nil || url != "nats://n:1" {
		t.Errorf("natsURL = %q, %v", url, err)
	}
	if addr, db := sf.clickHouseIfKnown(); addr != "c:2" || db != "gauntlet" {
		t.Errorf("clickHouseIfKnown = %q, %q", addr, db)
	}
	if _, err := parse("--data-dir", none).natsURL(); err == nil || !strings.Contains(err.Error(), "--data-dir") {
		t.Errorf("natsURL without a stack: %v", err)
	}

	dir := t.TempDir()
	if err := writeStack(dir, stack{NATSURL: "nats://s:1", ClickHouse: "s:2", Database: "db", Temporal: "s:3"}); err != nil {
		t.Fatal(err)
	}
	sf = parse("--data-dir", dir, "--database", "mine")
	url, err := sf.natsURL()
	addr, db := sf.clickHouseIfKnown()
	if err != nil || url != "nats://s:1" || addr != "s:2" || db != "mine" {
		t.Errorf("from stack.json: nats %q (%v), clickhouse %q, database %q", url, err, addr, db)
	}
}

// TestTasksDatasetsValidated: --tasks.datasets is read at start: a malformed entry is
// refused by the flag, an invalid dataset by the configuration's validation, with the
// others' problems, before anything runs.
func TestTasksDatasetsValidated(t *testing.T) {
	var cfg config
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	cfg.register(fs)
	if err := fs.Parse([]string{"--tasks.datasets", "no-dir"}); err == nil || !strings.Contains(err.Error(), "want NAME=DIR") {
		t.Errorf("--tasks.datasets no-dir: %v", err)
	}
	if err := fs.Parse([]string{"--tasks.datasets", "a=x,a=y"}); err == nil || !strings.Contains(err.Error(), "named twice") {
		t.Errorf("a name twice: %v", err)
	}
	broken := t.TempDir()
	if err := os.WriteFile(filepath.Join(broken, "task.toml"), []byte("[agent]\ntimeout_sec = -1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg = config{}
	fs = flag.NewFlagSet("test", flag.ContinueOnError)
	cfg.register(fs)
	if err := fs.Parse([]string{"--tasks.datasets", "good=../../datasets/gauntlet,bad=" + broken, "--log.level", "loud"}); err != nil {
		t.Fatal(err)
	}
	err := cfg.validate()
	for _, want := range []string{"tasks.datasets: bad:", "agent.timeout_sec", "--log.level"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("validate: %v, want it to say %q", err, want)
		}
	}
	if err != nil && strings.Contains(err.Error(), "good:") {
		t.Errorf("the good dataset was refused: %v", err)
	}
}
