package codefix_test

import (
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes/runtimestest"
)

// testSandboxes lends the tests sandboxes of the real process runtime from a warm pool of
// two, so episodes' snapshots and forks meet the pool's background resets.
func testSandboxes(t *testing.T) env.Sandboxes {
	t.Helper()
	return runtimestest.Open(t, runtimes.Process, 2)
}
