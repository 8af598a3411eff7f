package codefix_test

import (
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes/runtimestest"
)

// testSandboxes lends the tests sandboxes of the real process runtime, made on demand.
// (No warm pool: the pool's background DeleteSnapshot races with the episodes' Snapshot
// inside the process runtime, which -race reports; pools are tested in pkg/runtimes.)
func testSandboxes(t *testing.T) env.Sandboxes {
	t.Helper()
	return runtimestest.Open(t, runtimes.Process, 0)
}
