// Package runtimes opens a sandbox runtime by name (process, containerd) and lends its
// sandboxes to envs as an env.Sandboxes. Workers use it for --sandbox.runtime; the CLI's
// episode snapshot and fork use it to rebuild episodes locally.
//
// The returned Sandboxes is safe for concurrent use; whoever opened it closes its runtime.
package runtimes

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
)

// Runtime names accepted by Config.Runtime.
const (
	None       = ""
	Process    = "process"
	Containerd = "containerd"
)

// Config chooses the sandbox runtime that envs needing real sandboxes (codefix) run in.
// Pure envs (shop) never touch it.
type Config struct {
	// Runtime is "process", "containerd", or empty for none (such envs' episodes then
	// fail with env.ErrNoSandbox).
	Runtime string
	// Image is the root filesystem sandboxes get when an env does not name one: for
	// containerd an image reference, for process "" or "host".
	Image string
	// StateDir is where the runtime keeps its state (sandboxes survive a worker restart
	// there).
	StateDir string
}

// Validate reports every problem at once.
func (c Config) Validate() error {
	var errs []error
	switch c.Runtime {
	case None, Process, Containerd:
	default:
		errs = append(errs, fmt.Errorf("sandbox.runtime: %q is not one of process, containerd (or empty for none)", c.Runtime))
	}
	if c.Runtime != None && c.StateDir == "" {
		errs = append(errs, errors.New("sandbox.state-dir: must be set when sandbox.runtime is"))
	}
	return errors.Join(errs...)
}

// runtimeSandboxes lends sandboxes straight from a runtime: Acquire creates, Release
// destroys.
type runtimeSandboxes struct {
	rt    sandbox.Runtime
	image string
}

var _ env.Sandboxes = (*runtimeSandboxes)(nil)

func (s *runtimeSandboxes) Runtime() sandbox.Runtime { return s.rt }

func (s *runtimeSandboxes) Acquire(ctx context.Context, spec sandbox.Spec) (sandbox.Handle, error) {
	if spec.Image == "" {
		spec.Image = s.image
	}
	return s.rt.Create(ctx, spec)
}

func (s *runtimeSandboxes) Release(ctx context.Context, id string) error {
	return s.rt.Destroy(ctx, id)
}

// Open opens the configured runtime and returns the env.Sandboxes over it, or nil
// when no runtime is configured. The caller closes the runtime (Sandboxes.Runtime().Close)
// when done.
func Open(ctx context.Context, c Config) (env.Sandboxes, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if c.Runtime == None {
		return nil, nil
	}
	rt, err := openRuntime(ctx, c.Runtime, filepath.Clean(c.StateDir))
	if err != nil {
		return nil, fmt.Errorf("sandbox.runtime %s: %w", c.Runtime, err)
	}
	return &runtimeSandboxes{rt: rt, image: c.Image}, nil
}
