package taskenv_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/env/taskenv"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes/runtimestest"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
)

// BenchmarkEpisodeStart measures a task episode's start on the process runtime (NewEpisode,
// which reads the task and its digest, and Reset, which takes a sandbox with the task's
// workspace) and its Close: a sandbox made on demand for a task with its own limits, and a
// warm one for a task at Harbor's default resources.
func BenchmarkEpisodeStart(b *testing.B) {
	for _, c := range []struct {
		name string
		pool int
		task func(b *testing.B) (map[string]string, []byte)
	}{
		{"cold/codefix-sum", 0, func(*testing.B) (map[string]string, []byte) { return gauntlet, params("codefix/sum") }},
		{"warm/default-resources", 2, func(b *testing.B) (map[string]string, []byte) {
			return own(writeTask(b, "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n", "10.0"))
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			sb := runtimestest.Open(b, runtimes.Process, c.pool)
			ds, p := c.task(b)
			e := taskenv.New()
			for b.Loop() {
				ep, err := e.NewEpisode(env.Config{Seed: 1, Params: p, Sandboxes: sb, Datasets: ds})
				if err != nil {
					b.Fatal(err)
				}
				if _, err := ep.Reset(); err != nil {
					b.Fatal(err)
				}
				if err := env.Close(ep); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkTaskRuntimes puts the two runtimes side by side on one task, codefix/sum (on
// containerd in its own image, built once before the timings):
//
//   - start: NewEpisode and Reset, a sandbox made on demand, then Close;
//   - verify: the submit step of a fresh episode, which snapshots the sandbox, forks it,
//     clears the verifier's paths, copies tests/ in, runs test.sh and reads the reward;
//   - test.sh: the same test.sh run directly in the agent's sandbox (tests/ copied in
//     beforehand, outside the timing), the baseline of the verifier's overhead.
//
// Run with -benchtime=10x: a containerd verify costs a sandbox start.
func BenchmarkTaskRuntimes(b *testing.B) {
	for _, rt := range []string{runtimes.Process, runtimes.Containerd} {
		b.Run(rt, func(b *testing.B) {
			c := runtimestest.Config(b, rt)
			if rt == runtimes.Containerd {
				c.Images = runtimestest.Images(b)
			}
			sb := runtimestest.OpenConfig(b, c)
			e := taskenv.New()
			start := func(b *testing.B) env.Episode {
				ep, err := e.NewEpisode(env.Config{Seed: 1, Params: params("codefix/sum"), Sandboxes: sb, Datasets: gauntlet})
				if err != nil {
					b.Fatal(err)
				}
				if _, err := ep.Reset(); err != nil {
					b.Fatal(err)
				}
				return ep
			}
			_ = env.Close(start(b)) // the image, built and pulled once
			b.Run("start", func(b *testing.B) {
				for b.Loop() {
					if err := env.Close(start(b)); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run("verify", func(b *testing.B) {
				for b.Loop() {
					b.StopTimer()
					ep := start(b)
					b.StartTimer()
					res, err := ep.Step(env.Action{Tool: taskenv.ToolSubmit})
					if err != nil || !res.Done() {
						b.Fatalf("submit: %v, %s", err, res.Observation)
					}
					b.StopTimer()
					_ = env.Close(ep)
					b.StartTimer()
				}
			})
			b.Run("test.sh", func(b *testing.B) {
				ep := start(b)
				defer env.Close(ep)
				r, id := ep.(env.Workspacer).Sandbox()
				ctx := context.Background()
				dir := filepath.Join(dataset, "codefix/sum/tests")
				ents, err := os.ReadDir(dir)
				if err != nil {
					b.Fatal(err)
				}
				for _, f := range ents {
					data, err := os.ReadFile(filepath.Join(dir, f.Name()))
					if err != nil {
						b.Fatal(err)
					}
					res, err := r.Exec(ctx, id, sandbox.ExecRequest{Argv: []string{"sh", "-c", "mkdir -p /workspace/logs/verifier /workspace/tests && cat > /workspace/tests/" + f.Name()}, Stdin: data})
					if err != nil || res.ExitCode != 0 {
						b.Fatalf("copy tests/%s in: %v, %s", f.Name(), err, res.Stderr)
					}
				}
				for b.Loop() {
					res, err := r.Exec(ctx, id, sandbox.ExecRequest{Argv: []string{"bash", "--noprofile", "--norc", "/tests/test.sh"}, Dir: "app"})
					if err != nil || res.ExitCode != 0 {
						b.Fatalf("test.sh: %v, exit %d: %s%s", err, res.ExitCode, res.Stdout, res.Stderr)
					}
				}
			})
		})
	}
}

// BenchmarkTaskStartFromPool puts a task episode's start (NewEpisode and Reset; Close is
// left out of the timing) from a warm pool beside a cold one, on both runtimes, each
// running codefix/sum in its own image (built once, before the timings): cold makes the
// sandbox on demand (pool size 0); warm takes it from the pool the runtime keeps for
// the task's image (pool size 2), filled before the timings, each Close resetting the
// sandbox for the next start.
func BenchmarkTaskStartFromPool(b *testing.B) {
	images := runtimestest.Images(b)
	for _, rt := range []string{runtimes.Process, runtimes.Containerd} {
		for _, c := range []struct {
			name string
			pool int
		}{{"cold", 0}, {"warm", 2}} {
			b.Run(rt+"/"+c.name, func(b *testing.B) {
				cfg := runtimestest.Config(b, rt)
				cfg.Images, cfg.PoolSize = images, c.pool
				sb := runtimestest.OpenConfig(b, cfg)
				e := taskenv.New()
				start := func() env.Episode {
					ep, err := e.NewEpisode(env.Config{Seed: 1, Params: params("codefix/sum"), Sandboxes: sb, Datasets: gauntlet})
					if err != nil {
						b.Fatal(err)
					}
					if _, err := ep.Reset(); err != nil {
						b.Fatal(err)
					}
					return ep
				}
				_ = env.Close(start()) // the image, built and pulled; the pool's template, made
				if c.pool > 0 {
					waitWarm(b, sb.Runtime(), c.pool)
				}
				for b.Loop() {
					ep := start()
					b.StopTimer()
					if err := env.Close(ep); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
				}
			})
		}
	}
}

// waitWarm waits until the runtime holds n sandboxes of a task image's pool template
// ("task@" and the image).
func waitWarm(b *testing.B, rt sandbox.Runtime, n int) {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		hs, err := rt.List(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		warm := 0
		for _, h := range hs {
			if strings.HasPrefix(h.Spec.Template, taskenv.Template+"@") {
				warm++
			}
		}
		if warm >= n {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d warm task sandboxes after 2 minutes", warm, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
