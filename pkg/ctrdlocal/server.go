package ctrdlocal

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"

	"github.com/gauntlet-rl/gauntlet/pkg/childproc"
	"github.com/gauntlet-rl/gauntlet/pkg/procfs"
)

// Bounds of the daemon's lifecycle.
const (
	// DefaultStartTimeout bounds how long Start waits for the daemon to answer.
	DefaultStartTimeout = 30 * time.Second
	// stopGrace is how long Stop waits after SIGTERM before it sends SIGKILL.
	stopGrace = 10 * time.Second
	// pollInterval is the pause between readiness probes.
	pollInterval = 10 * time.Millisecond
	// maxSocketPath is the longest unix socket path Linux accepts (sun_path less NUL).
	maxSocketPath = 107
)

// ErrNotInstalled is wrapped by Start's error when containerd or runc is missing.
var ErrNotInstalled = errors.New("containerd or runc not found in PATH, /usr/sbin or /usr/bin: run scripts/deps.sh")

// Options configures Start.
type Options struct {
	// Dir holds everything the daemon writes: config.toml, root/ (content, metadata,
	// snapshots), state/ (runtime state), containerd.sock, containerd.log and the pid
	// file. It is created when missing. Required; the socket path under it must fit
	// in 107 bytes.
	Dir string
	// RootTmpfsBytes, when positive, mounts a tmpfs of that size on Dir/root before
	// the daemon starts (see the package doc). Needs root.
	RootTmpfsBytes int64
	// Binary is the containerd executable; empty finds it in PATH, /usr/sbin and
	// /usr/bin.
	Binary string
	// Logger receives lifecycle messages; nil discards them.
	Logger *slog.Logger
	// StartTimeout bounds the wait for the daemon to answer; 0 means
	// DefaultStartTimeout. The context given to Start can shorten it.
	StartTimeout time.Duration
}

// Server is a containerd daemon owned by this program.
type Server struct {
	dir   string
	bin   string
	tmpfs int64

	d *childproc.Daemon
}

// Start starts containerd with its state under opts.Dir and returns once it answers
// on its socket. A daemon left running on the same Dir by an earlier, crashed
// program is killed first.
func Start(ctx context.Context, opts Options) (*Server, error) {
	if opts.RootTmpfsBytes < 0 {
		return nil, fmt.Errorf("start containerd: Options.RootTmpfsBytes is %d: must not be negative", opts.RootTmpfsBytes)
	}
	dir, err := childproc.StateDir(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("start containerd: %w", err)
	}
	if n := len(filepath.Join(dir, "containerd.sock.ttrpc")); n > maxSocketPath {
		return nil, fmt.Errorf("start containerd: Options.Dir %q is too long: the socket path would be %d bytes, the limit is %d", dir, n, maxSocketPath)
	}
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = DefaultStartTimeout
	}
	bin, err := findBinary(opts.Binary)
	if err != nil {
		return nil, fmt.Errorf("start containerd: %w", err)
	}
	s := &Server{dir: dir, bin: bin, tmpfs: opts.RootTmpfsBytes}
	for _, d := range []string{dir, s.root(), s.state()} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return nil, fmt.Errorf("start containerd: %w", err)
		}
	}
	s.d = childproc.NewDaemon(childproc.Recipe{
		Name:         "containerd",
		Command:      s.command,
		LogPath:      s.logPath(),
		PidFile:      s.pidFile(),
		Owns:         func(pid int) bool { return childproc.CommIs(pid, "containerd") },
		OpenProbe:    s.probe,
		Describe:     func() []any { return []any{"address", s.Address()} },
		PollInterval: pollInterval,
		StartTimeout: opts.StartTimeout,
		StopGrace:    stopGrace,
		// The shims run the containers; a restart of the daemon must not take them along.
		SignalLeaderOnly: true,
	}, opts.Logger)
	if err := s.d.KillLeftover(); err != nil {
		return nil, fmt.Errorf("start containerd: %w", err)
	}
	if err := s.mountRoot(); err != nil {
		return nil, fmt.Errorf("start containerd: %w", err)
	}
	if err := os.WriteFile(s.configPath(), []byte(s.config()), 0o644); err != nil {
		return nil, fmt.Errorf("start containerd: write config: %w", err)
	}
	if err := s.d.Start(ctx); err != nil {
		return nil, fmt.Errorf("start containerd: %w", err)
	}
	return s, nil
}

// Address is the path of the daemon's gRPC socket, for client.New.
func (s *Server) Address() string { return filepath.Join(s.dir, "containerd.sock") }

// Dir is the directory that holds all of the daemon's files.
func (s *Server) Dir() string { return s.dir }

// Pid is the daemon's process id, or 0 when it is not running.
func (s *Server) Pid() int { return s.d.Pid() }

// Client connects a containerd client to the daemon in the given namespace.
func (s *Server) Client(namespace string) (*client.Client, error) {
	c, err := client.New(s.Address(), client.WithDefaultNamespace(namespace), client.WithTimeout(5*time.Second))
	if err != nil {
		return nil, fmt.Errorf("connect to containerd at %s: %w", s.Address(), err)
	}
	return c, nil
}

// Purge kills and deletes every task and container, in every namespace, that the
// daemon knows. Their shims outlive the daemon, so tests call it before Stop.
func (s *Server) Purge(ctx context.Context) error {
	c, err := s.Client("default")
	if err != nil {
		return fmt.Errorf("purge containerd: %w", err)
	}
	defer c.Close()
	nss, err := c.NamespaceService().List(ctx)
	if err != nil {
		return fmt.Errorf("purge containerd: list namespaces: %w", err)
	}
	var errs []error
	for _, ns := range nss {
		nctx := namespaces.WithNamespace(ctx, ns)
		cs, err := c.Containers(nctx)
		if err != nil {
			errs = append(errs, fmt.Errorf("list containers of %s: %w", ns, err))
			continue
		}
		for _, ctr := range cs {
			if task, err := ctr.Task(nctx, nil); err == nil {
				_ = task.Kill(nctx, syscall.SIGKILL)
				if _, err := task.Delete(nctx, client.WithProcessKill); err != nil {
					errs = append(errs, fmt.Errorf("delete task %s/%s: %w", ns, ctr.ID(), err))
				}
			}
			if err := ctr.Delete(nctx, client.WithSnapshotCleanup); err != nil {
				errs = append(errs, fmt.Errorf("delete container %s/%s: %w", ns, ctr.ID(), err))
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("purge containerd: %w", err)
	}
	return nil
}

// Stop sends SIGTERM, waits for the daemon to exit (SIGKILL after a grace period or
// when ctx ends), ends the shims it leaves (see killShims), then unmounts the root tmpfs
// if Start mounted one. Call Purge first: it deletes tasks through the daemon, which
// also removes their cgroups and mounts; Stop's kills are the backstop for what Purge
// could not reach.
func (s *Server) Stop(ctx context.Context) error {
	err := s.d.Stop(ctx)
	if kerr := s.killShims(); kerr != nil {
		err = errors.Join(err, kerr)
	}
	if uerr := s.unmountRoot(); uerr != nil {
		err = errors.Join(err, uerr)
	}
	return err
}

// killShims ends, with SIGKILL, every containerd-shim process started for this daemon
// (its -address argument is the daemon's socket) and first each shim's children: the
// init process of a container the shim still ran, whose death ends every process of the
// container's pid namespace; then it removes the cgroups those inits were in. A shim outlives the daemon by design (a restart keeps the
// containers), so a stopped daemon leaves them running unless they are ended here. It
// waits up to a few seconds for them to go.
func (s *Server) killShims() error {
	shims, err := shimsOf(s.Address())
	if err != nil || len(shims) == 0 {
		return err
	}
	children, err := childrenOf(shims)
	if err != nil {
		return err
	}
	var cgroups []string
	for _, pid := range children {
		cgroups = append(cgroups, cgroupDirs(pid)...)
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	for _, pid := range shims {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	var errs []error
	for _, pid := range append(children, shims...) {
		if err := childproc.WaitGone(pid, 5*time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	// The OCI runtime removes a container's cgroups when its task is deleted, which a
	// killed shim never does.
	for _, d := range cgroups {
		if err := removeCgroup(d, 5*time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("kill the shims of %s: %w", s.Address(), err)
	}
	return nil
}

// shimsOf lists the containerd-shim processes whose -address argument is address.
func shimsOf(address string) ([]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if !strings.HasPrefix(filepath.Base(args[0]), "containerd-shim") {
			continue
		}
		for i := 1; i+1 < len(args); i++ {
			if args[i] == "-address" && args[i+1] == address {
				out = append(out, pid)
				break
			}
		}
	}
	return out, nil
}

// removeCgroup removes the cgroup directory d, its child cgroups first (a sandbox's
// commands run in one of its own, which keeps d busy until removed), waiting up to
// bound while one is busy: a killed process counts as gone once its main thread is a
// zombie, and its other threads may still be leaving the cgroup.
func removeCgroup(d string, bound time.Duration) error {
	ents, _ := os.ReadDir(d)
	for _, e := range ents {
		if e.IsDir() {
			if err := removeCgroup(filepath.Join(d, e.Name()), bound); err != nil {
				return err
			}
		}
	}
	deadline := time.Now().Add(bound)
	for {
		err := os.Remove(d)
		if err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
			return fmt.Errorf("remove cgroup: %w", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// cgroupDirs lists the cgroup directories, in every hierarchy mounted under
// /sys/fs/cgroup, that pid belongs to, leaving out the hierarchies' roots.
func cgroupDirs(pid int) []string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		// "hierarchy-id:controllers:path"; cgroup v2 has empty controllers.
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 || f[2] == "/" || !strings.HasPrefix(f[2], "/") {
			continue
		}
		root := "/sys/fs/cgroup"
		if f[1] != "" {
			root = filepath.Join(root, strings.TrimPrefix(f[1], "name="))
		}
		if st, err := os.Stat(root); err != nil || !st.IsDir() {
			continue
		}
		out = append(out, filepath.Join(root, filepath.Clean(f[2])))
	}
	return out
}

// childrenOf lists the processes whose parent is one of parents.
func childrenOf(parents []int) ([]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// "pid (comm) state ppid ...": comm may hold spaces, so read after the last ')'.
		st := string(b)
		i := strings.LastIndexByte(st, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(st[i+1:])
		if len(f) < 2 {
			continue
		}
		ppid, err := strconv.Atoi(f[1])
		if err == nil && slices.Contains(parents, ppid) {
			out = append(out, pid)
		}
	}
	return out, nil
}

// Supervise returns a supervisor that, while it runs, restarts the daemon whenever it
// exits without Stop (a crash, a kill -9) on the same state, with backoff b, and tells
// meanwhile that it is down. Containers keep running under their shims meanwhile.
func (s *Server) Supervise(b childproc.Backoff) *childproc.Supervisor {
	return childproc.NewSupervisor(s.d, b)
}

// Kill ends the daemon with SIGKILL and waits until it is reaped, keeping every
// file and mount, as a crash would.
func (s *Server) Kill() error { return s.d.Kill() }

// Restart stops the daemon (SIGKILL if it does not stop in time) and starts it again
// on the same state; containers keep running under their shims meanwhile.
func (s *Server) Restart(ctx context.Context) error {
	if err := s.d.Restart(ctx); err != nil {
		return fmt.Errorf("restart containerd: %w", err)
	}
	return nil
}

// command runs the daemon in a mount namespace of its own, prepared by a shell script.
func (s *Server) command() (*exec.Cmd, error) {
	hide, err := unifiedHasControllers()
	if err != nil {
		return nil, err
	}
	// The daemon, its shims and their OCI runtime get a mount namespace of their own
	// (see the package doc): the host's mounts are never touched.
	cmd := exec.Command("/bin/sh", "-c", namespaceScript(hide, ociRuntimes()), s.bin, "--config", s.configPath())
	cmd.Dir = s.dir
	// Go makes the new mount namespace private (MS_REC|MS_PRIVATE).
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	// runc and the shim are found through PATH.
	cmd.Env = append(os.Environ(), "PATH="+os.Getenv("PATH")+":/usr/sbin:/usr/bin:/sbin:/bin")
	return cmd, nil
}

// probe opens the readiness probe: a Version call on the socket, once it exists.
func (s *Server) probe() (childproc.Probe, func(), error) {
	probe := func(ctx context.Context) error {
		if _, err := os.Stat(s.Address()); err != nil {
			return err
		}
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		c, err := client.New(s.Address(), client.WithTimeout(time.Second))
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Version(pctx)
		return err
	}
	return probe, func() {}, nil
}

func (s *Server) root() string       { return filepath.Join(s.dir, "root") }
func (s *Server) state() string      { return filepath.Join(s.dir, "state") }
func (s *Server) configPath() string { return filepath.Join(s.dir, "config.toml") }
func (s *Server) logPath() string    { return filepath.Join(s.dir, "containerd.log") }
func (s *Server) pidFile() string    { return filepath.Join(s.dir, "containerd.pid") }

// config is the daemon's config.toml (config version 2, as containerd 1.6 reads it).
// Plugins gauntlet does not use are disabled so the daemon starts quickly
// (docs/benchmarks.md, Costs the code cites, Local servers).
func (s *Server) config() string {
	q := strconv.Quote
	return strings.Join([]string{
		`version = 2`,
		`root = ` + q(s.root()),
		`state = ` + q(s.state()),
		`disabled_plugins = [` +
			`"io.containerd.grpc.v1.cri", ` +
			`"io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", ` +
			`"io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", ` +
			`"io.containerd.internal.v1.tracing", "io.containerd.tracing.processor.v1.otlp"]`,
		`[grpc]`,
		`  address = ` + q(s.Address()),
		`[ttrpc]`,
		`  address = ` + q(s.Address()+".ttrpc"),
		`[debug]`,
		`  address = ""`,
		`  level = "warn"`,
		`[metrics]`,
		`  address = ""`,
		`[plugins."io.containerd.internal.v1.opt"]`,
		`  path = ` + q(filepath.Join(s.root(), "opt")),
		``,
	}, "\n")
}

// mountRoot mounts the root tmpfs when asked for and not mounted already (a Kill or
// crash leaves it mounted for the next run).
func (s *Server) mountRoot() error {
	if s.tmpfs <= 0 {
		return nil
	}
	mounted, err := isMountPoint(s.root())
	if err != nil {
		return err
	}
	if mounted {
		return nil
	}
	data := "size=" + strconv.FormatInt(s.tmpfs, 10) + ",mode=0711"
	if err := syscall.Mount("gauntlet-containerd", s.root(), "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, data); err != nil {
		return fmt.Errorf("mount tmpfs on %s (Options.RootTmpfsBytes): %w", s.root(), err)
	}
	return nil
}

// unmountRoot detaches the root tmpfs, and every other mount left under the server's
// directory in this mount namespace: a task's rootfs overlay or a second copy of the
// tmpfs that propagated back from the daemon's namespace while sandboxes ran (seen as
// a test's directory that could not be removed, "device or resource busy"). Detach,
// because a shim that outlived the daemon may still hold a lower directory; deepest
// first, and again while a pass finds more (stacked mounts show one at a time).
func (s *Server) unmountRoot() error {
	for pass := 0; pass < 8; pass++ {
		points, err := mountsUnder(s.dir)
		if err != nil || len(points) == 0 {
			return err
		}
		slices.SortFunc(points, func(a, b string) int { return len(b) - len(a) })
		for _, p := range points {
			if err := syscall.Unmount(p, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
				return fmt.Errorf("unmount %s: %w", p, err)
			}
		}
	}
	return fmt.Errorf("unmount under %s: mounts keep reappearing", s.dir)
}

// mountsUnder lists the mount points at or below dir in this thread's mount namespace.
func mountsUnder(dir string) ([]string, error) {
	mounts, err := procfs.Mounts()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, m := range mounts {
		if m.Point == dir || strings.HasPrefix(m.Point, dir+"/") {
			out = append(out, m.Point)
		}
	}
	return out, nil
}

// namespaceScript is the shell script that prepares the daemon's mount namespace and
// execs the daemon ("$0" "$@"):
//   - hide: unmount the cgroup2 hierarchy of a hybrid host, which crun refuses to run on;
//   - every OCI runtime binary in ro is bind-mounted read-only onto itself. crun (like runc)
//     refuses to run from a writable binary, which a container's process could overwrite
//     through /proc/PID/exe while the runtime sets it up (CVE-2019-5736): on every call it
//     bind-mounts its own executable read-only somewhere and re-executes itself from there,
//     a second start of the binary, twice per container start (docs/benchmarks.md, Costs
//     the code cites, Local servers).
//     A binary already on a read-only mount is what that copy would be, so crun runs it
//     directly: the same protection, made once per daemon. runc 1.1 still copies itself (it
//     also wants an environment variable set by its own re-exec). Failing to mount only
//     costs that time: the script warns and goes on.
func namespaceScript(hide bool, ro []string) string {
	var b strings.Builder
	if hide {
		b.WriteString("umount " + unifiedMount + " || exit 1\n")
	}
	for _, p := range ro {
		q := shellQuote(p)
		fmt.Fprintf(&b, "mount --bind %s %s && mount -o remount,bind,ro %s || echo 'ctrdlocal: could not bind %s read-only (it will copy itself on every call)' >&2\n", q, q, q, strings.ReplaceAll(p, "'", ""))
	}
	b.WriteString(`exec "$0" "$@"`)
	return b.String()
}

// ociRuntimes are the OCI runtime binaries installed (crun and runc), symlinks resolved.
func ociRuntimes() []string {
	var out []string
	for _, name := range []string{"crun", "runc"} {
		p, err := lookPath(name)
		if err != nil {
			continue
		}
		if r, err := filepath.EvalSymlinks(p); err == nil {
			p = r
		}
		if abs, err := filepath.Abs(p); err == nil {
			out = append(out, abs)
		}
	}
	return out
}

// shellQuote quotes s for sh.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// unifiedMount is where hybrid cgroup hosts mount the cgroup2 hierarchy.
const unifiedMount = "/sys/fs/cgroup/unified"

// unifiedHasControllers tells whether this is a hybrid cgroup host (v1 controllers
// plus a cgroup2 mount at /sys/fs/cgroup/unified) whose cgroup2 hierarchy offers
// controllers: crun refuses to run containers on such a host ("cgroups in hybrid
// mode not supported").
func unifiedHasControllers() (bool, error) {
	mounts, err := procfs.Mounts()
	if err != nil {
		return false, err
	}
	found := false
	for _, m := range mounts {
		if m.Point == unifiedMount && m.FSType == "cgroup2" {
			found = true
		}
	}
	if !found {
		return false, nil
	}
	c, err := os.ReadFile(filepath.Join(unifiedMount, "cgroup.controllers"))
	if err != nil {
		return false, fmt.Errorf("read %s/cgroup.controllers: %w", unifiedMount, err)
	}
	return strings.TrimSpace(string(c)) != "", nil
}

// isMountPoint tells whether path is a mount point in this thread's mount namespace.
func isMountPoint(path string) (bool, error) {
	mounts, err := procfs.Mounts()
	if err != nil {
		return false, err
	}
	for _, m := range mounts {
		if m.Point == path {
			return true, nil
		}
	}
	return false, nil
}

func findBinary(explicit string) (string, error) {
	if explicit != "" {
		if _, err := os.Stat(explicit); err != nil {
			return "", fmt.Errorf("Options.Binary: %w", err)
		}
		return explicit, nil
	}
	var found string
	for _, name := range []string{"containerd", "runc", "containerd-shim-runc-v2"} {
		p, err := lookPath(name)
		if err != nil {
			return "", fmt.Errorf("%s: %w", name, ErrNotInstalled)
		}
		if name == "containerd" {
			found = p
		}
	}
	return found, nil
}

func lookPath(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, d := range []string{"/usr/sbin", "/usr/bin", "/sbin"} {
		p := filepath.Join(d, name)
		if st, err := os.Stat(p); err == nil && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", os.ErrNotExist
}
