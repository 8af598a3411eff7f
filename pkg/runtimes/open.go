package runtimes

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/ctrdlocal"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/ctrd"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/process"
)

// containerdTmpfsBytes sizes the tmpfs a private containerd keeps its images and
// snapshots on, so what sandboxes write never reaches the host's disk.
const containerdTmpfsBytes = 2 << 30

// openRuntime builds the runtime c names over stateDir, adding to s.closers what it
// started besides the runtime.
func (s *Sandboxes) openRuntime(ctx context.Context, c Config, stateDir string, log *slog.Logger) (sandbox.Runtime, error) {
	switch c.Runtime {
	case Process:
		return process.New(process.Config{StateDir: stateDir, Logger: log})
	case Containerd:
		addr := c.Containerd
		if addr == "" {
			srv, err := ctrdlocal.Start(ctx, ctrdlocal.Options{
				Dir: filepath.Join(stateDir, "containerd"), RootTmpfsBytes: containerdTmpfsBytes, Logger: log,
			})
			if err != nil {
				return nil, fmt.Errorf("start a private containerd (or pass --sandbox.containerd): %w", err)
			}
			s.closers = append(s.closers, func() error {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				return srv.Stop(ctx)
			})
			addr = srv.Address()
		}
		return ctrd.New(ctx, ctrd.Options{Address: addr, StateDir: filepath.Join(stateDir, "ctrd"), AgentBinary: c.AgentBinary, Logger: log})
	}
	return nil, fmt.Errorf("%w: runtime %q", sandbox.ErrUnsupported, c.Runtime)
}
