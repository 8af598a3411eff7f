package ctrd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/containerd/api/types"
	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/image-spec/identity"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gauntlet-rl/gauntlet/pkg/images"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/ctrd/agent"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/faultfuse"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/safety"
)

// Name is the runtime's registry name.
const Name = "containerd"

// Defaults for Options fields left empty.
const (
	DefaultNamespace   = "gauntlet"
	DefaultSnapshotter = "overlayfs"
	// DefaultCgroupParent is the cgroup (cgroupfs path) sandboxes are created under.
	DefaultCgroupParent = "/gauntlet-containerd"
	// MaxChain caps how many snapshots may sit on top of each other (overlayfs lower
	// directories); Snapshot returns ErrLimit beyond it.
	MaxChain = 64
	// agentReadyTimeout bounds the wait for a new sandbox's agent to answer.
	agentReadyTimeout = 10 * time.Second
	// agentPollMax is the longest pause between two probes of a new sandbox's agent.
	agentPollMax = time.Millisecond
	// DefaultSandboxesPerShim is Options.SandboxesPerShim's default.
	DefaultSandboxesPerShim = 8
	// crunSpecVersion is the OCI spec version given to crun.
	crunSpecVersion = "1.0.2"
)

// Labels the runtime puts on its containers.
const (
	labelState   = "gauntlet.dev/state"
	labelSandbox = "gauntlet.dev/sandbox"
)

// Options configures New.
type Options struct {
	// Address is containerd's socket (ctrdlocal.Server.Address). Required.
	Address string
	// Hosts says where the host process reaches the ports of the hosts sandboxes may be
	// allowed (sandbox.HostMapper); a port not in it is reached at the host's own name.
	Hosts sandbox.HostMap
	// StateDir holds the runtime's files: handles, agent sockets, snapshot metadata.
	// Runtimes over the same StateDir see the same sandboxes. Required.
	StateDir string
	// Namespace is the containerd namespace; empty means DefaultNamespace.
	Namespace string
	// Snapshotter must be an overlay-style snapshotter; empty means overlayfs.
	Snapshotter string
	// CgroupParent is the cgroupfs path sandboxes' cgroups go under; empty means
	// DefaultCgroupParent.
	CgroupParent string
	// AgentBinary is a static gauntlet-agent binary for the base image; empty builds
	// one from source with the Go toolchain (BuildAgent) into StateDir.
	AgentBinary string
	// OCIRuntime is the OCI runtime binary the runc v2 shim drives: "crun", "runc" or
	// an absolute path. Empty means crun when it is installed (a container starts in
	// about half the time: no Go runtime to start twice per container), else runc.
	// Both get the same OCI spec, so isolation is the same.
	OCIRuntime string
	// SandboxesPerShim is how many sandboxes may share one containerd-shim-runc-v2
	// process (the shim's grouping, as CRI groups a pod's containers): a sandbox that
	// joins a running shim skips starting one. 0 means DefaultSandboxesPerShim; 1
	// gives every sandbox its own shim. A shim that dies takes its sandboxes' tasks
	// with it (they fail like a host crash would); it never runs inside a sandbox.
	SandboxesPerShim int
	// Images builds and pulls the images of PrepareImage (task images); nil leaves
	// the runtime with the images containerd already holds.
	Images *images.Store
	// Logger receives warnings; nil discards them.
	Logger *slog.Logger
}

// Runtime is the containerd sandbox runtime. Create it with New.
type Runtime struct {
	opts     Options
	c        *client.Client
	key      string // state key: labels, cgroups and snapshot names
	cgroupV2 bool
	log      *slog.Logger

	mu     sync.Mutex
	boxes  map[string]*box
	closed bool

	ociBinary string // absolute path of the OCI runtime; "" is the shim's default (runc)
	shims     shimGroups
	shimStart string   // the shim start script (shimstart.go); "" names the runc v2 shim
	bpf       bpfCache // precompiled seccomp filters for crun (seccompbpf.go)
	agentDir  string   // the agent's folder, bound at agentMount in other images' sandboxes (links.go)

	// test hooks (export_test.go): the cold-start breakdown benchmark changes the spec
	// and reads the phase timings of each start.
	specHook      func(*oci.Spec)
	phaseHook     func(startPhases)
	noAgent       bool          // ready = task started (for the "without the agent" comparison)
	clientNewTask bool          // create tasks through the client's NewTask (for the comparison)
	noShimStart   bool          // name the runc v2 shim, not the start script (for the comparison)
	noBPFCache    bool          // let crun compile the profile (for the comparison)
	agentPoll     time.Duration // longest pause between agent probes (agentPollMax)
}

// startPhases is how long each step of starting a sandbox took.
type startPhases struct {
	Snapshot, Container, NewTask, Start, Agent time.Duration
	// Cgroup is the commands' cgroup made and the agent's spawner thread moved into it
	// (cmdcgroup.go), after the agent answered.
	Cgroup time.Duration
}

// box is one sandbox this runtime manages.
type box struct {
	// op serialises exec, snapshot, restore and destroy of the sandbox.
	op sync.Mutex

	handle sandbox.Handle
	st     boxState
	task   client.Task
	gone   bool // destroyed
	// pid is the task's host pid (0: no task), whose network namespace is the
	// sandbox's; DialSandbox reads it without op, which a streaming command holds for
	// as long as it runs.
	pid atomic.Int64

	statMu sync.Mutex
	execs  int64
	total  sandbox.Metering

	// fuse is the storage-fault layer commands see as their workspace (nil: none; see
	// storagefaults.go). Guarded by op.
	fuse *faultfuse.Layer
	// quota is the tmpfs that holds the writable layer (quota.go); nil for a sandbox
	// made before the runtime had one. Guarded by op.
	quota *diskQuota
	// user is who the agent and its commands run as: Spec.User resolved against the
	// sandbox's root when its container was made (root without one). Guarded by op.
	user specs.User
	// placed is set once the agent's spawner thread is in the commands' cgroup
	// (cmdcgroup.go) for this task. Guarded by op.
	placed bool
}

// boxState is the runtime's private part of a Handle.
type boxState struct {
	// Parent is the committed snapshot the container's rootfs sits on.
	Parent string `json:"parent"`
	// Chain counts the snapshots between Parent and the image (0 on the image).
	Chain int `json:"chain"`
	// SnapshotKey is the container's active snapshot.
	SnapshotKey string `json:"snapshot_key"`
	// ShimGroup is the shim group the sandbox's task runs in (see shimgroup.go).
	ShimGroup string `json:"shim_group,omitempty"`
	// DiskQuota tells that the writable layer is on a tmpfs of its own (quota.go), which
	// Recover must find again: without it a snapshot would copy the wrong directory.
	DiskQuota bool `json:"disk_quota,omitempty"`
	// CommandCgroup tells that the agent's commands run in a child cgroup carrying the
	// limits, below the sandbox's, which holds the agent with a reserve (cmdcgroup.go).
	CommandCgroup bool `json:"command_cgroup,omitempty"`
}

// snapMeta is what the state directory keeps of a snapshot.
type snapMeta struct {
	Snapshot sandbox.Snapshot `json:"snapshot"`
	// Name is the committed containerd snapshot.
	Name string `json:"name"`
	// Chain is the number of snapshots from the image up to and including this one.
	Chain int `json:"chain"`
	// Spec is the source sandbox's spec, for Fork.
	Spec sandbox.Spec `json:"spec"`
}

var (
	_ sandbox.Runtime        = (*Runtime)(nil)
	_ sandbox.Snapshotter    = (*Runtime)(nil)
	_ sandbox.Forker         = (*Runtime)(nil)
	_ sandbox.UserForker     = (*Runtime)(nil)
	_ sandbox.WorkspaceDirer = (*Runtime)(nil)
	_ sandbox.ImagePreparer  = (*Runtime)(nil)
	_ sandbox.ImageInspector = (*Runtime)(nil)
	_ sandbox.WorkspaceOwner = (*Runtime)(nil)
)

// New connects to containerd, makes sure the base image is there (building the agent
// if needed) and returns the runtime. It fails with ErrUnavailable when containerd
// cannot be reached or the base image cannot be built.
func New(ctx context.Context, opts Options) (*Runtime, error) {
	var errs []error
	if opts.Address == "" {
		errs = append(errs, fmt.Errorf("%w: Options.Address: empty (containerd's socket)", sandbox.ErrInvalid))
	}
	if opts.StateDir == "" {
		errs = append(errs, fmt.Errorf("%w: Options.StateDir: empty", sandbox.ErrInvalid))
	}
	if opts.CgroupParent != "" && !strings.HasPrefix(opts.CgroupParent, "/") {
		errs = append(errs, fmt.Errorf("%w: Options.CgroupParent: %q must be absolute", sandbox.ErrInvalid, opts.CgroupParent))
	}
	if opts.SandboxesPerShim < 0 {
		errs = append(errs, fmt.Errorf("%w: Options.SandboxesPerShim: %d is negative", sandbox.ErrInvalid, opts.SandboxesPerShim))
	}
	ociBinary, err := findOCIRuntime(opts.OCIRuntime)
	if err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("new containerd runtime: %w", err)
	}
	if opts.Namespace == "" {
		opts.Namespace = DefaultNamespace
	}
	if opts.Snapshotter == "" {
		opts.Snapshotter = DefaultSnapshotter
	}
	if opts.CgroupParent == "" {
		opts.CgroupParent = DefaultCgroupParent
	}
	if opts.SandboxesPerShim == 0 {
		opts.SandboxesPerShim = DefaultSandboxesPerShim
	}
	dir, err := filepath.Abs(opts.StateDir)
	if err != nil {
		return nil, fmt.Errorf("new containerd runtime: Options.StateDir: %w", err)
	}
	opts.StateDir = dir
	for _, d := range []string{dir, filepath.Join(dir, "sandboxes"), filepath.Join(dir, "snapshots")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("new containerd runtime: %w", err)
		}
	}
	r := &Runtime{opts: opts, key: stateKey(dir), log: opts.Logger, boxes: map[string]*box{}, ociBinary: ociBinary, agentPoll: agentPollMax}
	r.shims.init(r.key, opts.SandboxesPerShim)
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		r.cgroupV2 = true
	}
	c, err := client.New(opts.Address, client.WithDefaultNamespace(opts.Namespace), client.WithTimeout(5*time.Second))
	if err != nil {
		return nil, fmt.Errorf("new containerd runtime: %w: connect to %s: %v", sandbox.ErrUnavailable, opts.Address, err)
	}
	r.c = c
	ctx = withNamespace(ctx, opts.Namespace)
	v, err := c.Version(ctx)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("new containerd runtime: %w: containerd at %s does not answer: %v", sandbox.ErrUnavailable, opts.Address, err)
	}
	// The start script speaks containerd 1.x's shim start protocol (an address on
	// stdout and in the bundle's "address" file); later daemons get the real shim.
	if strings.HasPrefix(v.Version, "1.") || strings.HasPrefix(v.Version, "v1.") {
		if r.shimStart, err = r.installShimStart(); err != nil {
			c.Close()
			return nil, fmt.Errorf("new containerd runtime: %w", err)
		}
	}
	bin := opts.AgentBinary
	if bin == "" {
		if bin, err = BuildAgent(ctx, dir); err != nil {
			c.Close()
			return nil, fmt.Errorf("new containerd runtime: %w: %v", sandbox.ErrUnavailable, err)
		}
	}
	if err := BuildBaseImage(ctx, c, opts.Snapshotter, bin); err != nil {
		c.Close()
		return nil, fmt.Errorf("new containerd runtime: %w: %v", sandbox.ErrUnavailable, err)
	}
	if r.agentDir, err = installAgent(dir, bin); err != nil {
		c.Close()
		return nil, fmt.Errorf("new containerd runtime: %w", err)
	}
	return r, nil
}

// Name implements sandbox.Runtime.
func (r *Runtime) Name() string { return Name }

// Close implements sandbox.Runtime: it drops the connection and leaves every
// sandbox running for a later Recover.
func (r *Runtime) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil
	}
	r.closed = true
	return r.c.Close()
}

func (r *Runtime) ctx(ctx context.Context) context.Context {
	return withNamespace(ctx, r.opts.Namespace)
}

// get returns the live box with that id.
func (r *Runtime) get(op, id string) (*box, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, fmt.Errorf("%s %s: %w", op, id, sandbox.ErrClosed)
	}
	b, ok := r.boxes[id]
	if !ok || b == nil {
		return nil, fmt.Errorf("%s %s: %w", op, id, sandbox.ErrNotFound)
	}
	return b, nil
}

func (r *Runtime) sandboxDir(id string) string {
	return filepath.Join(r.opts.StateDir, "sandboxes", id)
}
func (r *Runtime) socketPath(id string) string {
	return filepath.Join(r.sandboxDir(id), "sock", agent.SocketName)
}
func (r *Runtime) handlePath(id string) string { return filepath.Join(r.sandboxDir(id), "handle.json") }
func (r *Runtime) snapPath(id string) string {
	return filepath.Join(r.opts.StateDir, "snapshots", id+".json")
}
func (r *Runtime) cgroupPath(id string) string {
	return r.opts.CgroupParent + "/" + r.key + "-" + id
}
func (r *Runtime) snapName(id string) string { return "gauntlet-" + r.key + "-" + id }
func (r *Runtime) leaseID(id string) string  { return "gauntlet-" + r.key + "-" + id }

// Create implements sandbox.Runtime.
func (r *Runtime) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Handle, error) {
	if err := spec.Validate(); err != nil {
		return sandbox.Handle{}, fmt.Errorf("create sandbox: %w", err)
	}
	spec = spec.WithDefaults()
	ctx = r.ctx(ctx)
	parent, chain := "", 0
	if spec.Image == "" {
		spec.Image = BaseImage
	}
	img, err := r.c.GetImage(ctx, spec.Image)
	if err != nil {
		if errdefs.IsNotFound(err) {
			return sandbox.Handle{}, fmt.Errorf("create sandbox: %w: image: %q is not in containerd namespace %s (import it first)", sandbox.ErrInvalid, spec.Image, r.opts.Namespace)
		}
		return sandbox.Handle{}, fmt.Errorf("create sandbox: image %s: %w", spec.Image, err)
	}
	diffIDs, err := img.RootFS(ctx)
	if err != nil {
		return sandbox.Handle{}, fmt.Errorf("create sandbox: image %s: %w", spec.Image, err)
	}
	if spec.Image != BaseImage {
		// The image's ENV (a task's PATH to its tools, say) as docker run applies it:
		// over the runtime's defaults, under the spec's own entries.
		cfg, err := img.Spec(ctx)
		if err != nil {
			return sandbox.Handle{}, fmt.Errorf("create sandbox: image %s: config: %w", spec.Image, err)
		}
		env := make([]string, 0, len(cfg.Config.Env)+len(spec.Env))
		for _, e := range cfg.Config.Env {
			if k, _, ok := strings.Cut(e, "="); ok && k != "" && !strings.ContainsRune(e, 0) {
				env = append(env, e)
			}
		}
		spec.Env = append(env, spec.Env...)
		if spec.User == "" {
			spec.User = cfg.Config.User // docker run's default: the image's USER
		}
	}
	parent = identity.ChainID(diffIDs).String()
	return r.create(ctx, spec, parent, chain)
}

// create makes a sandbox whose rootfs is a new active snapshot on parent.
func (r *Runtime) create(ctx context.Context, spec sandbox.Spec, parent string, chain int) (sandbox.Handle, error) {
	if spec.ID == "" {
		spec.ID = "sb-" + randomID()
	}
	id := spec.ID
	b := &box{}
	b.op.Lock()
	defer b.op.Unlock()
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return sandbox.Handle{}, fmt.Errorf("create sandbox %s: %w", id, sandbox.ErrClosed)
	}
	if _, dup := r.boxes[id]; dup {
		r.mu.Unlock()
		return sandbox.Handle{}, fmt.Errorf("create sandbox %s: %w", id, sandbox.ErrExists)
	}
	r.boxes[id] = nil // reserved while being created
	r.mu.Unlock()
	ok := false
	defer func() {
		if !ok {
			r.mu.Lock()
			delete(r.boxes, id)
			r.mu.Unlock()
		}
	}()
	if _, err := r.c.LoadContainer(ctx, id); err == nil {
		return sandbox.Handle{}, fmt.Errorf("create sandbox %s: %w", id, sandbox.ErrExists)
	}
	if err := os.MkdirAll(filepath.Join(r.sandboxDir(id), "sock"), 0o700); err != nil {
		return sandbox.Handle{}, fmt.Errorf("create sandbox %s: %w", id, err)
	}
	if err := safety.CreateDecoys(r.decoyDir(id)); err != nil {
		_ = os.RemoveAll(r.sandboxDir(id))
		return sandbox.Handle{}, fmt.Errorf("create sandbox %s: %w", id, err)
	}
	b.handle = sandbox.Handle{ID: id, Runtime: Name, Spec: spec}
	b.st = boxState{Parent: parent, Chain: chain}
	if err := r.start(ctx, b); err != nil {
		_ = os.RemoveAll(r.sandboxDir(id))
		return sandbox.Handle{}, fmt.Errorf("create sandbox %s: %w", id, err)
	}
	if chain == 0 {
		// On the image: a fork or restore finds them in its snapshot.
		if err := r.makeLinks(b); err != nil {
			r.teardown(ctx, b)
			_ = os.RemoveAll(r.sandboxDir(id))
			return sandbox.Handle{}, fmt.Errorf("create sandbox %s: %w", id, err)
		}
	}
	if err := r.seed(b, spec.Workspace); err != nil {
		r.teardown(ctx, b)
		_ = os.RemoveAll(r.sandboxDir(id))
		return sandbox.Handle{}, fmt.Errorf("create sandbox %s: %w", id, err)
	}
	b.handle.Created = time.Now().UTC()
	if err := r.saveHandle(b); err != nil {
		r.teardown(ctx, b)
		_ = os.RemoveAll(r.sandboxDir(id))
		return sandbox.Handle{}, fmt.Errorf("create sandbox %s: %w", id, err)
	}
	r.mu.Lock()
	r.boxes[id] = b
	r.mu.Unlock()
	ok = true
	return b.handle, nil
}

// start prepares the rootfs snapshot on b.st.Parent, creates the container and its
// task and waits until the agent answers.
func (r *Runtime) start(ctx context.Context, b *box) error {
	id := b.handle.ID
	t0 := time.Now()
	sn := r.c.SnapshotService(r.opts.Snapshotter)
	lctx, done, err := r.c.WithLease(ctx, leases.WithRandomID(), leases.WithExpiration(10*time.Minute))
	if err != nil {
		return fmt.Errorf("lease: %w", err)
	}
	defer func() { _ = done(context.WithoutCancel(ctx)) }()
	key := id + "-" + randomID()
	mounts, err := sn.Prepare(lctx, key, b.st.Parent, snapshots.WithLabels(map[string]string{labelState: r.key}))
	if err != nil {
		return fmt.Errorf("prepare rootfs on %s: %w", b.st.Parent, err)
	}
	b.st.SnapshotKey = key
	b.st.CommandCgroup = !r.cgroupV2
	b.placed = false
	if err := r.writeHosts(b.handle.Spec); err != nil {
		_ = sn.Remove(ctx, key)
		return err
	}
	upper, err := upperDir(mounts)
	if err != nil {
		_ = sn.Remove(ctx, key)
		return err
	}
	q, ns, err := r.mountQuota(upper, b.handle.Spec.Limits.DiskBytes)
	if err != nil {
		_ = sn.Remove(ctx, key)
		return err
	}
	b.quota, b.st.DiskQuota = q, true
	t1 := time.Now()
	var ctr client.Container
	var task client.Task
	var t2 time.Time
	for attempt := 0; ; attempt++ {
		g := r.shims.join(ns)
		b.st.ShimGroup = g.id
		fast, err := r.armShimStart(id, g)
		if err != nil {
			r.shims.created(g, false)
			r.dropQuota(b)
			_ = sn.Remove(ctx, key)
			return fmt.Errorf("shim start: %w", err)
		}
		ctr, err = r.c.NewContainer(lctx, id,
			client.WithSnapshotter(r.opts.Snapshotter),
			client.WithSnapshot(key),
			client.WithImageName(b.handle.Spec.Image),
			client.WithContainerLabels(map[string]string{labelState: r.key, labelSandbox: id}),
			client.WithRuntime(r.runtimeName(), r.shimOptions()),
			client.WithNewSpec(r.specOpts(b, g.id)...),
		)
		if err != nil {
			r.shims.created(g, false)
			r.dropQuota(b)
			_ = sn.Remove(ctx, key)
			if errdefs.IsAlreadyExists(err) {
				return sandbox.ErrExists
			}
			return fmt.Errorf("new container: %w", err)
		}
		t2 = time.Now()
		if err := r.giveSocketDir(b); err != nil {
			r.shims.created(g, false)
			r.dropQuota(b)
			_ = ctr.Delete(ctx, client.WithSnapshotCleanup)
			return err
		}
		task, err = r.newTask(ctx, ctr, mounts)
		if err == nil {
			r.learnShimAddress(id, g)
		}
		r.shims.created(g, err == nil)
		if err == nil {
			break
		}
		if fast && attempt == 0 {
			// The group's shim is gone (its group is now sealed): once more, in a new
			// group whose shim the real shim binary starts. The snapshot is kept.
			r.log.Warn("joining a running shim failed; starting a new one", "sandbox", id, "group", g.id, "err", err)
			_ = ctr.Delete(ctx)
			continue
		}
		r.dropQuota(b)
		_ = ctr.Delete(ctx, client.WithSnapshotCleanup)
		return fmt.Errorf("new task: %w", err)
	}
	t25 := time.Now()
	var err2 error
	if task != nil {
		err2 = task.Start(ctx)
	} else {
		_, err2 = r.c.TaskService().Start(ctx, &tasks.StartRequest{ContainerID: id})
	}
	if err2 != nil {
		r.shims.leave(b.st.ShimGroup)
		if task == nil {
			task, _ = ctr.Task(ctx, nil)
		}
		if task != nil {
			_, _ = task.Delete(ctx, client.WithProcessKill)
		}
		r.dropQuota(b)
		_ = ctr.Delete(ctx, client.WithSnapshotCleanup)
		return fmt.Errorf("start task: %w", err2)
	}
	t3 := time.Now()
	if task == nil {
		// The task's record, looked up while the agent starts (it is not needed before).
		if task, err = ctr.Task(ctx, nil); err != nil {
			r.teardown(ctx, b)
			return fmt.Errorf("look up the started task: %w", err)
		}
	}
	b.task = task
	b.pid.Store(int64(task.Pid()))
	var cgPhase time.Duration
	if !r.noAgent {
		// The commands' cgroup is made while the agent starts; its spawner thread moves
		// in once it answers (cmdcgroup.go).
		var tasks []*os.File
		if b.st.CommandCgroup {
			t := time.Now()
			if tasks, err = r.makeCommandCgroup(b); err != nil {
				r.teardown(ctx, b)
				return err
			}
			cgPhase = time.Since(t)
		}
		if err := r.waitAgent(ctx, id); err != nil {
			closeAll(tasks)
			r.teardown(ctx, b)
			return err
		}
		if b.st.CommandCgroup {
			t := time.Now()
			if err := r.joinCommandCgroup(ctx, b, tasks); err != nil {
				r.teardown(ctx, b)
				return err
			}
			cgPhase += time.Since(t)
		}
	}
	ph := startPhases{Snapshot: t1.Sub(t0), Container: t2.Sub(t1), NewTask: t25.Sub(t2), Start: t3.Sub(t25), Agent: time.Since(t3) - cgPhase, Cgroup: cgPhase}
	r.log.Debug("sandbox started", "sandbox", id, "snapshot", ph.Snapshot, "container", ph.Container, "new_task", ph.NewTask, "start_task", ph.Start, "agent", ph.Agent, "cgroup", ph.Cgroup)
	if r.phaseHook != nil {
		r.phaseHook(ph)
	}
	return nil
}

// giveSocketDir gives the directory the agent makes its socket in to the sandbox's
// user, when that is not root: the agent runs as the user (Spec.User).
func (r *Runtime) giveSocketDir(b *box) error {
	if b.user.UID == 0 && b.user.GID == 0 {
		return nil
	}
	if err := os.Chown(filepath.Dir(r.socketPath(b.handle.ID)), int(b.user.UID), int(b.user.GID)); err != nil {
		return fmt.Errorf("agent socket directory for user %q: %w", b.handle.Spec.User, err)
	}
	return nil
}

// WorkspaceOwner implements sandbox.WorkspaceOwner: the ids the sandbox's commands run
// as (Spec.User; root without one), which own what host-side tools create.
func (r *Runtime) WorkspaceOwner(ctx context.Context, id string) (uid, gid int, err error) {
	b, err := r.get("workspace owner of", id)
	if err != nil {
		return 0, 0, err
	}
	b.op.Lock()
	defer b.op.Unlock()
	return int(b.user.UID), int(b.user.GID), nil
}

// newTask creates ctr's task on the rootfs mounts Prepare returned, without standard I/O.
// It is what the client's NewTask does for such a task, less its three round trips before
// the create (the container record, with its OCI spec, twice, and the snapshot's mounts,
// all known here). It returns no client.Task: start starts the task by its id and looks
// its record up while the agent starts. With the comparison hook it is the client's
// NewTask, and the task it returns.
func (r *Runtime) newTask(ctx context.Context, ctr client.Container, mounts []mount.Mount) (client.Task, error) {
	if r.clientNewTask {
		return ctr.NewTask(ctx, cio.NullIO)
	}
	req := &tasks.CreateTaskRequest{ContainerID: ctr.ID()}
	for _, m := range mounts {
		req.Rootfs = append(req.Rootfs, &types.Mount{Type: m.Type, Source: m.Source, Target: m.Target, Options: m.Options})
	}
	if _, err := r.c.TaskService().Create(ctx, req); err != nil {
		return nil, err // a gRPC status error: its text is containerd's reason
	}
	return nil, nil
}

// shimOptions are the runc v2 shim's options for the sandbox's task.
func (r *Runtime) shimOptions() any {
	if r.ociBinary == "" {
		return nil
	}
	return &options.Options{BinaryName: r.ociBinary}
}

// usesCrun tells whether the shim drives crun.
func (r *Runtime) usesCrun() bool { return filepath.Base(r.ociBinary) == "crun" }

// OCIRuntime is the OCI runtime binary the sandboxes' shims drive.
func (r *Runtime) OCIRuntime() string {
	if r.ociBinary == "" {
		return "runc"
	}
	return r.ociBinary
}

// findOCIRuntime resolves Options.OCIRuntime to an absolute path.
func findOCIRuntime(name string) (string, error) {
	look := func(n string) string {
		if p, err := exec.LookPath(n); err == nil {
			if abs, err := filepath.Abs(p); err == nil {
				return abs
			}
		}
		for _, d := range []string{"/usr/bin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin"} {
			p := filepath.Join(d, n)
			if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
				return p
			}
		}
		return ""
	}
	switch {
	case name == "":
		if p := look("crun"); p != "" {
			return p, nil
		}
		return "", nil // the shim's default: runc
	case name == "crun" || name == "runc":
		p := look(name)
		if p == "" {
			return "", fmt.Errorf("%w: Options.OCIRuntime: %s is not installed (scripts/deps.sh installs it)", sandbox.ErrUnavailable, name)
		}
		return p, nil
	case filepath.IsAbs(name):
		if st, err := os.Stat(name); err != nil || st.Mode()&0o111 == 0 {
			return "", fmt.Errorf("%w: Options.OCIRuntime: %s is not an executable", sandbox.ErrInvalid, name)
		}
		return name, nil
	default:
		return "", fmt.Errorf("%w: Options.OCIRuntime: %q must be crun, runc or an absolute path", sandbox.ErrInvalid, name)
	}
}

// specOpts is the OCI spec of a sandbox's container (see the package doc).
func (r *Runtime) specOpts(b *box, shimGroup string) []oci.SpecOpts {
	spec := b.handle.Spec
	l := containerLimits(spec.Limits, b.st.CommandCgroup)
	env := append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + sandbox.WorkspacePath, "LANG=C.UTF-8"}, append(sandbox.ServiceEnv(spec.Services), spec.Env...)...)
	period := uint64(100_000)
	quota := l.CPUMillis * int64(period) / 1000
	mem := l.MemoryBytes
	pids := l.Pids
	mounts := append([]specs.Mount{{
		Destination: agent.SocketDir,
		Type:        "bind",
		Source:      filepath.Dir(r.socketPath(b.handle.ID)),
		Options:     []string{"rbind", "rw", "nosuid", "nodev", "noexec"},
	}}, append(r.serviceMounts(spec), r.decoyMounts(b.handle.ID)...)...)
	if spec.Image != BaseImage {
		// Any other image lacks the agent: it is shown where the base image has it.
		mounts = append(mounts, specs.Mount{Destination: agentMount, Type: "bind", Source: r.agentDir, Options: []string{"rbind", "ro", "nosuid", "nodev"}})
	}
	return []oci.SpecOpts{
		oci.WithProcessArgs(AgentPath),
		oci.WithProcessCwd("/"),
		// GOMAXPROCS=1 last: the agent's own setting, read by the Go runtime as it starts
		// (free, where the agent's runtime.GOMAXPROCS(1) would stop the world). Commands
		// get their environment from each request, not from this one.
		oci.WithEnv(append(env, "GOMAXPROCS=1")),
		oci.WithHostname("sandbox"),
		oci.WithCgroup(r.cgroupPath(b.handle.ID)),
		oci.WithMounts(mounts),
		oci.WithNoNewPrivileges,
		func(ctx context.Context, c oci.Client, ctr *containers.Container, s *oci.Spec) error {
			s.Process.User = specs.User{UID: 0, GID: 0}
			s.Process.Capabilities = &specs.LinuxCapabilities{}
			s.Process.Rlimits = []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: uint64(l.OpenFiles), Soft: uint64(l.OpenFiles)}}
			if s.Linux == nil {
				s.Linux = &specs.Linux{}
			}
			s.Linux.Resources = &specs.LinuxResources{
				Devices: s.Linux.Resources.Devices,
				Memory:  &specs.LinuxMemory{Limit: &mem},
				Pids:    &specs.LinuxPids{Limit: &pids},
				CPU:     &specs.LinuxCPU{Quota: &quota, Period: &period},
			}
			s.Linux.Seccomp = seccompProfile(s)
			if s.Annotations == nil {
				s.Annotations = map[string]string{}
			}
			s.Annotations[shimGroupAnnotation] = shimGroup
			if spec.User != "" {
				// The image's USER (or the spec's), resolved as docker run does against
				// the container's root: names from its /etc/passwd and /etc/group.
				if err := oci.WithUser(spec.User)(ctx, c, ctr, s); err != nil {
					return fmt.Errorf("%w: user %q: %v", sandbox.ErrInvalid, spec.User, err)
				}
			}
			b.user = s.Process.User
			if r.specHook != nil {
				r.specHook(s)
			}
			if r.usesCrun() {
				// crun 1.8 (Debian 12) refuses specs whose version is not 1.0.x; the spec
				// uses nothing newer.
				s.Version = crunSpecVersion
				if s.Linux.Seccomp != nil && !r.noBPFCache {
					data, err := r.bpf.get(s.Linux.Seccomp)
					if err != nil {
						return err
					}
					if data != "" {
						s.Annotations[crunSeccompAnnotation] = data
					}
				}
			}
			return nil
		},
	}
}

// waitAgent polls the sandbox's agent until it answers a ping.
func (r *Runtime) waitAgent(ctx context.Context, id string) error {
	deadline := time.Now().Add(agentReadyTimeout)
	sock := r.socketPath(id)
	var last error
	// Poll often: the agent is usually up within a few milliseconds, and a longer step
	// adds its overshoot to every cold start.
	for delay := 200 * time.Microsecond; time.Now().Before(deadline); delay = min(delay*2, r.agentPoll) {
		if _, err := os.Stat(sock); err == nil {
			pctx, cancel := context.WithTimeout(ctx, time.Second)
			var resp agent.Response
			resp, last = agent.Call(pctx, sock, agent.Request{Op: agent.OpPing})
			cancel()
			if last == nil && !resp.Supervised {
				// The container's profile leaves the hostile calls to the agent's filter.
				return fmt.Errorf("%w: the sandbox's agent does not supervise system calls (an old agent in the image?)", sandbox.ErrUnavailable)
			}
			if last == nil {
				return nil
			}
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		time.Sleep(delay)
	}
	return fmt.Errorf("agent did not answer within %v (last error: %v)", agentReadyTimeout, last)
}

// dropQuota unmounts b's disk quota tmpfs, if any, once nothing mounts it any more.
func (r *Runtime) dropQuota(b *box) {
	if b.quota == nil {
		return
	}
	if err := b.quota.unmount(); err != nil {
		r.log.Warn("unmount sandbox disk quota", "sandbox", b.handle.ID, "err", err)
	}
	b.quota = nil
}

// teardown kills the sandbox's task and deletes its container, disk quota and rootfs
// snapshot.
func (r *Runtime) teardown(ctx context.Context, b *box) {
	ctx = context.WithoutCancel(ctx)
	if err := b.detachFuse(); err != nil {
		r.log.Warn("detach storage fault layer", "sandbox", b.handle.ID, "err", err)
	}
	ctr, err := r.c.LoadContainer(ctx, b.handle.ID)
	if err != nil {
		r.dropQuota(b)
		return
	}
	if task, err := ctr.Task(ctx, nil); err == nil {
		r.shims.leave(b.st.ShimGroup)
		_ = task.Kill(ctx, syscall.SIGKILL)
		if _, err := task.Delete(ctx, client.WithProcessKill); err != nil {
			r.log.Warn("delete sandbox task", "sandbox", b.handle.ID, "err", err)
		}
	}
	// The task's rootfs overlay is unmounted with the task; the snapshot's directory
	// must be a plain directory again before the snapshotter removes it.
	r.dropQuota(b)
	if err := ctr.Delete(ctx, client.WithSnapshotCleanup); err != nil {
		r.log.Warn("delete sandbox container", "sandbox", b.handle.ID, "err", err)
	}
	b.task = nil
	b.pid.Store(0)
}

// seed writes the spec's workspace files through the container's root.
func (r *Runtime) seed(b *box, files []sandbox.File) error {
	if len(files) == 0 {
		return nil
	}
	root, err := r.workspaceDir(b)
	if err != nil {
		return err
	}
	for _, f := range files {
		p, err := sandbox.CleanRelPath(f.Path)
		if err != nil {
			return fmt.Errorf("%w: workspace file %q: %v", sandbox.ErrInvalid, f.Path, err)
		}
		full := filepath.Join(root, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			return fmt.Errorf("seed %s: %w", p, err)
		}
		mode := f.Mode
		if mode == 0 {
			mode = 0o644
		}
		if err := os.WriteFile(full, f.Data, mode); err != nil {
			return fmt.Errorf("seed %s: %w", p, err)
		}
		if err := os.Chmod(full, mode); err != nil {
			return fmt.Errorf("seed %s: %w", p, err)
		}
		if b.user.UID != 0 || b.user.GID != 0 {
			// The sandbox's user owns its workspace files, and the folders made for them.
			for q := p; q != "."; q = path.Dir(q) {
				if err := os.Lchown(filepath.Join(root, filepath.FromSlash(q)), int(b.user.UID), int(b.user.GID)); err != nil {
					return fmt.Errorf("seed %s: %w", p, err)
				}
			}
		}
	}
	return nil
}

func (r *Runtime) saveHandle(b *box) error {
	st, err := json.Marshal(b.st)
	if err != nil {
		return err
	}
	b.handle.State = st
	data, err := json.Marshal(b.handle)
	if err != nil {
		return err
	}
	tmp := r.handlePath(b.handle.ID) + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("save handle: %w", err)
	}
	if err := os.Rename(tmp, r.handlePath(b.handle.ID)); err != nil {
		return fmt.Errorf("save handle: %w", err)
	}
	return nil
}

// Destroy implements sandbox.Runtime. A sandbox of this state directory that this
// instance does not manage (left by an earlier process and not recovered: the one List
// returns after a crash) is torn down from what containerd and the state directory
// know of it, so that destroying a listed leftover never leaves it running.
func (r *Runtime) Destroy(ctx context.Context, id string) error {
	b, err := r.get("destroy", id)
	if errors.Is(err, sandbox.ErrNotFound) && sandbox.ValidID(id) {
		return r.destroyLeftover(ctx, id)
	}
	if err != nil {
		return err
	}
	b.op.Lock()
	defer b.op.Unlock()
	if b.gone {
		return fmt.Errorf("destroy %s: %w", id, sandbox.ErrNotFound)
	}
	r.teardown(r.ctx(ctx), b)
	b.gone = true
	r.mu.Lock()
	delete(r.boxes, id)
	r.mu.Unlock()
	if err := os.RemoveAll(r.sandboxDir(id)); err != nil {
		return fmt.Errorf("destroy %s: %w", id, err)
	}
	return nil
}

// destroyLeftover destroys sandbox id, which this instance does not manage, when its
// container carries this runtime's state key: its task (and with it every process of the
// sandbox) is killed and deleted, its container and rootfs snapshot deleted, its cgroups
// and state directory removed. ErrNotFound when no such container exists.
func (r *Runtime) destroyLeftover(ctx context.Context, id string) error {
	if r.isClosed() {
		return fmt.Errorf("destroy %s: %w", id, sandbox.ErrClosed)
	}
	ctx = r.ctx(ctx)
	ctr, err := r.c.LoadContainer(ctx, id)
	if errdefs.IsNotFound(err) {
		return fmt.Errorf("destroy %s: %w", id, sandbox.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("destroy %s: %w", id, err)
	}
	labels, err := ctr.Labels(ctx)
	if err != nil {
		return fmt.Errorf("destroy %s: %w", id, err)
	}
	if labels[labelState] != r.key {
		return fmt.Errorf("destroy %s: %w: the container belongs to another state directory", id, sandbox.ErrNotFound)
	}
	b := &box{handle: sandbox.Handle{ID: id, Runtime: Name}}
	if h, err := r.loadHandle(id); err == nil {
		b.handle = h
		// Best effort: the snapshot key finds the disk quota, and an unknown shim group
		// is ignored.
		_ = json.Unmarshal(h.State, &b.st)
	}
	r.mu.Lock()
	if _, busy := r.boxes[id]; busy {
		// Being created, recovered or destroyed meanwhile by another call.
		r.mu.Unlock()
		return fmt.Errorf("destroy %s: %w: another operation holds it", id, sandbox.ErrNotFound)
	}
	r.boxes[id] = nil // reserved, as create reserves an id: Create keeps off
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		delete(r.boxes, id)
		r.mu.Unlock()
	}()
	pid := 0
	if task, err := ctr.Task(ctx, nil); err == nil {
		pid = int(task.Pid())
	}
	b.quota = r.findQuota(ctx, b.st.SnapshotKey, pid)
	r.teardown(ctx, b)
	if err := r.removeCgroups(id); err != nil {
		r.log.Warn("remove sandbox cgroup", "sandbox", id, "err", err)
	}
	if err := os.RemoveAll(r.sandboxDir(id)); err != nil {
		return fmt.Errorf("destroy %s: %w", id, err)
	}
	return nil
}

// removeCgroups removes sandbox id's cgroup directories, in every hierarchy, when the OCI
// runtime left them (a task that was never deleted through it); a cgroup that still holds
// processes stays and is an error.
func (r *Runtime) removeCgroups(id string) error {
	var dirs []string
	if r.cgroupV2 {
		dirs = []string{filepath.Join("/sys/fs/cgroup", r.cgroupPath(id))}
	} else {
		ents, err := os.ReadDir("/sys/fs/cgroup")
		if err != nil {
			return fmt.Errorf("list cgroup hierarchies: %w", err)
		}
		for _, e := range ents {
			dirs = append(dirs, filepath.Join("/sys/fs/cgroup", e.Name(), r.cgroupPath(id)))
		}
	}
	var errs []error
	for _, d := range dirs {
		// The commands' cgroup (cmdcgroup.go) first: a cgroup with children stays.
		if err := os.Remove(filepath.Join(d, cmdsCgroup)); err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR) {
			errs = append(errs, err)
		}
		if err := os.Remove(d); err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// List implements sandbox.Runtime: the containers labelled with this runtime's
// state key, with the handles saved in the state directory.
func (r *Runtime) List(ctx context.Context) ([]sandbox.Handle, error) {
	if r.isClosed() {
		return nil, fmt.Errorf("list sandboxes: %w", sandbox.ErrClosed)
	}
	ctx = r.ctx(ctx)
	ctrs, err := r.c.Containers(ctx, fmt.Sprintf("labels.%q==%s", labelState, r.key))
	if err != nil {
		return nil, fmt.Errorf("list sandboxes: %w", err)
	}
	var out []sandbox.Handle
	for _, ctr := range ctrs {
		h, err := r.loadHandle(ctr.ID())
		if err != nil {
			// A process that crashed while creating it: listed all the same, so that the
			// caller can Destroy it (Recover answers ErrNotFound).
			r.log.Warn("sandbox container without a readable handle", "sandbox", ctr.ID(), "err", err)
			h = sandbox.Handle{ID: ctr.ID(), Runtime: Name}
		}
		out = append(out, h)
	}
	return out, nil
}

func (r *Runtime) loadHandle(id string) (sandbox.Handle, error) {
	var h sandbox.Handle
	data, err := os.ReadFile(r.handlePath(id))
	if err != nil {
		return h, err
	}
	if err := json.Unmarshal(data, &h); err != nil {
		return h, fmt.Errorf("decode handle of %s: %w", id, err)
	}
	return h, nil
}

// Recover implements sandbox.Runtime.
func (r *Runtime) Recover(ctx context.Context, h sandbox.Handle) error {
	if !sandbox.ValidID(h.ID) {
		return fmt.Errorf("recover: %w: handle id %q", sandbox.ErrInvalid, h.ID)
	}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return fmt.Errorf("recover %s: %w", h.ID, sandbox.ErrClosed)
	}
	if _, ok := r.boxes[h.ID]; ok {
		r.mu.Unlock()
		return nil
	}
	r.mu.Unlock()
	ctx = r.ctx(ctx)
	ctr, err := r.c.LoadContainer(ctx, h.ID)
	if err != nil {
		if errdefs.IsNotFound(err) {
			return fmt.Errorf("recover %s: %w", h.ID, sandbox.ErrNotFound)
		}
		return fmt.Errorf("recover %s: %w", h.ID, err)
	}
	labels, err := ctr.Labels(ctx)
	if err != nil {
		return fmt.Errorf("recover %s: %w", h.ID, err)
	}
	if labels[labelState] != r.key {
		return fmt.Errorf("recover %s: %w: the container belongs to another state directory", h.ID, sandbox.ErrNotFound)
	}
	saved, err := r.loadHandle(h.ID)
	if err != nil {
		return fmt.Errorf("recover %s: %w: %v", h.ID, sandbox.ErrNotFound, err)
	}
	b := &box{handle: saved}
	if err := json.Unmarshal(saved.State, &b.st); err != nil {
		return fmt.Errorf("recover %s: decode state: %w", h.ID, err)
	}
	task, err := ctr.Task(ctx, nil)
	if err != nil {
		return fmt.Errorf("recover %s: %w: no running task: %v", h.ID, sandbox.ErrNotFound, err)
	}
	b.task = task
	b.pid.Store(int64(task.Pid()))
	if saved.Spec.User != "" {
		sp, err := ctr.Spec(ctx)
		if err != nil {
			return fmt.Errorf("recover %s: %w", h.ID, err)
		}
		if sp.Process != nil {
			b.user = sp.Process.User
		}
	}
	b.quota = r.findQuota(ctx, b.st.SnapshotKey, int(task.Pid()))
	if b.quota == nil && b.st.DiskQuota {
		return fmt.Errorf("recover %s: %w: the tmpfs of its writable layer is not mounted any more", h.ID, sandbox.ErrNotFound)
	}
	kept := false
	defer func() {
		if !kept && b.quota != nil {
			b.quota.close() // still mounted: a Destroy finds it again
		}
	}()
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := agent.Call(pctx, r.socketPath(h.ID), agent.Request{Op: agent.OpPing})
	if err != nil {
		return fmt.Errorf("recover %s: %w: agent does not answer: %v", h.ID, sandbox.ErrNotFound, err)
	}
	if !resp.Supervised {
		return fmt.Errorf("recover %s: %w: the sandbox's agent does not supervise system calls", h.ID, sandbox.ErrUnavailable)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.boxes[h.ID]; !ok {
		r.boxes[h.ID] = b
		kept = true
	}
	return nil
}

func (r *Runtime) isClosed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.closed
}

// WorkspaceDir implements sandbox.WorkspaceDirer: the workspace seen through the
// agent's root (/proc/PID/root), valid while the sandbox runs.
func (r *Runtime) WorkspaceDir(ctx context.Context, id string) (string, error) {
	b, err := r.get("workspace dir", id)
	if err != nil {
		return "", err
	}
	b.op.Lock()
	defer b.op.Unlock()
	return r.workspaceDir(b)
}

func (r *Runtime) workspaceDir(b *box) (string, error) {
	if b.task == nil {
		return "", fmt.Errorf("workspace of %s: %w: no running task", b.handle.ID, sandbox.ErrNotFound)
	}
	dir := fmt.Sprintf("/proc/%d/root%s", b.task.Pid(), sandbox.WorkspacePath)
	// The sandbox's root owns /, so a command can replace /workspace with a link; an
	// absolute one, followed here, would lead from the host's root. Callers that open
	// the path open it without following a last link too (package tools), which closes
	// the window between this check and their open.
	if fi, err := os.Lstat(dir); err != nil || !fi.IsDir() {
		return "", fmt.Errorf("workspace of %s: %w: %s is not a folder any more", b.handle.ID, sandbox.ErrWorkspaceReplaced, sandbox.WorkspacePath)
	}
	return dir, nil
}

// UpdateLimits changes the memory, pids and CPU limits of a running sandbox
// through containerd's task update; OpenFiles and DiskBytes cannot change while it
// runs and must be zero or unchanged.
func (r *Runtime) UpdateLimits(ctx context.Context, id string, l sandbox.Limits) error {
	b, err := r.get("update limits", id)
	if err != nil {
		return err
	}
	if err := (sandbox.Spec{Limits: l}).Validate(); err != nil {
		return fmt.Errorf("update limits %s: %w", id, err)
	}
	b.op.Lock()
	defer b.op.Unlock()
	cur := b.handle.Spec.Limits
	if l.OpenFiles != 0 && l.OpenFiles != cur.OpenFiles {
		return fmt.Errorf("update limits %s: %w: limits.open_files cannot change while the sandbox runs", id, sandbox.ErrUnsupported)
	}
	if l.DiskBytes != 0 && l.DiskBytes != cur.DiskBytes {
		return fmt.Errorf("update limits %s: %w: limits.disk_bytes cannot change while the sandbox runs", id, sandbox.ErrUnsupported)
	}
	next := cur
	if l.MemoryBytes != 0 {
		next.MemoryBytes = l.MemoryBytes
	}
	if l.Pids != 0 {
		next.Pids = l.Pids
	}
	if l.CPUMillis != 0 {
		next.CPUMillis = l.CPUMillis
	}
	// With the commands in a cgroup of their own, the limits apply there and the
	// sandbox's cgroup keeps the agent's reserve above them; a lowered limit is written
	// below first and a raised one after (a child's CPU quota may not exceed its parent's).
	down, up := splitLimits(next, cur)
	cmds := b.st.CommandCgroup && b.placed
	if cmds {
		if err := r.writeCommandLimits(id, down); err != nil {
			return fmt.Errorf("update limits %s: %w", id, err)
		}
	}
	want := containerLimits(l, b.st.CommandCgroup)
	res := &specs.LinuxResources{}
	if l.MemoryBytes != 0 {
		m := want.MemoryBytes
		res.Memory = &specs.LinuxMemory{Limit: &m}
	}
	if l.Pids != 0 {
		p := want.Pids
		res.Pids = &specs.LinuxPids{Limit: &p}
	}
	if l.CPUMillis != 0 {
		period := uint64(100_000)
		quota := l.CPUMillis * int64(period) / 1000
		res.CPU = &specs.LinuxCPU{Quota: &quota, Period: &period}
	}
	if err := b.task.Update(r.ctx(ctx), client.WithResources(res)); err != nil {
		return fmt.Errorf("update limits %s: %w", id, err)
	}
	if cmds {
		if err := r.writeCommandLimits(id, up); err != nil {
			return fmt.Errorf("update limits %s: %w", id, err)
		}
	}
	cur = next
	b.handle.Spec.Limits = cur
	return r.saveHandle(b)
}

func randomID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// decoyDir holds the sandbox's decoy devices (package safety), outside the directory
// bound into the sandbox.
func (r *Runtime) decoyDir(id string) string { return filepath.Join(r.sandboxDir(id), "decoy") }

// decoyMounts shows the decoys read-only at /dev/mem, /dev/kmem and /dev/port.
func (r *Runtime) decoyMounts(id string) []specs.Mount {
	var m []specs.Mount
	for _, d := range safety.DecoyDevices {
		m = append(m, specs.Mount{Destination: "/dev/" + d, Type: "bind", Source: filepath.Join(r.decoyDir(id), d),
			Options: []string{"bind", "ro", "nosuid", "nodev", "noexec"}})
	}
	return m
}

// seccompProfile is containerd's default profile with the hostile calls of package safety
// allowed at this level, so that they reach the agent's notification filter, which
// refuses them with EPERM and records them. Precedence decides: an ERRNO here would win
// over the agent's USER_NOTIF and hide the attempt. The agent refuses to serve without its
// filter (and the runtime refuses such an agent), and the sandbox holds no capability, so
// allowing them here opens nothing.
func seccompProfile(s *oci.Spec) *specs.LinuxSeccomp {
	p := defaultSeccomp(s)
	p.Syscalls = append(p.Syscalls, specs.LinuxSyscall{Names: safety.HostileNames(), Action: specs.ActAllow})
	return p
}
