package env

import (
	"context"
	"errors"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
)

// Sandboxes lends real sandboxes (package sandbox) to envs whose episodes run commands and
// edit files, such as codefix. A worker builds one over its configured runtime and passes
// it in Config.Sandboxes; pure envs such as shop ignore it. Implementations are safe for
// concurrent use: every episode of a worker shares one.
type Sandboxes interface {
	// Runtime is the runtime the sandboxes come from: Exec, Stats and the optional
	// abilities (sandbox.Snapshotter, sandbox.Forker, sandbox.WorkspaceDirer) go to it.
	Runtime() sandbox.Runtime
	// Acquire returns a sandbox made from spec, ready for Exec: fresh, or reset from a
	// warm pool. The caller owns it until Release.
	Acquire(ctx context.Context, spec sandbox.Spec) (sandbox.Handle, error)
	// Release gives back a sandbox from Acquire or from a Fork of the runtime; it is
	// destroyed or reset for reuse. Releasing twice is an error, never a panic.
	Release(ctx context.Context, id string) error
}

// ErrNoSandbox is returned by Reset of an episode that needs a real sandbox when
// Config.Sandboxes is nil: the process playing it (worker, env API, curriculum) was
// started without a sandbox runtime.
var ErrNoSandbox = errors.New("env needs a sandbox runtime, and none is configured (start gauntlet with --sandbox.runtime=process or containerd)")

// Closer is implemented by episodes that hold resources beyond memory (a sandbox). Whoever
// made the episode calls Close once when done with it, however it ended; Close after
// Close is a no-op.
type Closer interface {
	Close() error
}

// Close closes ep if it is a Closer; for other episodes it does nothing.
func Close(ep Episode) error {
	if c, ok := ep.(Closer); ok {
		return c.Close()
	}
	return nil
}

// Brancher is implemented by episodes that can split in two: Branch returns a new,
// independent episode in exactly the state of this one (same step, clock and workspace),
// which continues on its own. Tree search over actions branches an episode at a step and
// tries a different action in each branch. The caller closes the branch.
type Brancher interface {
	Branch(ctx context.Context) (Episode, error)
}

// Workspacer is implemented by episodes whose state is a sandbox's workspace. Sandbox
// returns the runtime and the id of the episode's current sandbox ("" before Reset and
// after Close), so tools can inspect or export the workspace (gauntlet episode snapshot).
// The sandbox stays the episode's: callers must not destroy it.
type Workspacer interface {
	Sandbox() (sandbox.Runtime, string)
}

// SandboxTemplater is implemented by envs whose episodes run in sandboxes of a few fixed
// shapes. SandboxTemplates returns them, each named by Spec.Template and with an empty
// workspace, so a worker can keep warm pools of them. An episode that Acquires a spec
// with the same Template, Image, Limits, Network and Env gets a warm sandbox with its own
// workspace files written in.
type SandboxTemplater interface {
	SandboxTemplates() []sandbox.Spec
}
