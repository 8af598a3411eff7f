package ctrd_test

import (
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/ctrdlocal/ctrdtest"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/sandboxtest"
)

// TestConformance runs the shared runtime suite against a real containerd started
// by the project's launcher.
func TestConformance(t *testing.T) {
	srv := ctrdtest.Start(t)
	sandboxtest.Run(t, func(t *testing.T, stateDir string) sandbox.Runtime {
		return open(t, srv, stateDir)
	}, sandboxtest.Expect(sandboxtest.Snapshots, sandboxtest.Forks, sandboxtest.WorkspaceDirs, sandboxtest.Streams, sandboxtest.Dials))
}
