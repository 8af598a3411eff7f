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
}

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
		start, cpu := time.Now(), cpuTime()
		for i := from; i < to; i++ {
			spec := cfg.Spec
			spec.ID = fmt.Sprintf("density-%06d", i)
			h, err := rt.Create(ctx, spec)
			if err != nil {
				t.Fatalf("density: create %d: %v", i, err)
			}
			ids = append(ids, h.ID)
		}
		d := time.Since(start)
		total += d
		b := DensityBucket{From: from, To: to, Mean: d / time.Duration(to-from),
			CPU: (cpuTime() - cpu) / time.Duration(to-from), MemUsed: memUsed()}
		rep.Creates = append(rep.Creates, b)
		t.Logf("density: create %6d..%6d: %7.3f ms each (%.3f ms CPU), host memory used %s", from, to, ms(b.Mean), ms(b.CPU), mib(b.MemUsed))
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
	total = 0
	for len(ids) > 0 {
		from := len(ids)
		to := max(from-cfg.Step, 0)
		start, cpu := time.Now(), cpuTime()
		for len(ids) > to {
			id := ids[len(ids)-1]
			if err := rt.Destroy(ctx, id); err != nil {
				t.Fatalf("density: destroy %s: %v", id, err)
			}
			ids = ids[:len(ids)-1]
		}
		d := time.Since(start)
		total += d
		b := DensityBucket{From: from, To: to, Mean: d / time.Duration(from-to),
			CPU: (cpuTime() - cpu) / time.Duration(from-to), MemUsed: memUsed()}
		rep.Destroys = append(rep.Destroys, b)
		t.Logf("density: destroy %6d..%6d: %7.3f ms each (%.3f ms CPU), host memory used %s", from, to, ms(b.Mean), ms(b.CPU), mib(b.MemUsed))
	}
	rep.DestroyMean = total / time.Duration(max(cfg.Count, 1))
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
