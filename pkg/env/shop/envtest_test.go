package shop

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/env/envtest"
)

// TestConformance runs the suite every env passes, with the oracle under the stress
// plan's faults.
func TestConformance(t *testing.T) {
	envtest.Run(t, envtest.Subject{
		Env: New(),
		Config: func(t testing.TB, seed uint64) env.Config {
			return env.Config{Seed: seed, Faults: stressPlan(t, seed)}
		},
		Limits: func(maxInvalid int, deadlineMs int64) json.RawMessage {
			return fmt.Appendf(nil, `{"max_invalid":%d,"deadline_ms":%d}`, maxInvalid, deadlineMs)
		},
		Idle:        env.Action{Tool: "wait", Args: json.RawMessage(`{"ms":100}`)},
		ErrNotReset: ErrNotReset,
	})
}
