package runtimes

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/childproc"
	"github.com/gauntlet-rl/gauntlet/pkg/ctrdlocal"
	"github.com/gauntlet-rl/gauntlet/pkg/images"
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
// when it is empty, with the supervisor that restarts it (whoever holds the Sandboxes
// runs it) and the Stop that stops it.
func openContainerd(ctx context.Context, c Config, stateDir string, log *slog.Logger) (Opened, error) {
	addr := c.Containerd
	var o Opened
	if addr == "" {
		srv, err := ctrdlocal.Start(ctx, ctrdlocal.Options{
			Dir: filepath.Join(stateDir, "containerd"), RootTmpfsBytes: containerdTmpfsBytes, Logger: log,
		})
		if err != nil {
			return Opened{}, fmt.Errorf("start a private containerd (or pass --sandbox.containerd): %w", err)
		}
		o.Supervisor = srv.Supervise(childproc.DefaultBackoff)
		o.Stop = func() error {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			// The daemon is private: whatever it still runs is ours and of no further use
			// (the sandboxes were destroyed by Close), and its shims would outlive it.
			return errors.Join(srv.Purge(ctx), srv.Stop(ctx))
		}
		addr = srv.Address()
	}
	store, err := images.New(images.Options{Registry: c.Images.Registry, DockerHubMirror: c.Images.DockerHubMirror, CacheDir: c.Images.CacheDir, Logger: log})
	if err != nil {
		if o.Stop != nil {
			_ = o.Stop()
		}
		return Opened{}, err
	}
	rt, err := ctrd.New(ctx, ctrd.Options{Address: addr, Hosts: sandbox.HostMap(c.Hosts), StateDir: filepath.Join(stateDir, "ctrd"), AgentBinary: c.AgentBinary, Images: store, Logger: log})
	if err != nil {
		if o.Stop != nil {
			_ = o.Stop()
		}
		return Opened{}, err
	}
	o.Runtime = rt
	return o, nil
}
