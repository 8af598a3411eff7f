package codefix_test

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/env/codefix"
	"github.com/gauntlet-rl/gauntlet/pkg/env/envtest"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/tools"
)

// TestConformance runs the suite every env passes, in sandboxes of the process runtime.
func TestConformance(t *testing.T) {
	sb := testSandboxes(t)
	envtest.Run(t, envtest.Subject{
		Env: codefix.New(),
		Config: func(_ testing.TB, seed uint64) env.Config {
			return env.Config{Seed: seed, Sandboxes: sb}
		},
		Limits: func(maxInvalid int, deadlineMs int64) json.RawMessage {
			return fmt.Appendf(nil, `{"max_invalid":%d,"deadline_ms":%d}`, maxInvalid, deadlineMs)
		},
		Idle:        env.Action{Tool: tools.ShellExec, Args: json.RawMessage(`{"command":"true"}`)},
		ErrNotReset: codefix.ErrNotReset,
		Seeds:       []uint64{99, 3},
	})
}
