//go:build linux

package process_test

import (
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/process"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/sandboxtest"
)

// open returns a process runtime over dir, failing the test (never skipping) with the
// reason when the host lacks an isolation feature.
func open(t testing.TB, dir string) *process.Runtime {
	t.Helper()
	rt, err := process.New(process.Config{StateDir: dir})
	if err != nil {
		t.Fatalf("process runtime unavailable: %v", err)
	}
	return rt
}

func TestConformance(t *testing.T) {
	sandboxtest.Run(t, func(t *testing.T, dir string) sandbox.Runtime { return open(t, dir) })
}
