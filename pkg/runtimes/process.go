package runtimes

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/gauntlet-rl/gauntlet/pkg/images"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/process"
)

// Process names the runtime of package process: sandboxes are processes of the host,
// confined by namespaces and cgroups, on the host's root filesystem.
const Process = "process"

func init() {
	Register(Registration{
		Name: Process,
		Open: func(_ context.Context, c Config, stateDir string, log *slog.Logger) (Opened, error) {
			pc := process.Config{StateDir: stateDir, Hosts: sandbox.HostMap(c.Hosts), Logger: log}
			if c.Images.Registry != "" || c.Images.DockerHubMirror != "" {
				// Tasks run on their images unpacked; without a registry, on the host's root.
				store, err := images.New(images.Options{Registry: c.Images.Registry, DockerHubMirror: c.Images.DockerHubMirror, CacheDir: c.Images.CacheDir, Logger: log})
				if err != nil {
					return Opened{}, err
				}
				pc.Images = store
			}
			rt, err := process.New(pc)
			return Opened{Runtime: rt}, err
		},
		Validate: func(c Config) []error {
			// The process runtime has no images: every sandbox sees the host's root.
			if c.Image != "" && c.Image != "host" {
				return []error{fmt.Errorf("sandbox.image: %q: the process runtime runs on the host's root filesystem (empty or \"host\")", c.Image)}
			}
			return nil
		},
	})
}
