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
)

// Containerd names the runtime of package ctrd: sandboxes are containerd containers of
// an image (Config.Image), run by the daemon at Config.Containerd or by a private one.
const Containerd = "containerd"

// containerdTmpfsBytes sizes the tmpfs a private containerd keeps its images and
// snapshots on, so what sandboxes write never reaches the host's disk.
const containerdTmpfsBytes = 2 << 30

func init() {
	Register(Registration{Name: Containerd, Open: openContainerd})
}

// openContainerd connects to c.Containerd, or starts a private containerd under stateDir
// when it is empty (stopped by the returned stop).
func openContainerd(ctx context.Context, c Config, stateDir string, log *slog.Logger) (sandbox.Runtime, func() error, error) {
	addr := c.Containerd
	var stop func() error
	if addr == "" {
		srv, err := ctrdlocal.Start(ctx, ctrdlocal.Options{
			Dir: filepath.Join(stateDir, "containerd"), RootTmpfsBytes: containerdTmpfsBytes, Logger: log,
		})
		if err != nil {
			return nil, nil, fmt.Errorf("start a private containerd (or pass --sandbox.containerd): %w", err)
		}
		stop = func() error {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			return srv.Stop(ctx)
		}
		addr = srv.Address()
	}
	rt, err := ctrd.New(ctx, ctrd.Options{Address: addr, StateDir: filepath.Join(stateDir, "ctrd"), AgentBinary: c.AgentBinary, Logger: log})
	if err != nil {
		if stop != nil {
			_ = stop()
		}
		return nil, nil, err
	}
	return rt, stop, nil
}
