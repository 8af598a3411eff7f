package sandbox

import "errors"

// Sentinel errors. Runtimes wrap them with the operation and the sandbox id
// (fmt.Errorf("exec %s: %w", id, ErrNotFound)); callers test with errors.Is.
var (
	// ErrNotFound: no sandbox or snapshot with that id (never created, or destroyed).
	ErrNotFound = errors.New("sandbox: not found")
	// ErrExists: a sandbox with the requested id already exists.
	ErrExists = errors.New("sandbox: already exists")
	// ErrInvalid: the request is malformed (bad spec field, empty argv, bad path); the
	// wrapping error names the field and the reason.
	ErrInvalid = errors.New("sandbox: invalid request")
	// ErrUnsupported: the runtime cannot do what was asked on this host or at all (a
	// network mode it does not implement, a missing kernel feature).
	ErrUnsupported = errors.New("sandbox: unsupported")
	// ErrUnavailable: an isolation feature the runtime needs is missing on this host
	// (no bwrap, no cgroup controller, not root, containerd not reachable). Runtimes
	// return it from their constructor or first use, never silently degrading isolation.
	ErrUnavailable = errors.New("sandbox: isolation unavailable")
	// ErrClosed: the runtime was closed.
	ErrClosed = errors.New("sandbox: runtime closed")
	// ErrWorkspaceReplaced: the sandbox's own commands replaced its workspace folder
	// (with a link, say), which the host will not follow: the sandbox's doing, not a
	// failure of the runtime.
	ErrWorkspaceReplaced = errors.New("sandbox: the workspace folder was replaced")
	// ErrLimit: a runtime-wide cap was reached (too many sandboxes, snapshot chain too
	// long for the backend); retry later or free resources.
	ErrLimit = errors.New("sandbox: limit reached")
)
