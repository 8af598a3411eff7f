package boundary_test

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/catalogue"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/inject"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes/runtimestest"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/boundary"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/tools"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// The layer's behaviour inside an env (every kind, branches, the services' gateway) is
// tested through codefix, its first user; these tests hold what any sandboxed env relies
// on, with no env at all.

const profile = `name: layer
faults:
  - {id: full, kind: disk_full, match: {paths: ["/notes.txt"]}}
  - {id: cpu, kind: cpu_throttle, params: {cpu_fraction: 0.5}}
`

func injector(t *testing.T) *inject.Injector {
	t.Helper()
	cps, err := plans.CompileCustomProfiles([]*gauntletv1.CustomProfile{{Name: "layer", SpecYaml: profile}})
	if err != nil {
		t.Fatal(err)
	}
	plan, err := cps.Plan(5, "layer", []string{"sandbox"})
	if err != nil {
		t.Fatal(err)
	}
	in, err := inject.NewInjector(plan)
	if err != nil {
		t.Fatal(err)
	}
	return in
}

// bare hides the runtime's optional abilities (sandbox.LimitUpdater among them).
type bare struct{ sandbox.Runtime }

// TestLayerAppliesAndDetaches: on a real process sandbox, a layer opened from a plan
// records its resource faults for the first step, makes the file tools and the commands
// meet its storage faults as faults of the tool that met them, advances the episode's
// clock by nothing it did not ask for, and after Close leaves the sandbox as it was.
func TestLayerAppliesAndDetaches(t *testing.T) {
	ctx := context.Background()
	rt := runtimestest.Open(t, runtimes.Process, 0).Runtime()
	spec := sandbox.Spec{Limits: sandbox.Limits{MemoryBytes: 128 << 20, CPUMillis: 1000}}
	h, err := rt.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Destroy(ctx, h.ID)

	var clock time.Duration
	in := injector(t)
	l, err := boundary.Open(ctx, boundary.Options{Env: "test", Target: tools.Service, Runtime: rt, Sandbox: h.ID,
		Limits: spec.Limits, Faults: in, Clock: &clock})
	if err != nil {
		t.Fatal(err)
	}
	if amb := l.Ambient(); len(amb) != 1 || amb[0].GetKind() != catalogue.KindCPUThrottle || amb[0].GetTarget() != tools.Service {
		t.Errorf("ambient faults %v, want cpu_throttle on %s", amb, tools.Service)
	}
	tb := tools.New(rt, h.ID, tools.Options{Storage: l.Gate(), ExecEnv: l.ExecEnv})

	if err := l.Begin(ctx, tools.FSWrite, clock); err != nil {
		t.Fatal(err)
	}
	if err := tb.Write(ctx, "notes.txt", []byte("x"), 0); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("fs.write under disk_full: %v", err)
	}
	if f := l.Fired(); len(f) != 1 || f[0].GetTarget() != "sandbox/fs.write" || !strings.HasPrefix(f[0].GetDetail(), "create /notes.txt: ") {
		t.Errorf("the tool's faults: %v", f)
	}

	if err := l.Begin(ctx, tools.ShellExec, clock); err != nil {
		t.Fatal(err)
	}
	res, err := tb.Exec(ctx, tools.ExecArgs{Command: "echo x > notes.txt"})
	l.CommandDone(clock)
	if err != nil || res.ExitCode == 0 {
		t.Fatalf("a command under disk_full: %+v, %v", res, err)
	}
	if f := l.Fired(); len(f) != 1 || f[0].GetTarget() != "sandbox/shell.exec" {
		t.Errorf("the command's faults: %v", f)
	}
	if clock != 0 {
		t.Errorf("the clock moved by %v with no latency fault", clock)
	}

	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(ctx); err != nil {
		t.Fatalf("Close after Close: %v", err)
	}
	res, err = tools.New(rt, h.ID, tools.Options{}).Exec(ctx, tools.ExecArgs{Command: "echo x > notes.txt && grep -c ' fuse' /proc/self/mountinfo || true"})
	if err != nil || res.Stdout != "0\n" {
		t.Errorf("after Close: %q %q, %v", res.Stdout, res.Stderr, err)
	}
}

// TestLayerNeedsTheRuntimesAbilities: the runtime's abilities are found by type
// assertion, and a plan with resource faults on a runtime that cannot change limits is
// refused (sandbox.ErrUnsupported) rather than run without them.
func TestLayerNeedsTheRuntimesAbilities(t *testing.T) {
	ctx := context.Background()
	rt := runtimestest.Open(t, runtimes.Process, 0).Runtime()
	h, err := rt.Create(ctx, sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Destroy(ctx, h.ID)
	var clock time.Duration
	_, err = boundary.Open(ctx, boundary.Options{Env: "test", Target: tools.Service, Runtime: bare{rt}, Sandbox: h.ID,
		Faults: injector(t), Clock: &clock})
	if !errors.Is(err, sandbox.ErrUnsupported) || !strings.HasPrefix(err.Error(), "test: ") {
		t.Errorf("Open on a runtime without sandbox.LimitUpdater: %v", err)
	}
	l, err := boundary.Open(ctx, boundary.Options{Env: "test", Target: tools.Service, Runtime: bare{rt}, Sandbox: h.ID, Clock: &clock})
	if err != nil {
		t.Fatalf("Open without faults: %v", err)
	}
	if l.Gate() != nil || l.ExecEnv() != nil || len(l.Ambient()) != 0 || l.ServiceFaults() != nil {
		t.Error("a layer without faults applies some")
	}
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
}
