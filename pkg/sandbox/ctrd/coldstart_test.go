package ctrd_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/pkg/oci"

	"github.com/gauntlet-rl/gauntlet/pkg/ctrdlocal"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/ctrd"
)

// coldVariant is one way of starting a sandbox in BenchmarkColdStartBreakdown.
type coldVariant struct {
	name  string
	opts  ctrd.Options // OCIRuntime and SandboxesPerShim
	setup func(rt *ctrd.Runtime)
	// run, when set, replaces rt.Create + Destroy: it returns the timed part.
	run func(b *testing.B, i int) time.Duration
}

// BenchmarkColdStartBreakdown starts sandboxes of several variants interleaved (one of
// each per round, in rotating order) against one daemon and reports the median cold
// start of each and the median of each phase (docs/benchmarks.md):
//
//	go test -run '^$' -bench ColdStartBreakdown -benchtime 20x -v ./pkg/sandbox/ctrd/
func BenchmarkColdStartBreakdown(b *testing.B) {
	srv, _ := start(b)
	ctx := context.Background()
	// after: the defaults (crun with the precompiled seccomp filter, up to
	// DefaultSandboxesPerShim sandboxes per shim, agent polled every millisecond).
	runc1 := ctrd.Options{OCIRuntime: "runc", SandboxesPerShim: 1}
	crun1 := ctrd.Options{OCIRuntime: "crun", SandboxesPerShim: 1}
	runcG := ctrd.Options{OCIRuntime: "runc"}
	after := ctrd.Options{OCIRuntime: "crun"}
	noSeccomp := func(rt *ctrd.Runtime) { ctrd.SetSpecHook(rt, func(s *oci.Spec) { s.Linux.Seccomp = nil }) }
	noAgent := func(rt *ctrd.Runtime) {
		ctrd.SetSpecHook(rt, func(s *oci.Spec) { s.Process.Args = []string{"/bin/sleep", "1000000"} })
		ctrd.SetNoAgentWait(rt, true)
	}
	// before: the runtime as it was (runc, a shim per sandbox, agent polled up to every
	// 10 ms); the setup of "before" restores the old poll.
	before := func(rt *ctrd.Runtime) { ctrd.SetAgentPoll(rt, 10*time.Millisecond) }
	crunCompiles := func(rt *ctrd.Runtime) { ctrd.SetNoPrecompiledSeccomp(rt, true) }
	// prev: the runtime as it was before the second round of cuts (docs/benchmarks.md):
	// crun copying itself on every call (a copy of crun on a writable mount, as
	// /usr/bin/crun was in containerd's namespace), containerd-shim-runc-v2 for every
	// start, no GOMAXPROCS in the agent's environment, and, when
	// GAUNTLET_COLDSTART_PREV_AGENT names one, the agent binary of that time (built from
	// the older source; in an image of its own, in a containerd namespace of its own).
	crunCopy := filepath.Join(b.TempDir(), "crun")
	if err := copyExecutable("/usr/bin/crun", crunCopy); err != nil {
		b.Fatalf("copy crun: %v", err)
	}
	noGOMAXPROCS := func(s *oci.Spec) {
		s.Process.Env = slices.DeleteFunc(s.Process.Env, func(e string) bool { return strings.HasPrefix(e, "GOMAXPROCS=") })
	}
	prevOpts := ctrd.Options{OCIRuntime: crunCopy, AgentBinary: os.Getenv("GAUNTLET_COLDSTART_PREV_AGENT")}
	if prevOpts.AgentBinary != "" {
		prevOpts.Namespace = "gauntlet-prev"
	}
	prev := func(rt *ctrd.Runtime) {
		ctrd.SetShimStart(rt, false)
		ctrd.SetClientNewTask(rt, true)
		ctrd.SetSpecHook(rt, noGOMAXPROCS)
	}
	variants := []coldVariant{
		{name: "before:runc,shim-each", opts: runc1, setup: before},
		{name: "runc,no-seccomp", opts: runc1, setup: func(rt *ctrd.Runtime) { before(rt); noSeccomp(rt) }},
		{name: "runc,no-agent", opts: runc1, setup: func(rt *ctrd.Runtime) { before(rt); noAgent(rt) }},
		{name: "runc,grouped-shim", opts: runcG, setup: before},
		{name: "crun,shim-each", opts: crun1},
		{name: "crun,grouped,crun-seccomp", opts: after, setup: crunCompiles},
		{name: "prev:crun-copies,shim-start", opts: prevOpts, setup: prev},
		{name: "after,crun-copies", opts: ctrd.Options{OCIRuntime: crunCopy}},
		{name: "after,shim-start-binary", opts: after, setup: func(rt *ctrd.Runtime) { ctrd.SetShimStart(rt, false) }},
		{name: "after,client-newtask", opts: after, setup: func(rt *ctrd.Runtime) { ctrd.SetClientNewTask(rt, true) }},
		{name: "after:crun,grouped", opts: after},
		{name: "after,no-seccomp", opts: after, setup: noSeccomp},
		{name: "after,no-agent", opts: after, setup: noAgent},
		{name: "ctr-run-d", run: func(b *testing.B, i int) time.Duration {
			id := fmt.Sprintf("ctr-cold-%d", i)
			ctr := func(args ...string) *exec.Cmd {
				return exec.Command("ctr", append([]string{"-a", srv.Address(), "-n", ctrd.DefaultNamespace}, args...)...)
			}
			t0 := time.Now()
			if out, err := ctr("run", "-d", ctrd.BaseImage, id, "/bin/sleep", "1000000").CombinedOutput(); err != nil {
				b.Fatalf("ctr run: %v: %s", err, out)
			}
			d := time.Since(t0)
			_ = ctr("task", "kill", "-s", "KILL", id).Run()
			for range 100 {
				if ctr("task", "delete", id).Run() == nil {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			if out, err := ctr("container", "delete", id).CombinedOutput(); err != nil {
				b.Fatalf("ctr container delete: %v: %s", err, out)
			}
			return d
		}},
	}
	// GAUNTLET_COLDSTART_VARIANTS (comma-separated name prefixes) narrows the run, e.g.
	// "before,after:,ctr" for a quick before/after pair with the ctr baseline.
	if only := os.Getenv("GAUNTLET_COLDSTART_VARIANTS"); only != "" {
		var keep []coldVariant
		for _, v := range variants {
			for _, p := range strings.Split(only, ",") {
				if p != "" && strings.HasPrefix(v.name, p) {
					keep = append(keep, v)
					break
				}
			}
		}
		variants = keep
		if len(variants) == 0 {
			b.Fatalf("GAUNTLET_COLDSTART_VARIANTS=%q matches no variant", only)
		}
	}
	type sample struct {
		total time.Duration
		ph    ctrd.Phases
	}
	samples := make([][]sample, len(variants))
	rts := make([]*ctrd.Runtime, len(variants))
	var last ctrd.Phases
	for i, v := range variants {
		if v.run != nil {
			continue
		}
		rt := openWith(b, srv, v.opts)
		b.Cleanup(func() { _ = rt.Close() })
		if v.setup != nil {
			v.setup(rt)
		}
		ctrd.SetPhaseHook(rt, func(p ctrd.Phases) { last = p })
		rts[i] = rt
	}
	// Grouped variants join a running shim, as they do in a pool; give each group a
	// resident sandbox so the measured one never starts the shim itself.
	for i, v := range variants {
		if rts[i] != nil && v.opts.SandboxesPerShim != 1 {
			mustCreate(b, rts[i], sandbox.Spec{})
		}
	}
	round := 0
	for b.Loop() {
		for k := range variants {
			i := (k + round) % len(variants)
			v := variants[i]
			if v.run != nil {
				samples[i] = append(samples[i], sample{total: v.run(b, round)})
				continue
			}
			t0 := time.Now()
			h, err := rts[i].Create(ctx, sandbox.Spec{})
			d := time.Since(t0)
			if err != nil {
				b.Fatalf("%s: %v", v.name, err)
			}
			samples[i] = append(samples[i], sample{total: d, ph: last})
			if err := rts[i].Destroy(ctx, h.ID); err != nil {
				b.Fatalf("%s: destroy: %v", v.name, err)
			}
		}
		round++
	}
	b.StopTimer()
	med := func(ds []time.Duration) time.Duration {
		slices.Sort(ds)
		return ds[len(ds)/2]
	}
	var report strings.Builder
	fmt.Fprintf(&report, "\n%-27s %9s %9s %9s %9s %9s %9s %9s %7s\n", "variant", "total", "min", "snapshot", "container", "new_task", "start", "agent", "ratio")
	base := time.Duration(0)
	for i, v := range variants {
		var tot, sn, ct, nt, st, ag []time.Duration
		for _, s := range samples[i] {
			tot, sn, ct, nt, st, ag = append(tot, s.total), append(sn, s.ph.Snapshot), append(ct, s.ph.Container), append(nt, s.ph.NewTask), append(st, s.ph.Start), append(ag, s.ph.Agent)
		}
		m := med(tot)
		if i == 0 {
			base = m
		}
		b.ReportMetric(float64(m.Microseconds())/1000, v.name+"-ms")
		ms := func(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d.Microseconds())/1000) }
		fmt.Fprintf(&report, "%-27s %9s %9s %9s %9s %9s %9s %9s %7.2f\n", v.name, ms(m), ms(tot[0]), ms(med(sn)), ms(med(ct)), ms(med(nt)), ms(med(st)), ms(med(ag)), float64(m)/float64(base))
	}
	b.Log(report.String())
}

// copyExecutable copies the file src to dst, mode 0755.
func copyExecutable(src, dst string) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, data, 0o755)
}

// openWith is open with the OCI runtime, shim grouping, namespace and agent binary of o.
func openWith(t testing.TB, srv *ctrdlocal.Server, o ctrd.Options) *ctrd.Runtime {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	bin := agentBinary
	if o.AgentBinary != "" {
		bin = o.AgentBinary
	}
	rt, err := ctrd.New(ctx, ctrd.Options{Address: srv.Address(), StateDir: t.TempDir(), AgentBinary: bin,
		OCIRuntime: o.OCIRuntime, SandboxesPerShim: o.SandboxesPerShim, Namespace: o.Namespace})
	if err != nil {
		t.Fatalf("open containerd runtime: %v", err)
	}
	return rt
}
