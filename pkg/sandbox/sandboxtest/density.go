package sandboxtest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
)

// DensityConfig says how many sandboxes Density makes and how it reports them.
type DensityConfig struct {
	// Count is how many sandboxes are alive at the peak.
	Count int
	// Step is the size of each reported bucket of creates and destroys; default Count/10.
	Step int
	// Live starts a command (a sleep) in every sandbox once all exist, and reports the
	// memory they take with it running, before destroying them.
	Live bool
	// Spec is the spec of every sandbox (its ID is set by Density).
	Spec sandbox.Spec
	// Churn, at the peak count (after Live's commands end), destroys the oldest
	// sandbox and creates a new one, Churn times: a fleet replacing its sandboxes at a
	// steady count, which the drain that follows does not show.
	Churn int
}

// DensityBucket is one bucket of Density's report: creates or destroys that took the
// count from From to To.
type DensityBucket struct {
	From, To int
	// Mean is the mean wall time of one create or destroy in the bucket; CPU the mean
	// CPU time (user and system) this process spent on one, which waits for a busy
	// machine's cores do not inflate.
	Mean, CPU time.Duration
	// Kernel is the mean CPU time the host's kernel threads (workers finishing a
	// cgroup's removal, among others) spent during one, which CPU leaves out; HostCPU
	// the host's whole busy CPU time during one (every process and core, other loads
	// on the machine included).
	Kernel, HostCPU time.Duration
	// MemUsed is the host's MemTotal-MemAvailable at the end of the bucket.
	MemUsed int64
}

// DensityReport is what Density measured.
type DensityReport struct {
	Creates, Destroys []DensityBucket
	// MemBefore is the host's used memory before the first create; MemIdle with Count
	// idle sandboxes; MemLive with a live command in each (0 unless Live).
	MemBefore, MemIdle, MemLive int64
	// CreateMean and DestroyMean are the means over all Count creates and destroys.
	CreateMean, DestroyMean time.Duration
	// ChurnDestroy and ChurnCreate are Churn's destroys and creates at the peak count
	// (zero unless Churn).
	ChurnDestroy, ChurnCreate DensityBucket
	// Drain is the cost of all Count destroys together.
	Drain Cost
}

// Cost is what a stretch of work cost: wall time, this process's CPU time (user and
// system), the host's kernel threads' CPU time and the host's whole busy CPU time.
type Cost struct {
	Wall, CPU, Kernel, HostCPU time.Duration
}

// Measure runs f and returns what it cost.
func Measure(f func()) Cost {
	m := startCost()
	f()
	return m.stop()
}

// String formats the cost in milliseconds.
func (c Cost) String() string {
	return fmt.Sprintf("%.0f ms wall, %.0f ms CPU, %.0f ms kernel threads' CPU, %.0f ms host CPU",
		ms(c.Wall), ms(c.CPU), ms(c.Kernel), ms(c.HostCPU))
}

// costMeter is a Cost being measured.
type costMeter struct {
	start                 time.Time
	cpu, kernel, hostBusy time.Duration
}

func startCost() costMeter {
	return costMeter{start: time.Now(), cpu: cpuTime(), kernel: kthreadCPU(), hostBusy: hostCPU()}
}

func (m costMeter) stop() Cost {
	return Cost{Wall: time.Since(m.start), CPU: cpuTime() - m.cpu, Kernel: kthreadCPU() - m.kernel,
		HostCPU: hostCPU() - m.hostBusy}
}

// bucket makes the bucket from..to out of the cost of its n operations.
func bucket(from, to int, c Cost) DensityBucket {
	n := time.Duration(max(abs(to-from), 1))
	return DensityBucket{From: from, To: to, Mean: c.Wall / n, CPU: c.CPU / n, Kernel: c.Kernel / n,
		HostCPU: c.HostCPU / n, MemUsed: memUsed()}
}

func abs(n int) int { return max(n, -n) }

// Density creates cfg.Count sandboxes one by one in rt, timing each bucket of cfg.Step
// creates, optionally starts a live command in each, then destroys them all, timing each
// bucket of destroys (the first bucket is at the peak count). It is the density harness
// of docs/benchmarks.md: the host's memory is read from /proc/meminfo, so run it on a
// machine that is otherwise quiet for a fair memory figure. Every sandbox it made is
// destroyed even when it fails.
func Density(t testing.TB, rt sandbox.Runtime, cfg DensityConfig) DensityReport {
	t.Helper()
	if cfg.Step <= 0 {
		cfg.Step = max(cfg.Count/10, 1)
	}
	ctx := context.Background()
	var rep DensityReport
	ids := make([]string, 0, cfg.Count)
	defer func() { // on failure: leave nothing behind
		for _, id := range ids {
			_ = rt.Destroy(ctx, id)
		}
	}()
	rep.MemBefore = memUsed()
	var total time.Duration
	for from := 0; from < cfg.Count; from += cfg.Step {
		to := min(from+cfg.Step, cfg.Count)
		m := startCost()
		for i := from; i < to; i++ {
			spec := cfg.Spec
			spec.ID = fmt.Sprintf("density-%06d", i)
			h, err := rt.Create(ctx, spec)
			if err != nil {
				t.Fatalf("density: create %d: %v", i, err)
			}
			ids = append(ids, h.ID)
		}
		c := m.stop()
		total += c.Wall
		b := bucket(from, to, c)
		rep.Creates = append(rep.Creates, b)
		t.Logf("density: create %6d..%6d: %7.3f ms each (%.3f ms CPU, %.3f ms kernel threads, %.3f ms host CPU), host memory used %s",
			from, to, ms(b.Mean), ms(b.CPU), ms(b.Kernel), ms(b.HostCPU), mib(b.MemUsed))
	}
	rep.CreateMean = total / time.Duration(max(cfg.Count, 1))
	rep.MemIdle = memUsed()
	if cfg.Live {
		stop := startLive(t, rt, ids)
		rep.MemLive = memUsed()
		t.Logf("density: %d live sandboxes, host memory used %s", len(ids), mib(rep.MemLive))
		stop()
	}
	if cfg.Churn > 0 {
		rep.ChurnDestroy, rep.ChurnCreate = churn(t, rt, cfg, &ids)
	}
	for len(ids) > 0 {
		from := len(ids)
		to := max(from-cfg.Step, 0)
		m := startCost()
		for len(ids) > to {
			id := ids[len(ids)-1]
			if err := rt.Destroy(ctx, id); err != nil {
				t.Fatalf("density: destroy %s: %v", id, err)
			}
			ids = ids[:len(ids)-1]
		}
		c := m.stop()
		rep.Drain.Wall += c.Wall
		rep.Drain.CPU += c.CPU
		rep.Drain.Kernel += c.Kernel
		rep.Drain.HostCPU += c.HostCPU
		b := bucket(from, to, c)
		rep.Destroys = append(rep.Destroys, b)
		t.Logf("density: destroy %6d..%6d: %7.3f ms each (%.3f ms CPU, %.3f ms kernel threads, %.3f ms host CPU), host memory used %s",
			from, to, ms(b.Mean), ms(b.CPU), ms(b.Kernel), ms(b.HostCPU), mib(b.MemUsed))
	}
	rep.DestroyMean = rep.Drain.Wall / time.Duration(max(cfg.Count, 1))
	t.Logf("density: the drain of %d: %v", cfg.Count, rep.Drain)
	t.Logf("density: %d sandboxes: create %.3f ms, destroy %.3f ms on average; memory used %s before, %s idle (%.0f KiB each)",
		cfg.Count, ms(rep.CreateMean), ms(rep.DestroyMean), mib(rep.MemBefore), mib(rep.MemIdle),
		float64(rep.MemIdle-rep.MemBefore)/1024/float64(max(cfg.Count, 1)))
	if cfg.Live {
		t.Logf("density: %s with a live command in each (%.0f KiB each over idle)", mib(rep.MemLive),
			float64(rep.MemLive-rep.MemIdle)/1024/float64(max(cfg.Count, 1)))
	}
	return rep
}

// churn destroys the oldest of ids (one that ran Live's command, if any) and creates a
// new sandbox, cfg.Churn times, timing destroys and creates apart.
func churn(t testing.TB, rt sandbox.Runtime, cfg DensityConfig, ids *[]string) (destroy, create DensityBucket) {
	t.Helper()
	ctx := context.Background()
	n := len(*ids)
	destroy = DensityBucket{From: n, To: n}
	create = destroy
	for i := range cfg.Churn {
		id := (*ids)[0]
		start, cpu := time.Now(), cpuTime()
		if err := rt.Destroy(ctx, id); err != nil {
			t.Fatalf("density: churn: destroy %s: %v", id, err)
		}
		destroy.Mean += time.Since(start)
		destroy.CPU += cpuTime() - cpu
		*ids = (*ids)[1:]
		spec := cfg.Spec
		spec.ID = fmt.Sprintf("density-churn-%06d", i)
		start, cpu = time.Now(), cpuTime()
		h, err := rt.Create(ctx, spec)
		if err != nil {
			t.Fatalf("density: churn: create %d: %v", i, err)
		}
		create.Mean += time.Since(start)
		create.CPU += cpuTime() - cpu
		*ids = append(*ids, h.ID)
	}
	for _, b := range []*DensityBucket{&destroy, &create} {
		b.Mean /= time.Duration(cfg.Churn)
		b.CPU /= time.Duration(cfg.Churn)
		b.MemUsed = memUsed()
	}
	t.Logf("density: churn at %d, %d times: destroy %.3f ms (%.3f ms CPU), create %.3f ms (%.3f ms CPU) each",
		n, cfg.Churn, ms(destroy.Mean), ms(destroy.CPU), ms(create.Mean), ms(create.CPU))
	return destroy, create
}

// liveArg is the sleep's argument, which finds the live commands among the host's
// processes whatever the runtime.
const liveArg = "86399.25"

// startLive starts a sleep in every sandbox and waits until all of them run; the
// returned func ends them.
func startLive(t testing.TB, rt sandbox.Runtime, ids []string) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var mu sync.Mutex
	ended, firstEnd := 0, ""
	deadline := time.Now().Add(time.Duration(len(ids))*200*time.Millisecond + time.Minute)
launch:
	for i, id := range ids {
		// At most 4 commands starting at once: a thousand launchers at a time left the
		// machine with a load of 700, each copying the host's mount table.
		for {
			mu.Lock()
			starting := i - ended - countLive()
			mu.Unlock()
			if starting < 4 {
				break
			}
			if time.Now().After(deadline) {
				break launch
			}
			time.Sleep(20 * time.Millisecond)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := rt.Exec(ctx, id, sandbox.ExecRequest{Argv: []string{"sleep", liveArg}, Timeout: 24 * time.Hour})
			if ctx.Err() != nil {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if ended++; ended == 1 {
				firstEnd = fmt.Sprintf("%s: exit %d, %v, stderr %q", id, res.ExitCode, err, res.Stderr)
			}
		}()
	}
	for n := countLive(); n < len(ids); n = countLive() {
		if time.Now().After(deadline) {
			mu.Lock()
			t.Errorf("density: %d of %d live commands running; %d ended early, the first %s", n, len(ids), ended, firstEnd)
			mu.Unlock()
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	return func() {
		cancel()
		wg.Wait()
	}
}

// countLive counts the host's processes running the live sleep.
func countLive() int {
	ents, _ := os.ReadDir("/proc")
	n := 0
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Equal(b, []byte("sleep\x00"+liveArg+"\x00")) {
			n++
		}
	}
	return n
}

// cpuTime is the user and system CPU time this process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// clockTick is the unit of /proc's CPU times (USER_HZ, 100 on every Linux ABI).
const clockTick = 10 * time.Millisecond

// hostCPU is the host's busy CPU time, all cores (/proc/stat: user, nice, system, irq,
// softirq, steal).
func hostCPU() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0
	}
	var busy int64
	for _, i := range []int{1, 2, 3, 6, 7, 8} {
		v, _ := strconv.ParseInt(f[i], 10, 64)
		busy += v
	}
	return time.Duration(busy) * clockTick
}

// kthreadCPU is the CPU time of the host's kernel threads (children of kthreadd, pid
// 2) alive now: the kernel's workers, which finish a cgroup's removal after rmdir
// returns. A worker that exits between two readings takes its time with it.
func kthreadCPU() time.Duration {
	ents, _ := os.ReadDir("/proc")
	var ticks int64
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ... utime stime: fields 4, 14 and 15; comm may hold spaces.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 13 || f[1] != "2" {
			continue
		}
		u, _ := strconv.ParseInt(f[11], 10, 64)
		s, _ := strconv.ParseInt(f[12], 10, 64)
		ticks += u + s
	}
	return time.Duration(ticks) * clockTick
}

// memUsed is the host's MemTotal - MemAvailable in bytes.
func memUsed() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	var total, avail int64
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "MemTotal:":
			total = v * 1024
		case "MemAvailable:":
			avail = v * 1024
		}
	}
	return total - avail
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func mib(n int64) string { return fmt.Sprintf("%.0f MiB", float64(n)/(1<<20)) }
