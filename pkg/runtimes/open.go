package runtimes

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
)

// openRuntime builds the runtime c names over stateDir, adding to s.closers what it
// started besides the runtime.
func (s *Sandboxes) openRuntime(_ context.Context, c Config, _ string, _ *slog.Logger) (sandbox.Runtime, error) {
	switch c.Runtime {
	}
	return nil, fmt.Errorf("%w: runtime %q is not built into this binary yet", sandbox.ErrUnsupported, c.Runtime)
}
