package process

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gauntlet-rl/gauntlet/pkg/procfs"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
)

// cgroupVersion says which cgroup hierarchy a host uses for the controllers we need.
type cgroupVersion int

const (
	cgroupV1 cgroupVersion = 1
	cgroupV2 cgroupVersion = 2
)

func (v cgroupVersion) String() string { return "v" + strconv.Itoa(int(v)) }

// cgroupHost knows where the controllers live on this host.
type cgroupHost struct {
	version cgroupVersion
	// v1: controller name -> mount point; v2: "" -> the unified mount point.
	mounts map[string]string
	// bandwidthWrites counts writes of CPU bandwidth files. Each makes the kernel walk
	// every cgroup on the host (tg_set_bandwidth checks the whole tree's quotas), so
	// their number per create is what a test watches.
	bandwidthWrites atomic.Int64
}

// v1Controllers are the controllers a sandbox needs on a v1 (or hybrid) host.
var v1Controllers = []string{"memory", "pids", "cpu", "cpuacct"}

// detectCgroups reads this thread's mount table (procfs.MountInfo) and decides between v1
// and v2: v2 when /sys/fs/cgroup is itself a cgroup2 mount (unified hierarchy), v1
// otherwise, in which case every controller of v1Controllers must be mounted.
func detectCgroups() (*cgroupHost, error) {
	b, err := procfs.MountInfo()
	if err != nil {
		return nil, err
	}
	return parseCgroupMounts(bytes.NewReader(b))
}

func parseCgroupMounts(r interface{ Read([]byte) (int, error) }) (*cgroupHost, error) {
	v1 := map[string]string{}
	var unified string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		// id parent major:minor root mountpoint opts [optional...] - fstype source superopts
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		pf := strings.Fields(pre)
		qf := strings.Fields(post)
		if len(pf) < 5 || len(qf) < 3 {
			continue
		}
		mnt := pf[4]
		switch qf[0] {
		case "cgroup2":
			if mnt == "/sys/fs/cgroup" {
				unified = mnt
			}
		case "cgroup":
			for _, o := range strings.Split(qf[2], ",") {
				for _, c := range v1Controllers {
					if o == c {
						if _, seen := v1[c]; !seen {
							v1[c] = mnt
						}
					}
				}
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if unified != "" {
		return &cgroupHost{version: cgroupV2, mounts: map[string]string{"": unified}}, nil
	}
	var missing []string
	for _, c := range v1Controllers {
		if v1[c] == "" {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("%w: cgroup v1 controllers not mounted: %s (and /sys/fs/cgroup is not cgroup2)",
			sandbox.ErrUnavailable, strings.Join(missing, ", "))
	}
	return &cgroupHost{version: cgroupV1, mounts: v1}, nil
}

// cgroup is one sandbox's cgroup: one directory per v1 hierarchy, or one v2 directory.
type cgroup struct {
	host *cgroupHost
	rel  string // path below each mount, e.g. "gauntlet/ab12/sb1"
}

func (h *cgroupHost) cgroup(rel string) *cgroup { return &cgroup{host: h, rel: rel} }

// dir returns the directory of controller c (v2 ignores c).
func (g *cgroup) dir(c string) string {
	if g.host.version == cgroupV2 {
		return filepath.Join(g.host.mounts[""], g.rel)
	}
	return filepath.Join(g.host.mounts[c], g.rel)
}

// dirs returns the distinct directories of the cgroup (v1 controllers may share a mount).
func (g *cgroup) dirs() []string {
	if g.host.version == cgroupV2 {
		return []string{g.dir("")}
	}
	var out []string
	seen := map[string]bool{}
	for _, c := range v1Controllers {
		d := g.dir(c)
		if !seen[d] {
			seen[d] = true
			out = append(out, d)
		}
	}
	return out
}

// procsFiles are the cgroup.procs files a process writes its pid to in order to join.
func (g *cgroup) procsFiles() []string {
	var out []string
	for _, d := range g.dirs() {
		out = append(out, filepath.Join(d, "cgroup.procs"))
	}
	return out
}

// create makes the cgroup and applies the memory and pids limits; the CPU quota waits
// for the first command (setCPU). On v2 it enables the controllers on every ancestor
// below the mount first.
func (g *cgroup) create(l sandbox.Limits) error {
	if g.host.version == cgroupV2 {
		root := g.host.mounts[""]
		parts := strings.Split(g.rel, "/")
		cur := root
		for _, p := range parts {
			if err := writeFile(filepath.Join(cur, "cgroup.subtree_control"), "+memory +pids +cpu"); err != nil {
				return fmt.Errorf("enable controllers in %s: %w", cur, err)
			}
			cur = filepath.Join(cur, p)
			if err := os.Mkdir(cur, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
				return err
			}
		}
	} else {
		for _, d := range g.dirs() {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return err
			}
		}
	}
	return g.setLimits(l, false)
}

// setLimits writes the limits, the CPU quota too when cpu is set. A quota write makes
// the kernel walk every cgroup on the host (tg_set_bandwidth checks the whole tree's
// quotas), so its cost grows with the number of sandboxes: create leaves it to the first
// command, and an idle sandbox, which uses no CPU, never pays it.
func (g *cgroup) setLimits(l sandbox.Limits, cpu bool) error {
	var errs []error
	w := func(c, file, val string) {
		if err := writeFile(filepath.Join(g.dir(c), file), val); err != nil {
			errs = append(errs, err)
		}
	}
	if g.host.version == cgroupV2 {
		w("", "memory.max", strconv.FormatInt(l.MemoryBytes, 10))
		if exists(filepath.Join(g.dir(""), "memory.swap.max")) {
			w("", "memory.swap.max", "0")
		}
		w("", "pids.max", strconv.FormatInt(l.Pids, 10))
	} else {
		// memory.memsw.limit_in_bytes must never be below memory.limit_in_bytes: when
		// the limit rises (UpdateLimits), raise memsw first.
		mem := strconv.FormatInt(l.MemoryBytes, 10)
		memsw := exists(filepath.Join(g.dir("memory"), "memory.memsw.limit_in_bytes"))
		if memsw && l.MemoryBytes > readInt(filepath.Join(g.dir("memory"), "memory.limit_in_bytes")) {
			w("memory", "memory.memsw.limit_in_bytes", mem)
			w("memory", "memory.limit_in_bytes", mem)
		} else {
			w("memory", "memory.limit_in_bytes", mem)
			if memsw {
				w("memory", "memory.memsw.limit_in_bytes", mem)
			}
		}
		w("pids", "pids.max", strconv.FormatInt(l.Pids, 10))
	}
	if cpu {
		if err := g.setCPU(l.CPUMillis); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// setCPU writes the CPU quota (millicores).
func (g *cgroup) setCPU(millis int64) error {
	const period = 100000 // µs
	quota := millis * period / 1000
	if g.host.version == cgroupV2 {
		g.host.bandwidthWrites.Add(1)
		return writeFile(filepath.Join(g.dir(""), "cpu.max"), fmt.Sprintf("%d %d", quota, period))
	}
	// A new cgroup has the default period already: writing it again costs another walk.
	if readInt(filepath.Join(g.dir("cpu"), "cpu.cfs_period_us")) != period {
		g.host.bandwidthWrites.Add(1)
		if err := writeFile(filepath.Join(g.dir("cpu"), "cpu.cfs_period_us"), strconv.Itoa(period)); err != nil {
			return err
		}
	}
	g.host.bandwidthWrites.Add(1)
	return writeFile(filepath.Join(g.dir("cpu"), "cpu.cfs_quota_us"), strconv.FormatInt(quota, 10))
}

// counters is a reading of the cgroup's cumulative counters.
type counters struct {
	cpu       time.Duration
	peak      int64
	oomKills  int64
	pidsMax   int64 // forks refused at pids.max
	throttled int64
}

// read reads the counters; missing files read as zero.
func (g *cgroup) read() counters {
	var c counters
	if g.host.version == cgroupV2 {
		d := g.dir("")
		st := keyed(filepath.Join(d, "cpu.stat"))
		c.cpu = time.Duration(st["usage_usec"]) * time.Microsecond
		c.throttled = st["nr_throttled"]
		c.peak = readInt(filepath.Join(d, "memory.peak"))
		c.oomKills = keyed(filepath.Join(d, "memory.events"))["oom_kill"]
		c.pidsMax = keyed(filepath.Join(d, "pids.events"))["max"]
		return c
	}
	c.cpu = time.Duration(readInt(filepath.Join(g.dir("cpuacct"), "cpuacct.usage")))
	c.throttled = keyed(filepath.Join(g.dir("cpu"), "cpu.stat"))["nr_throttled"]
	c.peak = readInt(filepath.Join(g.dir("memory"), "memory.max_usage_in_bytes"))
	c.oomKills = keyed(filepath.Join(g.dir("memory"), "memory.oom_control"))["oom_kill"]
	c.pidsMax = keyed(filepath.Join(g.dir("pids"), "pids.events"))["max"]
	return c
}

// peakTracker measures peak memory from a point in time.
type peakTracker struct {
	g *cgroup
	f *os.File // v2: the memory.peak fd the reset applies to
}

// startPeak restarts peak-memory tracking from the current use. v1 resets by writing to
// memory.max_usage_in_bytes; v2 (kernel 6.12+) resets memory.peak for the open file only,
// so the tracker keeps that file. When no reset is possible the tracker reports the
// cgroup's all-time peak.
func (g *cgroup) startPeak() *peakTracker {
	t := &peakTracker{g: g}
	if g.host.version == cgroupV2 {
		f, err := os.OpenFile(filepath.Join(g.dir(""), "memory.peak"), os.O_RDWR, 0)
		if err == nil {
			if _, err := f.WriteString("reset"); err == nil {
				t.f = f
			} else {
				f.Close()
			}
		}
		return t
	}
	_ = writeFile(filepath.Join(g.dir("memory"), "memory.max_usage_in_bytes"), "0")
	return t
}

// close releases the tracker without reading it.
func (t *peakTracker) close() {
	if t.f != nil {
		t.f.Close()
		t.f = nil
	}
}

// peak returns the peak since startPeak and releases the tracker.
func (t *peakTracker) peak() int64 {
	if t.f != nil {
		defer t.f.Close()
		buf := make([]byte, 32)
		n, _ := t.f.ReadAt(buf, 0)
		v, _ := strconv.ParseInt(strings.TrimSpace(string(buf[:n])), 10, 64)
		return v
	}
	return t.g.read().peak
}

func (g *cgroup) memory() int64 {
	if g.host.version == cgroupV2 {
		return readInt(filepath.Join(g.dir(""), "memory.current"))
	}
	return readInt(filepath.Join(g.dir("memory"), "memory.usage_in_bytes"))
}

func (g *cgroup) pids() int64 {
	return readInt(filepath.Join(g.dir("pids"), "pids.current"))
}

// procs lists the pids in the cgroup.
func (g *cgroup) procs() []int {
	b, err := os.ReadFile(filepath.Join(g.dir("pids"), "cgroup.procs"))
	if err != nil {
		return nil
	}
	var out []int
	for _, f := range bytes.Fields(b) {
		if n, err := strconv.Atoi(string(f)); err == nil {
			out = append(out, n)
		}
	}
	return out
}

// kill SIGKILLs every process in the cgroup and waits until it is empty or the deadline
// passes. v2 uses cgroup.kill; v1 has no such file, so it freezes nothing and instead
// kills repeatedly: a fork racing the kill is caught by the next round, and pids.max bounds
// how many there can be.
func (g *cgroup) kill(deadline time.Duration) error {
	end := time.Now().Add(deadline)
	if g.host.version == cgroupV2 {
		_ = writeFile(filepath.Join(g.dir(""), "cgroup.kill"), "1")
	}
	for {
		ps := g.procs()
		if len(ps) == 0 {
			// Killed processes leave cgroup.procs at exit but count in pids.current until
			// reaped; wait briefly for that so Stats reads settle.
			for i := 0; i < 200 && g.pids() > 0; i++ {
				time.Sleep(time.Millisecond)
			}
			return nil
		}
		for _, p := range ps {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
		if time.Now().After(end) {
			return fmt.Errorf("cgroup %s: %d processes survive SIGKILL", g.rel, len(ps))
		}
		time.Sleep(time.Millisecond)
	}
}

// remove removes the cgroup's directories, once kill has emptied it, one after the
// other: each removal takes the kernel's cgroup mutex, which concurrent removals spin on.
func (g *cgroup) remove() error {
	var errs []error
	for _, d := range g.dirs() {
		errs = append(errs, removeDir(d))
	}
	return errors.Join(errs...)
}

// poolPrefix starts the names of the cgroups a runtime keeps for later creates (its
// cgroup pool), below its cgroup parent: "." never occurs in a sandbox id.
const poolPrefix = "pool."

// poolSlack is the memory other than the kernel's own objects (page cache, tmpfs, anon)
// a cgroup may still have charged when it is kept for another sandbox. A new cgroup has
// none; the kernel's per-CPU charge caches may hold a few pages for one that uses
// nothing.
const poolSlack = 512 << 10

// poolKmemSlack bounds the kernel objects a kept cgroup may still have charged: those of
// its sandbox's last namespaces (mounts, network, processes), which the kernel frees in
// the background within tens of milliseconds (here 0.3-1.5 MiB right after a command,
// 60 KiB 20 ms later).
const poolKmemSlack = 8 << 20

// reset makes an emptied cgroup (kill has run, its sandbox's mounts are gone) read like
// a new one for the next sandbox, or says why it cannot be kept (the caller removes it
// then). Memory still charged to it (page cache of files its sandbox read, the per-CPU
// charge caches) is reclaimed (memory.force_empty); if more than poolSlack of it cannot
// be (tmpfs pages a snapshot's layer keeps: no reclaim frees them without swap), or more
// than poolKmemSlack of kernel objects, it is not kept. The peak is reset. The
// cumulative counters (CPU use, OOM kills, refused forks, throttling) carry over: every
// reader takes differences around a command. The limits stay until the next create
// writes its own, and the CPU quota until the next sandbox's first command (setCPU): no
// process runs in the cgroup before then. Only cgroup v1 keeps cgroups: v2 refuses to
// rename one.
func (g *cgroup) reset() error {
	if g.host.version != cgroupV1 {
		return errors.New("cgroup v2 cannot rename a cgroup")
	}
	if n, err := readIntStrict(filepath.Join(g.dir("pids"), "pids.current")); err != nil || n != 0 {
		return fmt.Errorf("cgroup %s: %d processes left (%v)", g.rel, n, err)
	}
	mem := g.dir("memory")
	usage := func() (all, kmem int64, err error) {
		p := filepath.Join(mem, "memory.usage_in_bytes")
		if sw := filepath.Join(mem, "memory.memsw.usage_in_bytes"); exists(sw) {
			p = sw // memory and swap
		}
		if all, err = readIntStrict(p); err != nil {
			return 0, 0, err
		}
		kmem, err = readIntStrict(filepath.Join(mem, "memory.kmem.usage_in_bytes"))
		return all, kmem, err
	}
	all, kmem, err := usage()
	if err != nil {
		return err
	}
	// Reclaim only when there is memory besides kernel objects to give back: with
	// kernel objects still being freed, force_empty retries its reclaim until none is
	// left or it gives up, which cost a destroy more than a millisecond of CPU.
	if all-kmem > poolSlack {
		if err := writeFile(filepath.Join(mem, "memory.force_empty"), "0"); err != nil {
			return err
		}
		if all, kmem, err = usage(); err != nil {
			return err
		}
	}
	if all-kmem > poolSlack || kmem > poolKmemSlack {
		return fmt.Errorf("cgroup %s: %d bytes of memory still charged (%d of kernel objects)", g.rel, all, kmem)
	}
	return writeFile(filepath.Join(mem, "memory.max_usage_in_bytes"), "0")
}

// renameTo renames the cgroup's directories to rel, within their parent (cgroup v1
// allows that; v2 refuses), and returns the cgroup there. If one rename fails, those
// done are undone.
func (g *cgroup) renameTo(rel string) (*cgroup, error) {
	to := g.host.cgroup(rel)
	from, dst := g.dirs(), to.dirs()
	for i := range from {
		if err := unix.Rename(from[i], dst[i]); err != nil {
			for j := i - 1; j >= 0; j-- {
				_ = unix.Rename(dst[j], from[j])
			}
			return nil, fmt.Errorf("rename cgroup %s to %s: %w", from[i], dst[i], err)
		}
	}
	return to, nil
}

// removeDir removes one of the cgroup's directories (dirs), once kill has emptied it.
func removeDir(d string) error {
	var err error
	for range 50 { // a just-killed process may take a moment to leave
		if err = unix.Rmdir(d); err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		time.Sleep(2 * time.Millisecond)
	}
	return fmt.Errorf("remove cgroup %s: %w", d, err)
}

func (g *cgroup) exists() bool {
	for _, d := range g.dirs() {
		if !exists(d) {
			return false
		}
	}
	return true
}

func writeFile(p, s string) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(s)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	return nil
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func readInt(p string) int64 {
	b, err := os.ReadFile(p)
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n
}

// readIntStrict reads a number from a file, failing when it cannot.
func readIntStrict(p string) (int64, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", p, err)
	}
	return n, nil
}

// keyed parses "key value" lines.
func keyed(p string) map[string]int64 {
	out := map[string]int64{}
	b, err := os.ReadFile(p)
	if err != nil {
		return out
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), " ")
		if !ok {
			continue
		}
		if n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
			out[k] = n
		}
	}
	return out
}
