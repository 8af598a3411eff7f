// Package tools is the workspace action space of sandboxed envs: shell.exec, fs.read,
// fs.write, fs.list and fs.patch, each confined to one sandbox's workspace.
//
// A Toolbox works against any sandbox.Runtime. shell.exec always goes through
// Runtime.Exec. The fs tools go straight to the workspace from the host when the runtime
// implements sandbox.WorkspaceDirer, resolving every path with openat2 and
// RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|RESOLVE_NO_MAGICLINKS so neither ".." nor a symlink
// planted by the sandbox can reach outside; otherwise they run small shell commands inside
// the sandbox, which the sandbox itself confines, with the same checks done there.
//
// Refusals are agent errors, not infra errors: paths leaving the workspace (ErrOutside),
// paths through symlinks (ErrSymlink) and anything that is not a regular file or a
// directory — devices, FIFOs, sockets — (ErrSpecialFile) are refused with an error saying
// why, and reported through Options.OnEvent as safety events. A Toolbox is safe for
// concurrent use; calls on one sandbox are serialised by the runtime where it must.
package tools

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/faultfs"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
)

// Errors a tool call returns for bad agent input; test with errors.Is.
var (
	// ErrOutside: the path leaves the workspace (absolute elsewhere, or "..").
	ErrOutside = errors.New("path leaves the workspace")
	// ErrSymlink: the path goes through a symbolic link, which the tools never follow.
	ErrSymlink = errors.New("path goes through a symbolic link")
	// ErrSpecialFile: the path names a device, FIFO or socket.
	ErrSpecialFile = errors.New("not a regular file or directory")
	// ErrNotExist: nothing at that path.
	ErrNotExist = errors.New("no such file or directory")
	// ErrIsDir / ErrNotDir: the path is (not) a directory where the tool needs the other.
	ErrIsDir  = errors.New("is a directory")
	ErrNotDir = errors.New("not a directory")
	// ErrTooLarge: the file or content exceeds Options.MaxFileBytes.
	ErrTooLarge = errors.New("file too large")
	// ErrPatch: an edit's search text does not occur exactly once.
	ErrPatch = errors.New("patch does not apply")
	// ErrBadArgs: the call's arguments are malformed.
	ErrBadArgs = errors.New("bad arguments")
)

// Safety event kinds the tools report.
const (
	EventPathTraversal sandbox.EventKind = "path_traversal"
	EventSymlink       sandbox.EventKind = "symlink_escape"
	EventSpecialFile   sandbox.EventKind = "device_file"
)

// Options tune a Toolbox; zero values take the defaults.
type Options struct {
	// OnEvent receives every safety event (refused path). It must not block for long.
	OnEvent func(sandbox.Event)
	// OnEgress receives, after each shell.exec, the command's refused attempts at
	// addresses outside the sandbox one by one and the count past them
	// (sandbox.ExecResult.Egress, EgressDropped), when there are any. It must not block
	// for long.
	OnEgress func(attempts []sandbox.EgressAttempt, dropped int64)
	// MaxFileBytes bounds fs.read results and fs.write content; default 1 MiB.
	MaxFileBytes int64
	// ExecTimeout is shell.exec's default and maximum timeout; default 30 s.
	ExecTimeout time.Duration
	// OutputLimit is shell.exec's per-stream output cap; default 64 KiB.
	OutputLimit int64
	// Storage, when set, applies storage faults to the fs tools' file operations
	// (see storage.go for the events each tool makes); nil injects none.
	Storage *faultfs.Gate
	// ExecEnv, when set, is called at each shell.exec for KEY=VALUE entries added to the
	// command's environment (e.g. sandbox.ClockSkewer's).
	ExecEnv func() []string
}

// Toolbox runs tool calls against one sandbox.
type Toolbox struct {
	rt   sandbox.Runtime
	id   string
	opts Options
	fs   fsBackend
}

// fsBackend is how file tools reach the workspace.
type fsBackend interface {
	read(ctx context.Context, rel string, max int64) ([]byte, error)
	write(ctx context.Context, rel string, data []byte, mode uint32) error
	list(ctx context.Context, rel string) ([]Entry, error)
}

// New returns a Toolbox for sandbox id of rt.
func New(rt sandbox.Runtime, id string, opts Options) *Toolbox {
	if opts.MaxFileBytes == 0 {
		opts.MaxFileBytes = 1 << 20
	}
	if opts.ExecTimeout == 0 {
		opts.ExecTimeout = 30 * time.Second
	}
	if opts.OutputLimit == 0 {
		opts.OutputLimit = 64 << 10
	}
	t := &Toolbox{rt: rt, id: id, opts: opts}
	if wd, ok := rt.(sandbox.WorkspaceDirer); ok {
		t.fs = &hostFS{rt: rt, wd: wd, id: id}
	} else {
		t.fs = &execFS{rt: rt, id: id}
	}
	return t
}

// HostSide reports whether file tools go straight to the workspace from the host.
func (t *Toolbox) HostSide() bool {
	_, ok := t.fs.(*hostFS)
	return ok
}

// ExecArgs are shell.exec's arguments.
type ExecArgs struct {
	// Command is run by sh -c in the workspace.
	Command string `json:"command"`
	// Dir is the working directory, relative to the workspace; default its root.
	Dir string `json:"dir,omitempty"`
	// TimeoutMS bounds the command; 0 or more than the toolbox's maximum means the maximum.
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// Stdin is fed to the command.
	Stdin string `json:"stdin,omitempty"`
}

// ExecResult is shell.exec's result.
type ExecResult struct {
	ExitCode  int              `json:"exit_code"`
	Stdout    string           `json:"stdout"`
	Stderr    string           `json:"stderr"`
	Truncated bool             `json:"truncated,omitempty"`
	TimedOut  bool             `json:"timed_out,omitempty"`
	Metering  sandbox.Metering `json:"metering"`
	Events    []sandbox.Event  `json:"events,omitempty"`
}

// Exec is shell.exec: it runs a shell command in the sandbox. Sandbox events (timeouts,
// limits) are reported through OnEvent as well as returned.
func (t *Toolbox) Exec(ctx context.Context, a ExecArgs) (ExecResult, error) {
	if strings.TrimSpace(a.Command) == "" {
		return ExecResult{}, fmt.Errorf("shell.exec: %w: command: empty", ErrBadArgs)
	}
	dir := "."
	if a.Dir != "" {
		rel, err := t.rel("shell.exec", a.Dir)
		if err != nil {
			return ExecResult{}, err
		}
		dir = rel
	}
	timeout := t.opts.ExecTimeout
	if a.TimeoutMS > 0 && time.Duration(a.TimeoutMS)*time.Millisecond < timeout {
		timeout = time.Duration(a.TimeoutMS) * time.Millisecond
	}
	var env []string
	if t.opts.ExecEnv != nil {
		env = t.opts.ExecEnv()
	}
	res, err := t.rt.Exec(ctx, t.id, sandbox.ExecRequest{
		Argv:        []string{"sh", "-c", a.Command},
		Env:         env,
		Dir:         dir,
		Stdin:       []byte(a.Stdin),
		Timeout:     timeout,
		OutputLimit: t.opts.OutputLimit,
	})
	if err != nil {
		return ExecResult{}, fmt.Errorf("shell.exec: %w", err)
	}
	for _, e := range res.Events {
		t.event(e.Kind, e.Detail)
	}
	if t.opts.OnEgress != nil && (len(res.Egress) > 0 || res.EgressDropped > 0) {
		t.opts.OnEgress(res.Egress, res.EgressDropped)
	}
	return ExecResult{
		ExitCode: res.ExitCode, Stdout: string(res.Stdout), Stderr: string(res.Stderr),
		Truncated: res.Truncated, TimedOut: res.TimedOut, Metering: res.Metering, Events: res.Events,
	}, nil
}

// Read is fs.read: the content of a regular file of at most MaxFileBytes.
func (t *Toolbox) Read(ctx context.Context, p string) ([]byte, error) {
	rel, err := t.rel("fs.read", p)
	if err != nil {
		return nil, err
	}
	if err := t.gateRead(ctx, "fs.read", rel); err != nil {
		return nil, err
	}
	b, err := t.fs.read(ctx, rel, t.opts.MaxFileBytes)
	return b, t.wrap("fs.read", p, err)
}

// Write is fs.write: it creates or replaces a regular file (and missing parent
// directories) with data. mode 0 means 0644.
func (t *Toolbox) Write(ctx context.Context, p string, data []byte, mode uint32) error {
	rel, err := t.rel("fs.write", p)
	if err != nil {
		return err
	}
	if rel == "." {
		return fmt.Errorf("fs.write %s: %w", p, ErrIsDir)
	}
	if int64(len(data)) > t.opts.MaxFileBytes {
		return fmt.Errorf("fs.write %s: %w: %d bytes, the limit is %d", p, ErrTooLarge, len(data), t.opts.MaxFileBytes)
	}
	if mode == 0 {
		mode = 0o644
	}
	if mode&^0o777 != 0 {
		return fmt.Errorf("fs.write %s: %w: mode %o must be permission bits only", p, ErrBadArgs, mode)
	}
	keep, ferr := t.gateWrite(ctx, "fs.write", rel, len(data))
	if keep == 0 && ferr != nil && !errors.Is(ferr, io.ErrShortWrite) {
		return ferr
	}
	if err := t.wrap("fs.write", p, t.fs.write(ctx, rel, data[:keep], mode)); err != nil {
		return err
	}
	return ferr
}

// Entry is one fs.list result.
type Entry struct {
	Name string `json:"name"`
	// Type is "file", "dir", "symlink" or "other".
	Type string `json:"type"`
	Size int64  `json:"size"`
	Mode uint32 `json:"mode"`
}

// List is fs.list: the entries of a directory, sorted by name. Symlinks are listed (not
// followed).
func (t *Toolbox) List(ctx context.Context, p string) ([]Entry, error) {
	rel, err := t.rel("fs.list", p)
	if err != nil {
		return nil, err
	}
	if err := t.gateList(ctx, "fs.list", rel); err != nil {
		return nil, err
	}
	es, err := t.fs.list(ctx, rel)
	return es, t.wrap("fs.list", p, err)
}

// Edit is one search/replace edit of fs.patch.
type Edit struct {
	// Old must occur exactly once in the file (after the previous edits applied).
	Old string `json:"old"`
	// New replaces it.
	New string `json:"new"`
}

// Patch is fs.patch: it applies search/replace edits to a file, in order, atomically (all
// or none). The search/replace form is used rather than unified diffs because agents
// produce it reliably and it cannot apply in the wrong place: each Old must match exactly
// once, or the call fails with ErrPatch saying which edit and why.
func (t *Toolbox) Patch(ctx context.Context, p string, edits []Edit) error {
	if len(edits) == 0 {
		return fmt.Errorf("fs.patch %s: %w: no edits", p, ErrBadArgs)
	}
	b, err := t.Read(ctx, p)
	if err != nil {
		return fmt.Errorf("fs.patch: %w", err)
	}
	s := string(b)
	for i, e := range edits {
		if e.Old == "" {
			return fmt.Errorf("fs.patch %s: %w: edit %d: old text is empty", p, ErrBadArgs, i)
		}
		switch n := strings.Count(s, e.Old); n {
		case 1:
			s = strings.Replace(s, e.Old, e.New, 1)
		case 0:
			return fmt.Errorf("fs.patch %s: %w: edit %d: old text not found", p, ErrPatch, i)
		default:
			return fmt.Errorf("fs.patch %s: %w: edit %d: old text occurs %d times; include more context", p, ErrPatch, i, n)
		}
	}
	rel, _ := t.rel("fs.patch", p)
	mode, err := t.modeOf(ctx, rel)
	if err != nil {
		return fmt.Errorf("fs.patch %s: %w", p, err)
	}
	return t.Write(ctx, p, []byte(s), mode)
}

func (t *Toolbox) modeOf(ctx context.Context, rel string) (uint32, error) {
	dir, base := path.Split(rel)
	if dir == "" {
		dir = "."
	}
	es, err := t.fs.list(ctx, path.Clean(dir))
	if err != nil {
		return 0, err
	}
	for _, e := range es {
		if e.Name == base {
			return e.Mode & 0o777, nil
		}
	}
	return 0o644, nil
}

// rel turns an agent path into a clean workspace-relative one: relative paths and
// absolute paths under sandbox.WorkspacePath are accepted, anything else is refused.
func (t *Toolbox) rel(tool, p string) (string, error) {
	if p == "" {
		return "", fmt.Errorf("%s: %w: path: empty", tool, ErrBadArgs)
	}
	q := p
	if path.IsAbs(q) {
		c := path.Clean(q)
		switch {
		case c == sandbox.WorkspacePath:
			q = "."
		case strings.HasPrefix(c, sandbox.WorkspacePath+"/"):
			q = strings.TrimPrefix(c, sandbox.WorkspacePath+"/")
		default:
			t.event(EventPathTraversal, fmt.Sprintf("%s %q: absolute path outside %s", tool, p, sandbox.WorkspacePath))
			return "", fmt.Errorf("%s %s: %w", tool, p, ErrOutside)
		}
	}
	rel, err := sandbox.CleanRelPath(q)
	if err != nil {
		t.event(EventPathTraversal, fmt.Sprintf("%s %q: %v", tool, p, err))
		return "", fmt.Errorf("%s %s: %w: %v", tool, p, ErrOutside, err)
	}
	return rel, nil
}

// wrap names the tool and path and reports refusals as safety events.
func (t *Toolbox) wrap(tool, p string, err error) error {
	if err == nil {
		return nil
	}
	switch {
	case errors.Is(err, ErrOutside):
		t.event(EventPathTraversal, fmt.Sprintf("%s %q: %v", tool, p, err))
	case errors.Is(err, ErrSymlink):
		t.event(EventSymlink, fmt.Sprintf("%s %q: %v", tool, p, err))
	case errors.Is(err, ErrSpecialFile):
		t.event(EventSpecialFile, fmt.Sprintf("%s %q: %v", tool, p, err))
	}
	return fmt.Errorf("%s %s: %w", tool, p, err)
}

func (t *Toolbox) event(k sandbox.EventKind, detail string) {
	if t.opts.OnEvent != nil {
		t.opts.OnEvent(sandbox.Event{Kind: k, Detail: detail})
	}
}
