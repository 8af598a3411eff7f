package taskenv_test

import (
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/env/taskenv"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes/runtimestest"
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
