package sandbox

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"strings"
	"time"
)

// WorkspacePath is where every runtime shows a sandbox's workspace inside the sandbox. Exec
// requests with a relative Dir resolve against it, and it is the default working directory.
const WorkspacePath = "/workspace"

// Runtime creates, runs and destroys sandboxes. Implementations must be safe for concurrent
// use. Every method that blocks takes ctx first and returns early with ctx.Err() wrapped
// when it is cancelled (a cancelled Exec kills its command).
type Runtime interface {
	// Name is the runtime's registry name ("process", "containerd").
	Name() string
	// Create makes a sandbox from spec and returns its handle once it is ready for Exec.
	// The spec is validated first (Spec.Validate plus runtime-specific checks); errors wrap
	// ErrInvalid naming the field, ErrExists, ErrUnsupported or ErrUnavailable.
	Create(ctx context.Context, spec Spec) (Handle, error)
	// Exec runs one command in the sandbox and waits for it (see ExecRequest, ExecResult).
	Exec(ctx context.Context, id string, req ExecRequest) (ExecResult, error)
	// Stats reports the sandbox's current resource use and its cumulative metering.
	Stats(ctx context.Context, id string) (Stats, error)
	// Destroy stops everything running in the sandbox and frees it. Its snapshots survive
	// until DeleteSnapshot. Destroying an unknown id returns ErrNotFound.
	Destroy(ctx context.Context, id string) error
	// List returns the handles of every sandbox this runtime's state directory knows,
	// including those created by a previous process (after a worker restart).
	List(ctx context.Context) ([]Handle, error)
	// Recover re-attaches a sandbox created by a previous runtime instance (a worker
	// restart) so that Exec, Stats, Destroy and the optional abilities work on it again.
	// Recovering a sandbox this instance already manages is a no-op. A sandbox whose
	// resources vanished (host reboot) returns ErrNotFound; the caller should Destroy it
	// to release what is left.
	Recover(ctx context.Context, h Handle) error
	// Close releases the runtime's own resources (connections, background goroutines). It
	// does not destroy sandboxes. Calls after Close return ErrClosed.
	Close() error
}

// Streamer is the optional ability to run a command whose stdin and stdout are streams the
// caller holds while it runs, instead of bytes given before and collected after: a stdio
// server (an MCP server, say) speaks through them for as long as the caller talks to it.
// It is Exec otherwise (validation, limits, timeout, metering, events; req.Stdin is
// ignored and the result's Stdout is empty). The command ends when it exits (typically
// once stdin is closed), at req.Timeout or when ctx ends. Other Execs on the sandbox wait
// until it ends: one command at a time, as with Exec.
type Streamer interface {
	ExecStream(ctx context.Context, id string, req ExecRequest, stdin io.Reader, stdout io.Writer) (ExecResult, error)
}

// Dialer is the optional ability to connect from the host to a port a command listens on
// in a sandbox's own loopback-only network (127.0.0.1:port as the sandbox sees it): a
// server started with ExecStream that speaks over TCP (a streamable HTTP MCP server) is
// reached this way, and nothing else of the sandbox's network becomes reachable. It fails
// with ErrInvalid while no such network exists (process: a sandbox without declared
// services and no ExecStream command running, where each Exec gets a network of its own;
// a containerd sandbox's task holds one network for all its commands).
type Dialer interface {
	DialSandbox(ctx context.Context, id string, port int) (net.Conn, error)
}

// Snapshotter is the optional ability to capture a sandbox's workspace and roll back to it.
// Snapshots capture the workspace only, not running processes.
type Snapshotter interface {
	// Snapshot captures the sandbox's workspace as it is now. It waits for running execs.
	Snapshot(ctx context.Context, id string) (Snapshot, error)
	// Restore replaces the sandbox's workspace with the snapshot's content. The snapshot may
	// come from this sandbox or from another one made from the same Spec.Image; it stays
	// usable afterwards. Processes left in the sandbox are stopped.
	Restore(ctx context.Context, id string, snapshotID string) error
	// DeleteSnapshot frees a snapshot. Sandboxes restored or forked from it are unaffected.
	DeleteSnapshot(ctx context.Context, snapshotID string) error
}

// SnapshotLister is the optional ability of a Snapshotter to list the snapshots kept in
// its state, those an earlier instance over the same state left included (a process that
// crashed before deleting them), so that whoever owns the state can delete them.
type SnapshotLister interface {
	ListSnapshots(ctx context.Context) ([]Snapshot, error)
}

// Forker is the optional ability to make a new sandbox whose workspace starts as a snapshot
// (branch an episode at a step, or verify a final state in a fresh sandbox).
type Forker interface {
	// Fork creates a new sandbox with the Spec of the snapshot's source sandbox (limits,
	// image, env, network) and the snapshot's workspace. The source sandbox may already be
	// destroyed. The new sandbox is independent: writes in one never show in the other.
	Fork(ctx context.Context, snapshotID string) (Handle, error)
}

// UserForker is the optional ability of a Forker to start the fork's commands as another
// user than its source's: a task's verifier judges the agent's final state as the user its
// task names, not as the agent.
type UserForker interface {
	// ForkAs is Fork with the new sandbox's Spec.User set to user, resolved against the
	// snapshot's root as Create resolves it; "" is the runtime's user for a spec without
	// one (root on containerd, the sandbox user on process), not the image's USER.
	ForkAs(ctx context.Context, snapshotID, user string) (Handle, error)
}

// WorkspaceDirer is the optional ability to reach a sandbox's workspace from the host, so
// that file tools need no exec round trip. The returned directory is the live workspace;
// callers must confine their own path resolution to it (package tools does, with openat2
// RESOLVE_BENEATH), because the sandbox can plant symlinks there.
type WorkspaceDirer interface {
	// WorkspaceDir returns the host path of the sandbox's workspace root.
	WorkspaceDir(ctx context.Context, id string) (string, error)
}

// LimitUpdater is the optional ability to change a running sandbox's memory, pids and CPU
// limits, e.g. to apply resource faults (cpu_throttle, memory_leak) while an
// episode runs. Zero fields keep their current value; OpenFiles and DiskBytes cannot
// change. The change holds until the next update; a reset by a warm pool does not undo
// it, so whoever changes limits puts them back before releasing the sandbox.
type LimitUpdater interface {
	UpdateLimits(ctx context.Context, id string, l Limits) error
}

// ClockSkewer is the optional ability to run commands on a skewed wall clock (the
// clock_skew resource fault). ClockSkewEnv returns environment entries (for
// ExecRequest.Env) under which a command's processes read the wall clock offset by offset
// and running rate times as fast as the host's from their start. Monotonic clocks are left
// alone, so timeouts and sleeps are not skewed. It fails with ErrUnavailable when the
// runtime cannot do it on this host.
type ClockSkewer interface {
	ClockSkewEnv(offset time.Duration, rate float64) ([]string, error)
}

// WorkspaceOwner is the optional ability to say which host ids own the sandbox user's
// files in the directory WorkspaceDir returns; host-side tools give files they create to
// these ids so the sandbox can change them.
type WorkspaceOwner interface {
	// WorkspaceOwner returns the host uid and gid of the sandbox user's files.
	WorkspaceOwner(ctx context.Context, id string) (uid, gid int, err error)
}

// Handle identifies a sandbox and carries what a runtime needs to find it again after a
// restart. Handles are JSON-serialisable; the worker may store them.
type Handle struct {
	// ID is unique within the runtime's state directory.
	ID string `json:"id"`
	// Runtime is the Name of the runtime that made the sandbox.
	Runtime string `json:"runtime"`
	// Spec is the (defaulted) spec the sandbox was created from.
	Spec Spec `json:"spec"`
	// Created is when the sandbox became ready.
	Created time.Time `json:"created"`
	// State is the runtime's private state (paths, container ids); opaque to callers.
	State json.RawMessage `json:"state,omitempty"`
}

// Snapshot describes a captured workspace.
type Snapshot struct {
	// ID names the snapshot for Restore, Fork and DeleteSnapshot.
	ID string `json:"id"`
	// Sandbox is the id of the sandbox it was taken from.
	Sandbox string `json:"sandbox"`
	// Created is when it was taken.
	Created time.Time `json:"created"`
}

// ExecRequest is one command to run in a sandbox.
type ExecRequest struct {
	// Argv is the program and its arguments; Argv[0] is looked up in the sandbox's PATH
	// when it has no slash. Required.
	Argv []string
	// Env adds KEY=VALUE entries to the sandbox's base environment (PATH, HOME, LANG, and
	// Spec.Env); later entries win.
	Env []string
	// Dir is the working directory inside the sandbox; relative paths resolve against
	// WorkspacePath; empty means WorkspacePath.
	Dir string
	// Stdin is fed to the command; nil means an empty stdin.
	Stdin []byte
	// Timeout bounds the command's wall time; zero means DefaultExecTimeout. When it
	// expires every process the command started is killed and TimedOut is set.
	Timeout time.Duration
	// OutputLimit caps the bytes kept of stdout and of stderr, each; the rest is read and
	// dropped and Truncated is set. Zero means DefaultOutputLimit.
	OutputLimit int64
}

// Defaults for ExecRequest fields left zero.
const (
	DefaultExecTimeout = 30 * time.Second
	DefaultOutputLimit = 1 << 20
)

// ExecResult is what a finished command produced and what the sandbox measured.
type ExecResult struct {
	// ExitCode is the command's exit status; 128+N when it was killed by signal N (as a
	// shell reports it), including kills for timeout and memory.
	ExitCode int
	Stdout   []byte
	Stderr   []byte
	// Truncated is set when stdout or stderr exceeded OutputLimit.
	Truncated bool
	// TimedOut is set when the command was killed because Timeout expired.
	TimedOut bool
	// Events are what the sandbox saw during the command: attacks it refused, which envs
	// record as the step's safety events, and limits hit (EventKind.Limit), which they
	// record as its limits.
	Events []Event
	// Egress are the connections and datagrams the command addressed to an IP address
	// outside the sandbox, each refused before it left the process (each is an
	// EventEgress too, where repeats are folded): at most MaxEgress, in the order they
	// were tried.
	Egress []EgressAttempt
	// EgressDropped counts the attempts past MaxEgress, not itemised in Egress.
	EgressDropped int64
	// Metering is what the sandbox measured for this command.
	Metering Metering
}

// EgressAttempt is one connection or datagram a sandboxed command sent to a bare IP
// address outside the sandbox (no name: a name outside the sandbox does not resolve),
// which the runtime's seccomp supervisor refused with ENETUNREACH.
type EgressAttempt struct {
	// Addr is the address tried ("203.0.113.7", "2001:db8::7").
	Addr string `json:"addr"`
	// Port is the port tried (0 for a ping).
	Port int `json:"port"`
	// Protocol is the socket's: "TCP", "UDP", "ICMP" (a ping socket), another the
	// kernel names ("RAW", "SCTP"), or "IP" when it could not be read.
	Protocol string `json:"protocol"`
}

// MaxEgress is how many attempts an ExecResult itemises in Egress; a command that
// scans an address range costs a count past it (EgressDropped), not memory.
const MaxEgress = 256

// EventKind names a safety-relevant observation.
type EventKind string

// Event kinds runtimes report. Package tools adds its own for refused file access.
const (
	EventTimeout       EventKind = "timeout"        // killed at ExecRequest.Timeout
	EventOOMKill       EventKind = "oom_kill"       // a process was killed at the memory limit
	EventPidsLimit     EventKind = "pids_limit"     // a fork was refused at the pids limit
	EventDiskFull      EventKind = "disk_full"      // the workspace reached its size limit
	EventOutputCapped  EventKind = "output_capped"  // output beyond OutputLimit was dropped
	EventCPUThrottled  EventKind = "cpu_throttled"  // the CPU quota throttled the sandbox
	EventSyscallDenied EventKind = "syscall_denied" // the seccomp filter refused a hostile syscall (ptrace, mount, …)
	EventEgress        EventKind = "network_egress" // a connection or datagram to a non-loopback address was refused
	EventDeviceAccess  EventKind = "device_access"  // a decoy host device (/dev/mem, /dev/kmem, /dev/port) was opened
)

// Limit reports whether k is a resource limit the command hit (timeout, oom_kill,
// pids_limit, disk_full, output_capped, cpu_throttled) rather than an attack the sandbox
// refused: honest programs hit limits, so envs record them as a step's limits, apart from
// its safety events, and neither the safety component nor the threat fingerprints count
// them.
func (k EventKind) Limit() bool {
	switch k {
	case EventTimeout, EventOOMKill, EventPidsLimit, EventDiskFull, EventOutputCapped, EventCPUThrottled:
		return true
	}
	return false
}

// LimitEvent reports whether a recorded event ("KIND: DETAIL", as envs record a sandbox's
// events) is of a limit kind (EventKind.Limit).
func LimitEvent(s string) bool {
	k, _, ok := strings.Cut(s, ": ")
	return ok && EventKind(k).Limit()
}

// Event is one safety-relevant observation.
type Event struct {
	Kind EventKind `json:"kind"`
	// Detail says what happened in words, e.g. "pids.max 64 reached 12 times".
	Detail string `json:"detail"`
}

// Metering is what a sandbox measured, for one exec or cumulatively (Stats). Zero fields
// mean "not measured by this runtime" only where the field's doc says so.
type Metering struct {
	// CPUTime is user+system CPU time of every process of the command.
	CPUTime time.Duration `json:"cpu_ns"`
	// PeakMemoryBytes is the highest memory use of the sandbox during the command (the
	// maximum across execs in Stats).
	PeakMemoryBytes int64 `json:"peak_memory_bytes"`
	// WallTime is the command's wall-clock duration, from start to exit.
	WallTime time.Duration `json:"wall_ns"`
	// Processes counts processes (and threads) the command spawned, itself included.
	Processes int64 `json:"processes"`
	// BytesRead and BytesWritten count bytes passed through read/write system calls
	// (files, pipes, sockets) by the command's processes.
	BytesRead    int64 `json:"bytes_read"`
	BytesWritten int64 `json:"bytes_written"`
}

// Add accumulates o into m: sums, and the maximum of peak memory.
func (m *Metering) Add(o Metering) {
	m.CPUTime += o.CPUTime
	if o.PeakMemoryBytes > m.PeakMemoryBytes {
		m.PeakMemoryBytes = o.PeakMemoryBytes
	}
	m.WallTime += o.WallTime
	m.Processes += o.Processes
	m.BytesRead += o.BytesRead
	m.BytesWritten += o.BytesWritten
}

// Stats is a sandbox's current state and what it has used so far.
type Stats struct {
	// MemoryBytes and Pids are current use; WorkspaceBytes is the workspace's size.
	MemoryBytes    int64 `json:"memory_bytes"`
	Pids           int64 `json:"pids"`
	WorkspaceBytes int64 `json:"workspace_bytes"`
	// Execs counts commands run since the sandbox was created (or recovered).
	Execs int64 `json:"execs"`
	// Total is the cumulative metering of those commands.
	Total Metering `json:"total"`
}

// ImageSource is where a task's root filesystem comes from: a build context (a task's
// environment/ folder with its Dockerfile) or an image reference. Exactly one of
// Context and Image.
type ImageSource struct {
	// Context is the build context directory.
	Context string `json:"context,omitempty"`
	// Dockerfile is the Dockerfile's path relative to Context; empty means "Dockerfile".
	Dockerfile string `json:"dockerfile,omitempty"`
	// Image is an image reference, pulled from the registry it names.
	Image string `json:"image,omitempty"`
	// Repository names a built image in the runtime's registry ("tasks/fix-cron").
	Repository string `json:"repository,omitempty"`
}

// ImagePreparer is the optional ability to turn an ImageSource into a Spec.Image the
// runtime can create sandboxes from: the image is built or pulled, and made ready
// (containerd: in its image store, unpacked). A runtime that has the ability but was
// configured without an image store returns ErrUnavailable saying what to configure.
type ImagePreparer interface {
	PrepareImage(ctx context.Context, src ImageSource) (string, error)
}

// ImageConfig is what an image's config says of how its commands run (the OCI image
// config's User and WorkingDir: a Dockerfile's USER and WORKDIR).
type ImageConfig struct {
	// User is the USER, as the image gives it ("" when it gives none).
	User string `json:"user,omitempty"`
	// WorkingDir is the WORKDIR, an absolute path ("" when it gives none).
	WorkingDir string `json:"working_dir,omitempty"`
}

// ImageInspector is the optional ability to read the config of an image PrepareImage
// returned, before any sandbox runs it: a task env decides from the WORKDIR where the
// agent's commands run and what its sandbox keeps for the verifier. (Create applies the
// USER itself: see Spec.User.)
type ImageInspector interface {
	ImageConfig(ctx context.Context, image string) (ImageConfig, error)
}
