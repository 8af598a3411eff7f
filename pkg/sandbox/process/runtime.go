//go:build linux

package process

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gauntlet-rl/gauntlet/pkg/images"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/faultfuse"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/safety"
)

// Name is the runtime's registry name.
const Name = "process"

// SandboxUID and SandboxGID are the ids processes see for themselves inside a sandbox.
const (
	SandboxUID = 1000
	SandboxGID = 1000
)

// Config configures a Runtime. StateDir is required; the rest has defaults.
type Config struct {
	// StateDir holds sandbox and snapshot state and their mounts. A new Runtime over the
	// same directory recovers what an earlier one left. Keep it on a local filesystem.
	StateDir string
	// RunDir holds the workspace mount points, which the unprivileged sandbox launcher
	// must be able to reach: RunDir and its ancestors need search permission for others
	// (o+x). Default /run/gauntlet-sandbox. Sandboxes of one StateDir live in a
	// subdirectory named after it, so several runtimes may share a RunDir.
	RunDir string
	// CgroupParent is the cgroup (relative to each hierarchy's root) under which the
	// runtime makes its sandboxes' cgroups; default "gauntlet". On cgroup v2 the runtime
	// enables the memory, pids and cpu controllers along that path.
	CgroupParent string
	// CgroupPool is how many emptied sandbox cgroups the runtime keeps for later
	// creates instead of removing them, whatever the count of sandboxes (see
	// CgroupTrimBelow for more); 0 means DefaultCgroupPool, a negative value keeps none
	// at all. Removing a memory cgroup makes the kernel walk every superblock's object
	// lists on the host, and making one allocates per-superblock state: both grow with
	// the number of sandboxes. Kept cgroups are reset (memory reclaimed, peak cleared;
	// see cgroup.reset) and renamed to the next sandbox's path. Close and Purge remove
	// them, as does a runtime starting over the same state directory. Only on cgroup
	// v1: v2 refuses to rename a cgroup, so there every destroy removes its own.
	CgroupPool int
	// CgroupTrimBelow is the count of live sandboxes below which the pool is trimmed
	// back to CgroupPool. Until then a destroy keeps its cgroup even when the pool
	// holds CgroupPool already, as long as kept and live cgroups together are no more
	// than the most sandboxes that lived at once (the runtime's high-water mark: no
	// more cgroups, and so no more of their kernel memory, than it held then): a drain
	// from thousands pays no removal, whose cost grows with the count, at any destroy.
	// Once fewer than CgroupTrimBelow live, a goroutine of the runtime removes the kept
	// cgroups beyond CgroupPool one at a time, at most 200 a second, off any destroy's
	// path, where each removal is cheap; it stops when the count is back at
	// CgroupTrimBelow or more, and starts again at the next destroy below it. Close
	// removes what is left, Purge too. 0 means
	// DefaultCgroupTrimBelow; a negative value keeps no more than CgroupPool (each
	// destroy beyond it removes its cgroup).
	CgroupTrimBelow int
	// HostUID and HostGID are the host ids sandboxed processes run as (mapped to
	// SandboxUID/GID inside); default 100000. Use ids no host user owns.
	HostUID, HostGID int
	// Bwrap and Setpriv are the helper binaries; defaults are looked up in PATH.
	Bwrap, Setpriv string
	// Images, when set, lets sandboxes run on images (PrepareImage, Spec.Image) unpacked
	// by it; nil: every sandbox's root is the host's.
	Images *images.Store
	// Hosts says where the host process reaches the ports of the hosts sandboxes may be
	// allowed (sandbox.HostMapper); a port not in it is reached at the host's own name.
	Hosts sandbox.HostMap
	// Logger receives warnings about cleanup problems; default slog.Default().
	Logger *slog.Logger
}

// DefaultCgroupPool is Config.CgroupPool's default: the kept cgroups a runtime holds
// whatever its count of sandboxes (a steady churn needs a few; a drain keeps more, see
// CgroupTrimBelow). A kept cgroup holds about 320 KiB of unreclaimable kernel memory
// (an empty memory cgroup's, on a 6.18 kernel), so a full pool holds about 320 MiB
// until Close; it fills only while destroys outnumber creates.
const DefaultCgroupPool = 1024

// DefaultCgroupTrimBelow is Config.CgroupTrimBelow's default: below 1,024 live
// sandboxes a removal costs a tenth of what it does at 9,000 (1.4 against 13 ms of wall
// and kernel-worker time a destroy on a 2-core host, docs/benchmarks.md).
const DefaultCgroupTrimBelow = 1024

// cgroupTrimPause is the trimmer's pause after each removal (Config.CgroupTrimBelow):
// the kernel finishes a removal in a worker of its own, holding the lock every cgroup
// operation takes, so removals back to back would delay the creates and destroys that
// go on meanwhile.
const cgroupTrimPause = 5 * time.Millisecond

// Runtime is the process runtime. See the package doc.
type Runtime struct {
	cfg     Config
	cg      *cgroupHost
	cgBase  string // cgroup path of this state dir's sandboxes
	runDir  string // workspace mount points of this state dir's sandboxes
	seccomp []byte
	sh      string
	rootfs  []string // bwrap arguments building the root filesystem
	nsenter string   // for sandboxes with services ("" when missing)

	// layerMu is held by gc for its whole run and by Snapshot and Restore while a layer
	// is on its way into a chain (renamed, or looked up, but not yet referenced), so gc
	// never removes a layer that is about to be used. Order: layerMu before mu.
	layerMu sync.Mutex

	mu        sync.Mutex // guards the fields below and every record's Chain
	closed    bool
	active    map[string]*box        // sandboxes this instance manages
	known     map[string]*boxRecord  // every sandbox record on disk
	snapshots map[string]*snapRecord // every snapshot record on disk

	// ownFS says the runtime's own tmpfs at the volumes' and the mount points' parents are
	// in place (mountOwnFS); Purge unmounts them when empty, the next create mounts them
	// again. Guarded by mu.
	ownFS bool
	// sbDir holds the sandboxes' records: on the volumes' tmpfs when the runtime mounted
	// it (vol/.sandboxes), else the state directory's sandboxes folder, where records of
	// a runtime that predates the tmpfs also stay (load reads both).
	sbDir string

	// freeVols are volume folders gc unmounted and kept for a later create to mount
	// again, instead of removing them. Removing a folder that was a mount point walks
	// every mount of the namespace whenever another namespace still holds a copy of
	// that mount (each running exec's bwrap copies the host's mount table), which made
	// destroy cost grow with the count. Close and Purge remove them. Guarded by mu.
	freeVols map[string]struct{}

	// cgPool names the emptied cgroups (below cgBase, poolPrefix…) a destroy kept for a
	// later create: at most cgPoolMax (0 on cgroup v2), and beyond it, while at least
	// cgTrimBelow sandboxes live (0: never), as many as keep len(cgPool)+len(active)
	// within cgPeak, the most sandboxes active at once. The trimmer (trimCgPool)
	// removes those beyond cgPoolMax once fewer live; trimDone is open while it runs.
	// Close and Purge remove them all. Guarded by mu.
	cgPool      []string
	cgPoolMax   int
	cgTrimBelow int
	cgPeak      int
	trimDone    chan struct{}

	// gcVolumes counts the volumes gc has looked at, so a test can tell that a destroy
	// looks at its own volumes only (with a full scan, destroy cost grew with the count).
	gcVolumes atomic.Int64

	// volOwners counts the records (known) whose upper directory lives in each volume,
	// and layerRefs the references to each layer from records' and snapshots' chains:
	// gc reads them instead of looking through every record, which made a destroy of a
	// fork or a restored sandbox, and a snapshot's deletion, O(N). Guarded by mu;
	// changed only with the records (putRecord, dropRecord, setChain, putSnapshot,
	// dropSnapshot).
	volOwners map[string]int
	layerRefs map[string]int
}

// boxRecord is a sandbox's persisted state (sandboxes/<id>.json).
type boxRecord struct {
	Handle sandbox.Handle `json:"handle"`
	// Volume is the id of the tmpfs holding the upper and work directories.
	Volume string `json:"volume"`
	// Chain lists the lower layers, top first, relative to the state directory.
	Chain []string `json:"chain"`
	// Root is the unpacked image under the sandbox's root (image.go); "" for the host's.
	Root string `json:"root,omitempty"`
	// User is who commands run as, resolved from Spec.User (image.go); nil: SandboxUID.
	User *execUser `json:"user,omitempty"`
	// MountByVolume says the workspace is mounted at its volume's mount point (mountDir);
	// false: at wsDir, as runtimes before it did.
	MountByVolume bool `json:"mount_by_volume,omitempty"`
}

// snapRecord is a snapshot's persisted state (snapshots/<id>.json).
type snapRecord struct {
	Snapshot sandbox.Snapshot `json:"snapshot"`
	Spec     sandbox.Spec     `json:"spec"`
	Chain    []string         `json:"chain"`
}

// box is a sandbox this instance manages.
type box struct {
	mu    sync.Mutex // serialises execs, snapshot, restore and destroy
	rec   *boxRecord
	cg    *cgroup
	gone  bool
	execs int64
	total sandbox.Metering
	// lmu guards limits, the limits UpdateLimits last wrote (zero: the Spec's). It is not
	// mu, so limits can change while a command runs.
	lmu    sync.Mutex
	limits sandbox.Limits
	// cpuSet says the cgroup's CPU quota is written (ensureCPU). Guarded by lmu.
	cpuSet bool
	// fuse is the storage-fault layer commands see as their workspace (nil: none; see
	// storagefaults.go). Guarded by mu.
	fuse *faultfuse.Layer
	// streamInit is the host pid of the sandbox init of the ExecStream command running
	// (0: none), whose network namespace DialSandbox enters. Not guarded by mu, which
	// the command holds while it runs.
	streamInit atomic.Int64
}

// New checks the host and returns a Runtime over cfg.StateDir. Missing isolation features
// are errors wrapping sandbox.ErrUnavailable that say what is missing.
func New(cfg Config) (*Runtime, error) {
	if cfg.StateDir == "" {
		return nil, fmt.Errorf("%w: state_dir: required", sandbox.ErrInvalid)
	}
	abs, err := filepath.Abs(cfg.StateDir)
	if err != nil {
		return nil, fmt.Errorf("%w: state_dir: %v", sandbox.ErrInvalid, err)
	}
	cfg.StateDir = abs
	if cfg.RunDir == "" {
		cfg.RunDir = "/run/gauntlet-sandbox"
	}
	if cfg.CgroupParent == "" {
		cfg.CgroupParent = "gauntlet"
	}
	if cfg.CgroupPool == 0 {
		cfg.CgroupPool = DefaultCgroupPool
	}
	if cfg.CgroupTrimBelow == 0 {
		cfg.CgroupTrimBelow = DefaultCgroupTrimBelow
	}
	if cfg.HostUID == 0 {
		cfg.HostUID = 100000
	}
	if cfg.HostGID == 0 {
		cfg.HostGID = 100000
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root (the runtime mounts overlayfs and tmpfs and manages cgroups)")
	}
	look := func(name, cur string) string {
		if cur != "" {
			return cur
		}
		p, err := exec.LookPath(name)
		if err != nil {
			missing = append(missing, name+" in PATH (scripts/deps.sh installs it)")
		}
		return p
	}
	cfg.Bwrap = look("bwrap", cfg.Bwrap)
	cfg.Setpriv = look("setpriv", cfg.Setpriv)
	sh := look("sh", "")
	if b, err := os.ReadFile("/proc/filesystems"); err != nil || !strings.Contains(string(b), "\toverlay\n") {
		missing = append(missing, "overlayfs (modprobe overlay)")
	}
	if n := readInt("/proc/sys/user/max_user_namespaces"); n == 0 {
		missing = append(missing, "user namespaces (user.max_user_namespaces is 0)")
	}
	cg, err := detectCgroups()
	if err != nil {
		missing = append(missing, err.Error())
	}
	prog, err := seccompProgram()
	if err != nil {
		missing = append(missing, err.Error())
	}
	if err := safety.Probe(); err != nil {
		missing = append(missing, err.Error())
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("%w: process runtime needs %s", sandbox.ErrUnavailable, strings.Join(missing, "; "))
	}
	if err := cloexecInherited(); err != nil {
		return nil, fmt.Errorf("mark inherited descriptors close-on-exec: %w", err)
	}
	sum := sha256.Sum256([]byte(cfg.StateDir))
	runDir := filepath.Join(cfg.RunDir, hex.EncodeToString(sum[:6]))
	if err := os.MkdirAll(runDir, 0o711); err != nil {
		return nil, fmt.Errorf("%w: run dir: %v", sandbox.ErrUnavailable, err)
	}
	if err := searchable(runDir); err != nil {
		return nil, fmt.Errorf("%w: run dir: %v", sandbox.ErrUnavailable, err)
	}
	r := &Runtime{
		runDir:    runDir,
		cfg:       cfg,
		cg:        cg,
		cgBase:    filepath.Join(cfg.CgroupParent, hex.EncodeToString(sum[:6])),
		seccomp:   prog,
		sh:        sh,
		active:    map[string]*box{},
		known:     map[string]*boxRecord{},
		snapshots: map[string]*snapRecord{},
		freeVols:  map[string]struct{}{},
		volOwners: map[string]int{},
		layerRefs: map[string]int{},
	}
	if cg.version == cgroupV1 {
		r.cgPoolMax = max(cfg.CgroupPool, 0)
		if r.cgPoolMax > 0 {
			r.cgTrimBelow = max(cfg.CgroupTrimBelow, 0)
		}
	}
	r.removeLeftoverPool()
	for _, d := range []string{"sandboxes", "snapshots", "vol", "empty", "etc"} {
		if err := os.MkdirAll(filepath.Join(abs, d), 0o711); err != nil {
			return nil, fmt.Errorf("state dir: %w", err)
		}
	}
	if err := r.writeEtc(); err != nil {
		return nil, err
	}
	if err := r.mountOwnFS(); err != nil {
		return nil, fmt.Errorf("%w: %v", sandbox.ErrUnavailable, err)
	}
	r.rootfs = r.rootfsArgs()
	r.nsenter = lookNsenter()
	if err := r.load(); err != nil {
		return nil, err
	}
	return r, nil
}

// CgroupVersion reports which cgroup hierarchy the runtime detected ("v1" or "v2").
func (r *Runtime) CgroupVersion() string { return r.cg.version.String() }

// Name implements sandbox.Runtime.
func (r *Runtime) Name() string { return Name }

// Close implements sandbox.Runtime: sandboxes stay, for a later Recover. The runtime's
// cgroup and mount-point parents go when they are empty, as after Purge: removing one
// still in use fails and keeps it. Without that, every runtime over a throwaway state
// directory (every test) left both behind; a test machine had 900 of each.
func (r *Runtime) Close() error {
	r.mu.Lock()
	r.closed = true
	r.active = map[string]*box{}
	r.mu.Unlock()
	r.waitTrim()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.removeEmptyParents()
	return nil
}

// removeEmptyParents removes the per-state-dir cgroup and mount-point directories, and
// unmounts the runtime's own tmpfs, if they are empty (made again on the next Create).
// Called with mu held.
func (r *Runtime) removeEmptyParents() {
	r.dropCgPool()
	for _, d := range r.cg.cgroup(r.cgBase).dirs() {
		_ = os.Remove(d)
	}
	r.ownFS = false
	r.dropFreeVols()
	_ = os.Remove(r.path("vol", recordsDir)) // when empty
	for _, d := range []string{r.path("vol"), r.runDir} {
		if ents, err := os.ReadDir(d); err != nil || len(ents) > 0 {
			continue
		}
		if ownTmpfs(d) {
			if err := unix.Unmount(d, 0); err != nil {
				r.cfg.Logger.Warn("sandbox: unmount the runtime's tmpfs", "dir", d, "err", err)
			}
		}
	}
	_ = os.Remove(r.runDir)
}

// dropCgPool removes the cgroups kept for reuse. Called with mu held.
func (r *Runtime) dropCgPool() {
	for _, name := range r.cgPool {
		if err := r.cg.cgroup(filepath.Join(r.cgBase, name)).remove(); err != nil {
			r.cfg.Logger.Warn("sandbox: remove a kept cgroup", "err", err)
		}
	}
	r.cgPool = nil
}

// setActive makes b the active sandbox id and raises the high-water mark (cgPeak).
// Called with mu held.
func (r *Runtime) setActive(id string, b *box) {
	r.active[id] = b
	r.cgPeak = max(r.cgPeak, len(r.active))
}

// trimCgPool starts the trimmer when the pool holds more than cgPoolMax and fewer than
// cgTrimBelow sandboxes live, unless it runs already. Called with mu held.
func (r *Runtime) trimCgPool() {
	if r.trimDone != nil || !r.trimDue() {
		return
	}
	done := make(chan struct{})
	r.trimDone = done
	go r.trim(done)
}

// trimDue says the pool holds cgroups beyond cgPoolMax and removing them is cheap.
// Called with mu held.
func (r *Runtime) trimDue() bool {
	return !r.closed && len(r.cgPool) > r.cgPoolMax && len(r.active) < r.cgTrimBelow
}

// trim is the trimmer: it removes kept cgroups, one every cgroupTrimPause at most, while
// trimDue, then closes done.
func (r *Runtime) trim(done chan struct{}) {
	defer close(done)
	for {
		r.mu.Lock()
		if !r.trimDue() {
			r.trimDone = nil
			// The pool is back to its bound: the high-water mark starts again from
			// the cgroups held now.
			if len(r.cgPool) <= r.cgPoolMax {
				r.cgPeak = len(r.active) + len(r.cgPool)
			}
			r.mu.Unlock()
			return
		}
		name := r.cgPool[0]
		r.cgPool = r.cgPool[1:]
		r.mu.Unlock()
		if err := r.cg.cgroup(filepath.Join(r.cgBase, name)).remove(); err != nil {
			r.cfg.Logger.Warn("sandbox: remove a kept cgroup", "err", err)
		}
		time.Sleep(cgroupTrimPause)
	}
}

// waitTrim waits for the trimmer, if it runs, to stop.
func (r *Runtime) waitTrim() {
	r.mu.Lock()
	done := r.trimDone
	r.mu.Unlock()
	if done != nil {
		<-done
	}
}

// removeLeftoverPool removes the kept cgroups an earlier runtime over the same state
// directory left (it stopped without Close). A runtime still running over it finds the
// one it takes gone and makes a new cgroup (makeCgroup).
func (r *Runtime) removeLeftoverPool() {
	for _, d := range r.cg.cgroup(r.cgBase).dirs() {
		ents, err := os.ReadDir(d)
		if err != nil {
			continue
		}
		for _, e := range ents {
			if e.IsDir() && strings.HasPrefix(e.Name(), poolPrefix) {
				if err := removeDir(filepath.Join(d, e.Name())); err != nil {
					r.cfg.Logger.Warn("sandbox: remove a kept cgroup", "err", err)
				}
			}
		}
	}
}

// makeCgroup makes the sandbox's cgroup g and writes its limits: a kept one (cgPool)
// renamed to g's path when there is one, else a new one.
func (r *Runtime) makeCgroup(g *cgroup, l sandbox.Limits) error {
	r.mu.Lock()
	var name string
	if n := len(r.cgPool); n > 0 {
		name = r.cgPool[n-1]
		r.cgPool = r.cgPool[:n-1]
	}
	r.mu.Unlock()
	if name != "" {
		kept := r.cg.cgroup(filepath.Join(r.cgBase, name))
		_, err := kept.renameTo(g.rel)
		if err == nil {
			return g.setLimits(l, false)
		}
		if !errors.Is(err, fs.ErrNotExist) { // gone: removeLeftoverPool
			r.cfg.Logger.Warn("sandbox: reuse a kept cgroup", "err", err)
		}
		_ = kept.remove() // what is left of it
	}
	return g.create(l)
}

// keepCgroup keeps the emptied cgroup of a destroyed sandbox for a later create
// (cgPool), reset to read like a new one (cgroup.reset) and renamed out of the
// sandbox's path. When the pool is full (poolRoom), the runtime closed, or the cgroup
// cannot be reset, it removes the cgroup instead.
func (r *Runtime) keepCgroup(g *cgroup) error {
	if !r.poolRoom() {
		return g.remove()
	}
	if err := g.reset(); err != nil {
		r.cfg.Logger.Debug("sandbox: cgroup not kept", "cgroup", g.rel, "err", err)
		return g.remove()
	}
	name := poolPrefix + newID()
	kept, err := g.renameTo(filepath.Join(r.cgBase, name))
	if err != nil {
		r.cfg.Logger.Warn("sandbox: keep a cgroup", "err", err)
		return g.remove()
	}
	r.mu.Lock()
	if r.poolRoomLocked() {
		r.cgPool = append(r.cgPool, name)
		r.mu.Unlock()
		return nil
	}
	r.mu.Unlock()
	return kept.remove()
}

// poolRoom says the cgroup pool has room for the cgroup of a sandbox being destroyed
// (still active).
func (r *Runtime) poolRoom() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.poolRoomLocked()
}

// poolRoomLocked is poolRoom with mu held. Beyond cgPoolMax, the cgroup moves from the
// live sandboxes (active) to the pool, so their sum stays within cgPeak as long as it
// is there now.
func (r *Runtime) poolRoomLocked() bool {
	if r.closed {
		return false
	}
	if len(r.cgPool) < r.cgPoolMax {
		return true
	}
	return r.cgTrimBelow > 0 && len(r.cgPool)+len(r.active) <= r.cgPeak
}

// dropFreeVols removes the volume folders kept for reuse. Called with mu held.
func (r *Runtime) dropFreeVols() {
	for v := range r.freeVols {
		_ = os.Remove(r.volDir(v))
		_ = os.Remove(r.mountDir(v))
	}
	clear(r.freeVols)
}

// ownFSName is the source name of the runtime's own tmpfs mounts.
const ownFSName = "gauntlet-state"

// mountOwnFS mounts a tmpfs of the runtime's own at the state directory's vol folder
// (the volumes' mount points) and at the run directory (the workspaces' mount points,
// decoys, storage-fault and image-root mount points), unless one is there already: an
// earlier runtime over the same state directory mounted it, and its sandboxes live in
// it. A folder that already holds entries on the host's filesystem (sandboxes of a
// runtime that predates these mounts) is left as it is.
//
// Why: on the host's filesystem (ext4 here) every create and destroy of a sandbox made
// and removed mount-point folders and inodes through the journal and a synchronous
// discard, and removing a folder that had been a mount point walked every mount on the
// host; that cost grew with the number of sandboxes. On a tmpfs those folders cost a
// dentry. Called with mu held, or before the runtime is shared.
func (r *Runtime) mountOwnFS() error {
	if r.ownFS {
		return nil
	}
	for _, d := range []struct {
		dir  string
		mode os.FileMode
	}{{r.path("vol"), 0o711}, {r.runDir, 0o711}} {
		if err := os.MkdirAll(d.dir, d.mode); err != nil {
			return fmt.Errorf("own tmpfs %s: %w", d.dir, err)
		}
		if ownTmpfs(d.dir) {
			continue
		}
		if ents, err := os.ReadDir(d.dir); err != nil || len(ents) > 0 {
			continue
		}
		// Folders, empty decoy files and the sandboxes' records: no inode limit
		// (bounded by memory as any dentry is), the default size (half the memory, a
		// bound, not a reservation).
		opts := fmt.Sprintf("mode=%o,nr_inodes=0", d.mode)
		if err := unix.Mount(ownFSName, d.dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
			return fmt.Errorf("mount own tmpfs at %s: %w", d.dir, err)
		}
	}
	if r.sbDir == "" {
		r.sbDir = r.path("sandboxes")
		if ownTmpfs(r.path("vol")) {
			r.sbDir = r.path("vol", recordsDir)
		}
	}
	if err := os.MkdirAll(r.sbDir, 0o700); err != nil {
		return fmt.Errorf("records dir: %w", err)
	}
	r.ownFS = true
	return nil
}

// recordsDir is the sandboxes' records folder on the volumes' tmpfs: the dot keeps it
// apart from volume ids (gc skips it).
const recordsDir = ".sandboxes"

// ownTmpfs reports whether dir is the root of a tmpfs mounted there by a runtime.
func ownTmpfs(dir string) bool {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil || st.Type != unix.TMPFS_MAGIC {
		return false
	}
	var in, up unix.Stat_t
	if unix.Lstat(dir, &in) != nil || unix.Lstat(filepath.Dir(dir), &up) != nil {
		return false
	}
	return in.Dev != up.Dev
}

func (r *Runtime) path(rel ...string) string {
	return filepath.Join(append([]string{r.cfg.StateDir}, rel...)...)
}

// workspace is the host folder where a sandbox's workspace overlay is mounted.
func (r *Runtime) workspace(rec *boxRecord) string {
	if rec.MountByVolume {
		return r.mountDir(rec.Volume)
	}
	return r.wsDir(rec.Handle.ID)
}

// wsDir is the workspace's mount point, named by sandbox id, of the sandboxes made by a
// runtime before mountDir.
func (r *Runtime) wsDir(id string) string { return filepath.Join(r.runDir, id) }

// mountDir is the workspace overlay's mount point of the sandbox on volume vol: named by
// the volume, not the sandbox, so that it is kept and reused with the volume. Removing a
// folder that was a mount point walks every mount of the host's namespace whenever
// another namespace still holds a copy of that mount (every exec's bubblewrap copies the
// host's mounts); a folder named by sandbox id could not be reused. "." never occurs in
// a sandbox id, so it cannot clash with a wsDir.
func (r *Runtime) mountDir(vol string) string { return filepath.Join(r.runDir, vol+".ws") }

// searchable checks that others may search dir and every ancestor, as the unprivileged
// launcher must reach the workspace mount points.
func searchable(dir string) error {
	for d := dir; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return err
		}
		if fi.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("%s (mode %v) is not searchable by others; the sandbox launcher runs unprivileged", d, fi.Mode().Perm())
		}
		if d == "/" {
			return nil
		}
	}
}

func (r *Runtime) volDir(vol string) string { return r.path("vol", vol) }

func newID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// load reads every record on disk into known and snapshots.
func (r *Runtime) load() error {
	for _, dir := range []string{r.path("sandboxes"), r.sbDir, r.path("snapshots")} {
		kind := filepath.Base(dir)
		if dir == r.sbDir {
			if dir == r.path("sandboxes") {
				continue // read already
			}
			kind = "sandboxes"
		}
		ents, err := os.ReadDir(dir)
		if err != nil {
			return fmt.Errorf("load %s: %w", kind, err)
		}
		for _, e := range ents {
			id, ok := strings.CutSuffix(e.Name(), ".json")
			if !ok {
				continue
			}
			b, err := os.ReadFile(filepath.Join(dir, e.Name()))
			if err != nil {
				return fmt.Errorf("load %s/%s: %w", kind, e.Name(), err)
			}
			if kind == "sandboxes" {
				var rec boxRecord
				if err := json.Unmarshal(b, &rec); err != nil {
					return fmt.Errorf("load sandboxes/%s: %w", e.Name(), err)
				}
				r.putRecord(id, &rec)
			} else {
				var rec snapRecord
				if err := json.Unmarshal(b, &rec); err != nil {
					return fmt.Errorf("load snapshots/%s: %w", e.Name(), err)
				}
				r.putSnapshot(id, &rec)
			}
		}
	}
	return nil
}

// save writes a record atomically.
func (r *Runtime) save(kind, id string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	dir := r.path(kind)
	if kind == "sandboxes" {
		dir = r.sbDir
	}
	tmp := filepath.Join(dir, "."+id+".tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, id+".json"))
}

// removeRecord removes a sandbox's record, and the copy an earlier runtime may have
// left in the state directory's sandboxes folder.
func (r *Runtime) removeRecord(id string) error {
	dirs := []string{r.sbDir}
	if legacy := r.path("sandboxes"); legacy != r.sbDir {
		dirs = append(dirs, legacy)
	}
	var errs []error
	for _, dir := range dirs {
		if err := os.Remove(filepath.Join(dir, id+".json")); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Create implements sandbox.Runtime.
func (r *Runtime) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Handle, error) {
	if err := spec.Validate(); err != nil {
		return sandbox.Handle{}, fmt.Errorf("create: %w", err)
	}
	if isImage(spec.Image) {
		env, user, err := r.imageDefaults(ctx, spec.Image)
		if err != nil {
			return sandbox.Handle{}, fmt.Errorf("create: %w", err)
		}
		spec.Env = append(env, spec.Env...)
		if spec.User == "" {
			spec.User = user
		}
	}
	return r.create(ctx, spec.WithDefaults(), nil, "", true)
}

// create makes a sandbox over the given lower layers; seed says whether to write
// spec.Workspace into it. When the layers are a snapshot's, fromSnapshot names it: the
// sandbox is registered (its chain visible to gc) only while the snapshot still exists,
// so a concurrent DeleteSnapshot cannot collect the layers under it.
func (r *Runtime) create(ctx context.Context, spec sandbox.Spec, chain []string, fromSnapshot string, seed bool) (sandbox.Handle, error) {
	if err := ctx.Err(); err != nil {
		return sandbox.Handle{}, fmt.Errorf("create: %w", err)
	}
	// A gc that started before the record is registered must finish before the volume
	// exists, or it would find an unknown volume and remove it.
	r.layerMu.Lock()
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		r.layerMu.Unlock()
		return sandbox.Handle{}, fmt.Errorf("create: %w", sandbox.ErrClosed)
	}
	if spec.ID == "" {
		spec.ID = newID()
	}
	if _, dup := r.known[spec.ID]; dup {
		r.mu.Unlock()
		r.layerMu.Unlock()
		return sandbox.Handle{}, fmt.Errorf("create %s: %w", spec.ID, sandbox.ErrExists)
	}
	if _, ok := r.snapshots[fromSnapshot]; fromSnapshot != "" && !ok {
		r.mu.Unlock()
		r.layerMu.Unlock()
		return sandbox.Handle{}, fmt.Errorf("create from %s: %w", fromSnapshot, sandbox.ErrNotFound)
	}
	rec := &boxRecord{
		Handle: sandbox.Handle{ID: spec.ID, Runtime: Name, Spec: spec},
		Volume: newID(),
		Chain:  slices.Clone(chain),

		MountByVolume: true,
	}
	reuse := false
	for v := range r.freeVols {
		rec.Volume, reuse = v, true
		delete(r.freeVols, v)
		break
	}
	if err := r.mountOwnFS(); err != nil { // unmounted by a Purge
		r.mu.Unlock()
		r.layerMu.Unlock()
		return sandbox.Handle{}, fmt.Errorf("create %s: %w", spec.ID, err)
	}
	// Reserve the id; the record is written once the sandbox is ready.
	r.putRecord(spec.ID, rec)
	r.mu.Unlock()

	b := &box{rec: rec, cg: r.cg.cgroup(filepath.Join(r.cgBase, spec.ID))}
	fail := func(err error) (sandbox.Handle, error) {
		r.teardown(b, false, false)
		r.mu.Lock()
		r.dropRecord(spec.ID)
		r.mu.Unlock()
		r.gc(true)
		return sandbox.Handle{}, fmt.Errorf("create %s: %w", spec.ID, err)
	}
	err := r.mountVolume(rec.Volume, spec.Limits.DiskBytes, reuse)
	r.layerMu.Unlock()
	if err != nil {
		return fail(err)
	}
	if err := r.mountWorkspace(rec); err != nil {
		return fail(err)
	}
	if isImage(spec.Image) {
		if rec.Root, err = r.imageDir(ctx, spec.Image); err != nil {
			return fail(err)
		}
		if err := r.mountRoot(rec); err != nil {
			return fail(err)
		}
		if seed {
			if err := r.seedFromImage(rec); err != nil {
				return fail(err)
			}
		}
	}
	if rec.User, err = r.resolveUser(rec); err != nil {
		return fail(err)
	}
	if rec.User != nil {
		if err := r.writeUserEtc(rec); err != nil {
			return fail(err)
		}
	}
	if seed {
		if err := r.seed(rec); err != nil {
			return fail(err)
		}
	}
	if err := r.makeCgroup(b.cg, spec.Limits); err != nil {
		return fail(fmt.Errorf("cgroup: %w", err))
	}
	if err := r.setupServices(spec); err != nil {
		return fail(err)
	}
	state, _ := json.Marshal(map[string]any{"volume": rec.Volume, "cgroup": b.cg.rel})
	r.mu.Lock() // List reads records under mu
	rec.Handle.Created, rec.Handle.State = time.Now().UTC(), state
	r.mu.Unlock()
	if err := r.save("sandboxes", spec.ID, rec); err != nil {
		return fail(err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return sandbox.Handle{}, fmt.Errorf("create: %w", sandbox.ErrClosed)
	}
	r.setActive(spec.ID, b)
	return rec.Handle, nil
}

// mountVolume mounts a tmpfs of the given size for a sandbox's upper and work dirs;
// reuse says its folder is one gc kept (freeVols).
func (r *Runtime) mountVolume(vol string, size int64, reuse bool) error {
	d := r.volDir(vol)
	if err := os.Mkdir(d, 0o700); err != nil && !(reuse && errors.Is(err, fs.ErrExist)) {
		return fmt.Errorf("volume: %w", err)
	}
	inodes := max(size/4096, 16384)
	opts := fmt.Sprintf("size=%d,nr_inodes=%d,mode=0700", size, inodes)
	if err := unix.Mount("gauntlet-ws", d, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("mount volume tmpfs: %w", err)
	}
	return nil
}

// mountWorkspace (re)creates empty upper and work dirs in the volume and mounts the
// overlay at ws/<id> over rec.Chain.
func (r *Runtime) mountWorkspace(rec *boxRecord) error {
	vd := r.volDir(rec.Volume)
	upper, work := filepath.Join(vd, "upper"), filepath.Join(vd, "work")
	for _, d := range []string{upper, work} {
		if err := os.RemoveAll(d); err != nil {
			return err
		}
		if err := os.Mkdir(d, 0o755); err != nil {
			return err
		}
	}
	if err := os.Chown(upper, r.cfg.HostUID, r.cfg.HostGID); err != nil {
		return err
	}
	return r.mountOverlay(rec)
}

// mountOverlay mounts the workspace overlay over rec.Chain with the volume's upper and
// work dirs.
func (r *Runtime) mountOverlay(rec *boxRecord) error {
	vd := r.volDir(rec.Volume)
	upper, work := filepath.Join(vd, "upper"), filepath.Join(vd, "work")
	lowers := r.lowers(rec)
	if err := os.Mkdir(lowers[len(lowers)-1], 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	if len(lowers) > maxLayers {
		return fmt.Errorf("%w: %d snapshot layers exceed overlayfs's %d", sandbox.ErrLimit, len(rec.Chain), maxLayers-1)
	}
	ws := r.workspace(rec)
	if err := os.MkdirAll(ws, 0o755); err != nil {
		return err
	}
	err := mountOverlayAPI(ws, lowers, upper, work)
	if !errors.Is(err, errNoLowerdirPlus) {
		return err
	}
	// Kernels before 6.8: every option in one string, which must fit a page.
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s,%s",
		strings.Join(lowers, ":"), upper, work, overlayOpts)
	if len(opts) > 4000 {
		return fmt.Errorf("%w: %d snapshot layers exceed the overlay mount options page (kernel < 6.8)", sandbox.ErrLimit, len(rec.Chain))
	}
	if err := unix.Mount("gauntlet-ws", ws, "overlay", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("mount workspace overlay: %w", err)
	}
	return nil
}

// lowers are the workspace overlay's lower layers, top first. The bottom one is an
// empty folder in the sandbox's own volume: overlayfs checks each layer's mount against
// every mount below it (clone_private_mount), and the state directory's filesystem has
// every sandbox's volume below it, which made a create's cost grow with the count.
func (r *Runtime) lowers(rec *boxRecord) []string {
	lowers := make([]string, 0, len(rec.Chain)+1)
	for _, l := range rec.Chain {
		lowers = append(lowers, r.path(l))
	}
	return append(lowers, filepath.Join(r.volDir(rec.Volume), "base"))
}

// maxLayers is overlayfs's limit on lower layers (OVL_MAX_STACK).
const maxLayers = 500

// overlayOpts fixes the features whose on-disk traces (redirect xattrs) must be read the
// same way when an upper layer later serves as a lower one.
const overlayOpts = "redirect_dir=on,index=off,metacopy=off"

var errNoLowerdirPlus = errors.New("overlayfs lowerdir+ not supported")

// mountOverlayAPI mounts the overlay with the new mount API, adding lower layers one by
// one ("lowerdir+", Linux 6.8+), so the chain is not bounded by a page of options. It
// returns errNoLowerdirPlus when the kernel lacks the API or the key.
func mountOverlayAPI(target string, lowers []string, upper, work string) error {
	fd, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return fmt.Errorf("%w: fsopen: %v", errNoLowerdirPlus, err)
	}
	defer unix.Close(fd)
	for i, l := range lowers {
		if err := unix.FsconfigSetString(fd, "lowerdir+", l); err != nil {
			if i == 0 {
				return fmt.Errorf("%w: %v", errNoLowerdirPlus, err)
			}
			return fmt.Errorf("overlay lowerdir+ %s: %w", l, err)
		}
	}
	for _, kv := range [][2]string{{"upperdir", upper}, {"workdir", work}, {"redirect_dir", "on"}, {"index", "off"}, {"metacopy", "off"}} {
		if err := unix.FsconfigSetString(fd, kv[0], kv[1]); err != nil {
			return fmt.Errorf("overlay %s: %w", kv[0], err)
		}
	}
	if err := unix.FsconfigCreate(fd); err != nil {
		return fmt.Errorf("overlay create: %w", err)
	}
	mfd, err := unix.Fsmount(fd, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV)
	if err != nil {
		return fmt.Errorf("overlay fsmount: %w", err)
	}
	defer unix.Close(mfd)
	if err := unix.MoveMount(mfd, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("overlay move_mount: %w", err)
	}
	return nil
}

// seed writes spec.Workspace into the workspace, and makes the folders spec.Links lead
// to, owned by the sandbox user.
func (r *Runtime) seed(rec *boxRecord) error {
	ws := r.workspace(rec)
	for _, l := range slices.Sorted(maps.Keys(rec.Handle.Spec.Links)) {
		// A link to a missing folder would make "mkdir -p /logs/x" fail in the sandbox.
		p, _ := sandbox.CleanRelPath(rec.Handle.Spec.Links[l]) // validated
		if err := r.mkdirOwned(ws, filepath.Join(ws, filepath.FromSlash(p))); err != nil {
			return fmt.Errorf("seed link %s: %w", l, err)
		}
	}
	for _, f := range rec.Handle.Spec.Workspace {
		p, _ := sandbox.CleanRelPath(f.Path) // validated
		full := filepath.Join(ws, filepath.FromSlash(p))
		if err := r.mkdirOwned(ws, filepath.Dir(full)); err != nil {
			return fmt.Errorf("seed %s: %w", f.Path, err)
		}
		mode := f.Mode
		if mode == 0 {
			mode = 0o644
		}
		if err := os.WriteFile(full, f.Data, mode); err != nil {
			return fmt.Errorf("seed %s: %w", f.Path, err)
		}
		if err := os.Chmod(full, mode); err != nil {
			return err
		}
		if err := os.Lchown(full, r.cfg.HostUID, r.cfg.HostGID); err != nil {
			return err
		}
	}
	return nil
}

// mkdirOwned creates dir and its missing parents below root, owned by the sandbox user.
func (r *Runtime) mkdirOwned(root, dir string) error {
	if dir == root {
		return nil
	}
	if fi, err := os.Lstat(dir); err == nil {
		if !fi.IsDir() {
			return fmt.Errorf("%s exists and is not a directory", dir)
		}
		return nil
	}
	if err := r.mkdirOwned(root, filepath.Dir(dir)); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return os.Lchown(dir, r.cfg.HostUID, r.cfg.HostGID)
}

// get returns the active sandbox id or ErrNotFound / ErrClosed.
func (r *Runtime) get(op, id string) (*box, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, fmt.Errorf("%s %s: %w", op, id, sandbox.ErrClosed)
	}
	b, ok := r.active[id]
	if !ok {
		return nil, fmt.Errorf("%s %s: %w", op, id, sandbox.ErrNotFound)
	}
	return b, nil
}

// lock returns the active sandbox locked, or an error if it is gone.
func (r *Runtime) lock(op, id string) (*box, error) {
	b, err := r.get(op, id)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	if b.gone {
		b.mu.Unlock()
		return nil, fmt.Errorf("%s %s: %w", op, id, sandbox.ErrNotFound)
	}
	return b, nil
}

// Destroy implements sandbox.Runtime. Sandboxes left by an earlier instance can be
// destroyed without Recover.
func (r *Runtime) Destroy(ctx context.Context, id string) error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return fmt.Errorf("destroy %s: %w", id, sandbox.ErrClosed)
	}
	b, ok := r.active[id]
	if !ok {
		rec, known := r.known[id]
		if !known || rec.Handle.Created.IsZero() {
			r.mu.Unlock()
			return fmt.Errorf("destroy %s: %w", id, sandbox.ErrNotFound)
		}
		b = &box{rec: rec, cg: r.cg.cgroup(filepath.Join(r.cgBase, id))}
		r.setActive(id, b)
	}
	r.mu.Unlock()

	b.mu.Lock()
	defer b.mu.Unlock()
	if b.gone {
		return fmt.Errorf("destroy %s: %w", id, sandbox.ErrNotFound)
	}
	b.gone = true
	r.mu.Lock()
	vols := volumes(b.rec.Volume, b.rec.Chain)
	r.mu.Unlock()
	// A sandbox without lower layers whose volume holds none either (no snapshot of it
	// was taken) is the only user of its volume: teardown unmounts it beside the rest,
	// without emptying it first, and gc is not needed. Layers appear in a volume only by
	// a snapshot of its sandbox, which b.mu keeps out.
	own := len(vols) == 1 && vols[0] == b.rec.Volume && !r.holdsLayers(b.rec.Volume)
	err := r.teardown(b, own, true)
	r.mu.Lock()
	delete(r.active, id)
	r.dropRecord(id)
	r.trimCgPool()
	r.mu.Unlock()
	if rerr := r.removeRecord(id); rerr != nil {
		err = errors.Join(err, rerr)
	}
	if own {
		r.keepVolume(b.rec.Volume)
	} else {
		r.gc(false, vols...)
	}
	if err != nil {
		return fmt.Errorf("destroy %s: %w", id, err)
	}
	return nil
}

// teardown kills the sandbox's processes, removes its cgroup and unmounts its workspace;
// with dropVolume it unmounts the volume too (the caller keeps its folder, keepVolume).
// Otherwise the volume stays, emptied of the sandbox's own folders, as snapshots may
// reference its layers (gc decides). With keepCg, the cgroup is kept for a later create
// when the pool has room (keepCgroup), once everything else is done: the memory its
// sandbox's files held is given back only when they are gone.
//
// Once the processes are dead, the cgroup directories' removal and the unmounts run
// side by side: each unmount waits for an RCU grace period of the kernel's (and an
// overlay's for another when its layers' private mounts go), which concurrent waiters
// share, and the cgroups' removal does not depend on the mounts. One after the other,
// they took 3 ms of a destroy's wall time at 10,000 sandboxes. The cgroup directories go
// one after the other, though: removing them all at once had the removals spin on the
// kernel's cgroup mutex, and cost more CPU than it saved wall time.
func (r *Runtime) teardown(b *box, dropVolume, keepCg bool) error {
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	add := func(err error) {
		if err != nil {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		}
	}
	beside := func(f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			add(f())
		}()
	}
	keep := false
	if err := b.cg.kill(5 * time.Second); err != nil {
		add(err) // its directories cannot go while processes are left
	} else if keep = keepCg && r.poolRoom(); !keep {
		beside(b.cg.remove)
	}
	vd := r.volDir(b.rec.Volume)
	if dropVolume {
		// The overlay holds its layers through private mounts of its own, so the
		// volume's mount can go before the overlay's.
		beside(func() error { return unmount(vd) })
	}
	add(r.teardownServices(b.rec.Handle.ID))
	add(r.detachFuse(b))
	add(r.unmountRoot(b.rec))
	// A mount point named by the volume stays with it (mountDir).
	ws := r.workspace(b.rec)
	add(unmount(ws))
	if !b.rec.MountByVolume {
		if err := os.Remove(ws); err != nil && !errors.Is(err, fs.ErrNotExist) {
			add(err)
		}
	}
	add(os.RemoveAll(r.decoyDir(b.rec.Handle.ID)))
	wg.Wait()
	if !dropVolume {
		for _, d := range []string{"upper", "work", "base", "root", "user"} {
			if err := os.RemoveAll(filepath.Join(vd, d)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				add(err)
			}
		}
	}
	if keep {
		add(r.keepCgroup(b.cg))
	}
	return errors.Join(errs...)
}

// unmount unmounts p if it is a mount point; a busy mount is detached.
func unmount(p string) error {
	err := unix.Unmount(p, 0)
	switch {
	case err == nil, errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
		return nil
	case errors.Is(err, unix.EBUSY):
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("unmount %s: %w", p, err)
		}
		return nil
	default:
		return fmt.Errorf("unmount %s: %w", p, err)
	}
}

// gc removes layers no sandbox or snapshot references, and volumes left with nothing.
// Unless all, it looks at the given volumes only: those whose layers or upper directory
// a destroy, restore or snapshot deletion just stopped using, as nothing else can have
// become unused. With all it looks at every volume (after a failed create, and in
// Purge, to collect what an earlier failure or a dead process left).
func (r *Runtime) gc(all bool, vols ...string) {
	r.layerMu.Lock()
	defer r.layerMu.Unlock()
	if all {
		// Folders kept for reuse would look like volumes left by a failure.
		r.mu.Lock()
		r.dropFreeVols()
		r.mu.Unlock()
		ents, err := os.ReadDir(r.path("vol"))
		if err != nil {
			return
		}
		for _, e := range ents {
			if !strings.HasPrefix(e.Name(), ".") { // the records' folder
				vols = append(vols, e.Name())
			}
		}
	} else {
		slices.Sort(vols)
		vols = slices.Compact(vols)
	}
	look := make(map[string]bool, len(vols))
	for _, v := range vols {
		look[v] = true
	}
	// References are added only with layerMu held (a snapshot's new layer, a restore, a
	// create from a snapshot), which gc holds: the counts read below only fall.
	r.mu.Lock()
	for v := range r.freeVols {
		delete(look, v) // collected already
	}
	r.mu.Unlock()
	used := func(layer string) bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.layerRefs[layer] > 0
	}
	for _, vol := range vols {
		if !look[vol] {
			continue
		}
		r.gcVolumes.Add(1)
		vd := r.volDir(vol)
		ents, err := os.ReadDir(vd)
		if errors.Is(err, fs.ErrNotExist) {
			continue // collected already
		}
		r.mu.Lock()
		keep := r.volOwners[vol] > 0 // a sandbox's upper dir
		r.mu.Unlock()
		for _, e := range ents {
			if !strings.HasPrefix(e.Name(), "l-") {
				continue
			}
			rel := filepath.Join("vol", vol, e.Name())
			if used(rel) {
				keep = true
			} else if err := os.RemoveAll(filepath.Join(vd, e.Name())); err != nil {
				r.cfg.Logger.Warn("sandbox gc: remove layer", "layer", rel, "err", err)
			}
		}
		if keep {
			continue
		}
		r.releaseVolume(vol, all)
	}
	if all {
		r.removeOrphanMountDirs()
	}
}

// removeOrphanMountDirs removes workspace mount points whose volume is gone (a failure
// between the two). Called with layerMu held.
func (r *Runtime) removeOrphanMountDirs() {
	ents, err := os.ReadDir(r.runDir)
	if err != nil {
		return
	}
	for _, e := range ents {
		vol, ok := strings.CutSuffix(e.Name(), ".ws")
		if !ok {
			continue
		}
		if _, err := os.Lstat(r.volDir(vol)); !errors.Is(err, fs.ErrNotExist) {
			continue
		}
		d := r.mountDir(vol)
		if err := unmount(d); err != nil {
			r.cfg.Logger.Warn("sandbox gc: unmount workspace", "dir", d, "err", err)
			continue
		}
		if err := os.Remove(d); err != nil && !errors.Is(err, fs.ErrNotExist) {
			r.cfg.Logger.Warn("sandbox gc: remove workspace mount point", "dir", d, "err", err)
		}
	}
}

// releaseVolume unmounts an unused volume and keeps its folder for reuse (freeVols);
// with remove (Purge, a failure) or once the runtime is closed it removes the folder.
// Called with layerMu held.
func (r *Runtime) releaseVolume(vol string, remove bool) {
	vd := r.volDir(vol)
	if err := unmount(vd); err != nil {
		r.cfg.Logger.Warn("sandbox gc: unmount volume", "volume", vol, "err", err)
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !remove && !r.closed {
		r.freeVols[vol] = struct{}{}
		return
	}
	if err := os.Remove(vd); err != nil && !errors.Is(err, fs.ErrNotExist) {
		r.cfg.Logger.Warn("sandbox gc: remove volume", "volume", vol, "err", err)
	}
	if err := os.Remove(r.mountDir(vol)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		r.cfg.Logger.Warn("sandbox gc: remove workspace mount point", "volume", vol, "err", err)
	}
}

// holdsLayers reports whether volume vol may hold snapshot layers (l-*): when it does,
// or cannot be read, gc decides about it.
func (r *Runtime) holdsLayers(vol string) bool {
	ents, err := os.ReadDir(r.volDir(vol))
	if errors.Is(err, fs.ErrNotExist) {
		return false
	}
	if err != nil {
		return true
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "l-") {
			return true
		}
	}
	return false
}

// keepVolume offers the folder of a destroyed sandbox's volume, which teardown
// unmounted, to the next create (freeVols), unless it is still mounted (the unmount
// failed: gc(true) collects it later) or the runtime is closed (then it is removed).
// It is offered only now that the workspace's mount point is unmounted too, so a create
// cannot mount over a workspace still there.
func (r *Runtime) keepVolume(vol string) {
	r.gcVolumes.Add(1)
	if ownTmpfs(r.volDir(vol)) {
		return
	}
	r.layerMu.Lock()
	defer r.layerMu.Unlock()
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.closed {
		r.freeVols[vol] = struct{}{}
		return
	}
	_ = os.Remove(r.volDir(vol))
	_ = os.Remove(r.mountDir(vol))
}

// volumes are the volume of a sandbox's upper directory and those its layers live in:
// what gc must look at once the sandbox stops using them.
func volumes(vol string, chain []string) []string {
	out := make([]string, 0, len(chain)+1)
	if vol != "" {
		out = append(out, vol)
	}
	for _, l := range chain {
		if v := layerVolume(l); v != "" {
			out = append(out, v)
		}
	}
	return out
}

// layerVolume is the volume a layer (vol/<volume>/l-<id>) lives in.
func layerVolume(layer string) string {
	rest, ok := strings.CutPrefix(layer, "vol/")
	if !ok {
		return ""
	}
	v, _, _ := strings.Cut(rest, "/")
	return v
}

// setChain replaces rec's lower layers under mu, where gc reads them.
func (r *Runtime) setChain(rec *boxRecord, chain []string) {
	r.mu.Lock()
	refChain(r.layerRefs, rec.Chain, -1)
	rec.Chain = chain
	refChain(r.layerRefs, chain, 1)
	r.mu.Unlock()
}

// putRecord registers a sandbox's record in known and counts its references (volOwners,
// layerRefs); one already there under id is replaced. Called with mu held.
func (r *Runtime) putRecord(id string, rec *boxRecord) {
	r.dropRecord(id)
	r.known[id] = rec
	addRef(r.volOwners, rec.Volume, 1)
	refChain(r.layerRefs, rec.Chain, 1)
}

// dropRecord removes a sandbox's record from known and its references. Called with mu
// held.
func (r *Runtime) dropRecord(id string) {
	if rec, ok := r.known[id]; ok {
		addRef(r.volOwners, rec.Volume, -1)
		refChain(r.layerRefs, rec.Chain, -1)
		delete(r.known, id)
	}
}

// putSnapshot registers a snapshot's record and counts its layers' references; one
// already there under id is replaced. Called with mu held.
func (r *Runtime) putSnapshot(id string, rec *snapRecord) {
	r.dropSnapshot(id)
	r.snapshots[id] = rec
	refChain(r.layerRefs, rec.Chain, 1)
}

// dropSnapshot removes a snapshot's record and its references; it returns the record.
// Called with mu held.
func (r *Runtime) dropSnapshot(id string) (*snapRecord, bool) {
	rec, ok := r.snapshots[id]
	if ok {
		refChain(r.layerRefs, rec.Chain, -1)
		delete(r.snapshots, id)
	}
	return rec, ok
}

func refChain(refs map[string]int, chain []string, d int) {
	for _, l := range chain {
		addRef(refs, l, d)
	}
}

func addRef(refs map[string]int, key string, d int) {
	if refs[key] += d; refs[key] <= 0 {
		delete(refs, key)
	}
}

// List implements sandbox.Runtime.
func (r *Runtime) List(ctx context.Context) ([]sandbox.Handle, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, fmt.Errorf("list: %w", sandbox.ErrClosed)
	}
	out := make([]sandbox.Handle, 0, len(r.known))
	for _, rec := range r.known {
		if !rec.Handle.Created.IsZero() {
			out = append(out, rec.Handle)
		}
	}
	slices.SortFunc(out, func(a, b sandbox.Handle) int { return a.Created.Compare(b.Created) })
	return out, nil
}

// Recover implements sandbox.Runtime: it checks that the workspace mount and cgroup still
// exist (recreating the cgroup if only it vanished) and manages the sandbox again.
func (r *Runtime) Recover(ctx context.Context, h sandbox.Handle) error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return fmt.Errorf("recover %s: %w", h.ID, sandbox.ErrClosed)
	}
	if _, ok := r.active[h.ID]; ok {
		r.mu.Unlock()
		return nil
	}
	rec, ok := r.known[h.ID]
	r.mu.Unlock()
	if !ok || rec.Handle.Created.IsZero() {
		return fmt.Errorf("recover %s: %w", h.ID, sandbox.ErrNotFound)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(r.workspace(rec), &st); err != nil || st.Type != unix.OVERLAYFS_SUPER_MAGIC {
		return fmt.Errorf("recover %s: workspace mount gone (host rebooted?): %w", h.ID, sandbox.ErrNotFound)
	}
	if rec.Root != "" {
		if err := unix.Statfs(r.rootDir(h.ID), &st); err != nil || st.Type != unix.OVERLAYFS_SUPER_MAGIC {
			return fmt.Errorf("recover %s: image root mount gone (host rebooted?): %w", h.ID, sandbox.ErrNotFound)
		}
	}
	b := &box{rec: rec, cg: r.cg.cgroup(filepath.Join(r.cgBase, h.ID))}
	// A storage-fault layer served by a previous worker process is dead; its gate was
	// that process's, so the caller attaches a new one if it wants.
	if err := r.detachFuse(b); err != nil {
		return fmt.Errorf("recover %s: %w", h.ID, err)
	}
	if !b.cg.exists() {
		if err := b.cg.create(rec.Handle.Spec.Limits); err != nil {
			return fmt.Errorf("recover %s: cgroup: %w", h.ID, err)
		}
	}
	// A worker that died mid-exec may have left processes behind.
	if err := b.cg.kill(5 * time.Second); err != nil {
		return fmt.Errorf("recover %s: %w", h.ID, err)
	}
	if err := r.setupServices(rec.Handle.Spec); err != nil {
		return fmt.Errorf("recover %s: %w", h.ID, err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.active[h.ID]; !ok {
		r.setActive(h.ID, b)
	}
	return nil
}

// Stats implements sandbox.Runtime.
func (r *Runtime) Stats(ctx context.Context, id string) (sandbox.Stats, error) {
	b, err := r.lock("stats", id)
	if err != nil {
		return sandbox.Stats{}, err
	}
	defer b.mu.Unlock()
	var st unix.Statfs_t
	var used int64
	if err := unix.Statfs(r.volDir(b.rec.Volume), &st); err == nil {
		used = int64(st.Blocks-st.Bfree) * st.Bsize
	}
	return sandbox.Stats{
		MemoryBytes:    b.cg.memory(),
		Pids:           b.cg.pids(),
		WorkspaceBytes: used,
		Execs:          b.execs,
		Total:          b.total,
	}, nil
}

// WorkspaceDir implements sandbox.WorkspaceDirer. Files created there by the host should
// be given to WorkspaceOwner's ids so the sandbox user can change them.
func (r *Runtime) WorkspaceDir(ctx context.Context, id string) (string, error) {
	b, err := r.get("workspace dir", id)
	if err != nil {
		return "", err
	}
	return r.workspace(b.rec), nil
}

// WorkspaceOwner implements sandbox.WorkspaceOwner: the host uid and gid that own the
// sandbox user's files.
func (r *Runtime) WorkspaceOwner(ctx context.Context, id string) (uid, gid int, err error) {
	if _, err := r.get("workspace owner", id); err != nil {
		return 0, 0, err
	}
	return r.cfg.HostUID, r.cfg.HostGID, nil
}

// cloexecInherited marks every descriptor above stderr close-on-exec. Go opens its own
// descriptors that way, but descriptors inherited from the worker's parent are not, and
// bwrap passes whatever it inherits into the sandbox.
func cloexecInherited() error {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return err
	}
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || fd <= 2 {
			continue
		}
		if flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err == nil && flags&unix.FD_CLOEXEC == 0 {
			_, _ = unix.FcntlInt(uintptr(fd), unix.F_SETFD, flags|unix.FD_CLOEXEC)
		}
	}
	return nil
}
