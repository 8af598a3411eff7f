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
	"log/slog"
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
	// Containerd is the socket of a running containerd (scripts/containerd.sh start
	// prints it); empty starts a private one under StateDir, stopped by Close.
	Containerd string
	// AgentBinary is the static in-sandbox agent for the containerd base image; empty
	// builds it from source with the Go toolchain.
	AgentBinary string
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

// Sandboxes lends sandboxes straight from a runtime (env.Sandboxes): Acquire creates,
// Release destroys. It owns the runtime and whatever the runtime needed started (a
// containerd daemon); Close releases them.
type Sandboxes struct {
	rt      sandbox.Runtime
	image   string
	closers []func() error // in the order to run them
}

var _ env.Sandboxes = (*Sandboxes)(nil)

// Runtime is the runtime the sandboxes come from.
func (s *Sandboxes) Runtime() sandbox.Runtime { return s.rt }

// Acquire creates a sandbox from spec, with Config.Image when spec names none.
func (s *Sandboxes) Acquire(ctx context.Context, spec sandbox.Spec) (sandbox.Handle, error) {
	if spec.Image == "" {
		spec.Image = s.image
	}
	return s.rt.Create(ctx, spec)
}

// Release destroys the sandbox.
func (s *Sandboxes) Release(ctx context.Context, id string) error {
	return s.rt.Destroy(ctx, id)
}

// Close closes the runtime (sandboxes still running stay, for Recover) and stops what Open
// started for it.
func (s *Sandboxes) Close() error {
	errs := []error{s.rt.Close()}
	for _, c := range s.closers {
		errs = append(errs, c())
	}
	return errors.Join(errs...)
}

// Open opens the configured runtime, or returns nil when c names none. The caller
// closes the result.
func Open(ctx context.Context, c Config, log *slog.Logger) (*Sandboxes, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if c.Runtime == None {
		return nil, nil
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Sandboxes{image: c.Image}
	rt, err := s.openRuntime(ctx, c, filepath.Clean(c.StateDir), log)
	if err != nil {
		for _, c := range s.closers {
			_ = c()
		}
		return nil, fmt.Errorf("sandbox.runtime %s: %w", c.Runtime, err)
	}
	s.rt = rt
	return s, nil
}
