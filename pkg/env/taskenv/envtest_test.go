package taskenv_test

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/env/envtest"
	"github.com/gauntlet-rl/gauntlet/pkg/env/taskenv"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes/runtimestest"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/tools"
)

// TestConformance runs the suite every env passes over tasks of the in-repo dataset
// picked by the seed, in sandboxes of the process runtime.
func TestConformance(t *testing.T) {
	sb := runtimestest.Open(t, runtimes.Process, 0)
	envtest.Run(t, envtest.Subject{
		Env: taskenv.New(),
		Config: func(_ testing.TB, seed uint64) env.Config {
			return env.Config{Seed: seed, Sandboxes: sb, Datasets: gauntlet, Params: json.RawMessage(`{"dataset":"gauntlet"}`)}
		},
		Limits: func(maxInvalid int, deadlineMs int64) json.RawMessage {
			return fmt.Appendf(nil, `{"dataset":"gauntlet","max_invalid":%d,"deadline_ms":%d}`, maxInvalid, deadlineMs)
		},
		Idle:        env.Action{Tool: tools.FSList, Args: json.RawMessage(`{"path":"/app"}`)},
		ErrNotReset: taskenv.ErrNotReset,
		// codefix/sum and shell/disk-usage: the dataset's tasks in ID order, by seed.
		Seeds: []uint64{5, 23},
	})
}
