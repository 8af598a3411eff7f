package runtimes

import (
	"context"
	"fmt"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
)

// openRuntime builds the named runtime over stateDir.
func openRuntime(_ context.Context, name, stateDir string) (sandbox.Runtime, error) {
	return nil, fmt.Errorf("runtime %s (state %s): %w", name, stateDir, sandbox.ErrUnavailable)
}
