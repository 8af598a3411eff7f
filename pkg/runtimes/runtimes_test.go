package runtimes_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/env/codefix"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes/runtimestest"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/process"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/tools"
)

func TestConfigValidate(t *testing.T) {
	cases := []struct {
		c    runtimes.Config
		want string // "" for valid
	}{
		{runtimes.Config{}, ""},
		{runtimes.Config{Runtime: runtimes.Process, StateDir: "/x"}, ""},
		{runtimes.Config{Runtime: runtimes.Containerd, StateDir: "/x"}, ""},
		{runtimes.Config{Runtime: "docker", StateDir: "/x"}, `sandbox.runtime: "docker" is not one of`},
		{runtimes.Config{Runtime: runtimes.Process}, "sandbox.state-dir: must be set"},
		{runtimes.Config{Runtime: runtimes.Process, StateDir: "/x", Image: "host"}, ""},
		{runtimes.Config{Runtime: runtimes.Process, StateDir: "/x", Image: "alpine"}, `sandbox.image: "alpine": the process runtime`},
		{runtimes.Config{Runtime: runtimes.Containerd, StateDir: "/x", Image: "alpine"}, ""},
		{runtimes.Config{ImagePools: -1}, "sandbox.image-pools: -1 must be between 0"},
		{runtimes.Config{ImagePools: 5000}, "sandbox.image-pools: 5000 must be between 0"},
		{runtimes.Config{ImagePoolIdle: -time.Second}, "sandbox.image-pool-idle: -1s must not be negative"},
	}
	for _, tc := range cases {
		err := tc.c.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%+v: %v", tc.c, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%+v: error %v, want %q", tc.c, err, tc.want)
		}
	}
	if sb, err := runtimes.Open(context.Background(), runtimes.Config{}, nil); sb != nil || err != nil {
		t.Errorf("Open with no runtime = %v, %v; want nil, nil", sb, err)
	}
}

// TestRegisteredRuntime: a runtime is one Registration row: once registered, Validate
// accepts its name, runs its checks, and Open opens it; a second row of the same name is
// refused.
func TestRegisteredRuntime(t *testing.T) {
	const name = "process-again"
	opened := 0
	runtimes.Register(runtimes.Registration{
		Name: name,
		Open: func(_ context.Context, _ runtimes.Config, stateDir string, log *slog.Logger) (runtimes.Opened, error) {
			opened++
			rt, err := process.New(process.Config{StateDir: stateDir, Logger: log})
			return runtimes.Opened{Runtime: rt}, err
		},
		Validate: func(c runtimes.Config) []error {
			if c.PoolSize > 1 {
				return []error{errors.New("pool too large for " + name)}
			}
			return nil
		},
	})
	if !slices.Contains(runtimes.Names(), name) {
		t.Fatalf("Names() = %v, want %s among them", runtimes.Names(), name)
	}
	c := runtimestest.Config(t, runtimes.Process)
	c.Runtime, c.PoolSize = name, 2
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "pool too large") {
		t.Fatalf("Validate = %v, want the row's own check", err)
	}
	if err := (runtimes.Config{Runtime: "docker", StateDir: "/x"}).Validate(); err == nil || !strings.Contains(err.Error(), name) {
		t.Fatalf("Validate of an unknown runtime = %v, want the registered names listed", err)
	}
	c.PoolSize = 0
	sb, err := runtimes.Open(context.Background(), c, nil)
	if err != nil {
		t.Fatal(err)
	}
	if opened != 1 || sb.Runtime().Name() != runtimes.Process {
		t.Errorf("opened %d times, runtime %s", opened, sb.Runtime().Name())
	}
	if err := sb.Close(); err != nil {
		t.Error(err)
	}
	defer func() {
		if recover() == nil {
			t.Error("a second row named process did not panic")
		}
	}()
	runtimes.Register(runtimes.Registration{Name: runtimes.Process, Open: func(context.Context, runtimes.Config, string, *slog.Logger) (runtimes.Opened, error) {
		return runtimes.Opened{}, errors.New("never opened")
	}})
}

// TestPooledSandboxesStartClean: a sandbox from the warm pool gets exactly the files its
// spec seeds, and what one episode left in it is gone for the next.
func TestPooledSandboxesStartClean(t *testing.T) {
	sb := runtimestest.Open(t, runtimes.Process, 1)
	ctx := context.Background()
	tpl := codefix.New().(env.SandboxTemplater).SandboxTemplates()[0]
	spec := tpl
	spec.Workspace = []sandbox.File{{Path: "a/seed.txt", Data: []byte("seed\n")}}
	for round := 0; round < 2; round++ {
		h, err := sb.Acquire(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		tb := tools.New(sb.Runtime(), h.ID, tools.Options{})
		if b, err := tb.Read(ctx, "a/seed.txt"); err != nil || string(b) != "seed\n" {
			t.Fatalf("round %d: seeded file = %q, %v", round, b, err)
		}
		if _, err := tb.Read(ctx, "left-over"); !errors.Is(err, tools.ErrNotExist) {
			t.Fatalf("round %d: the previous episode's file is still there (err %v)", round, err)
		}
		if err := tb.Write(ctx, "left-over", []byte("x"), 0); err != nil {
			t.Fatal(err)
		}
		if err := sb.Release(ctx, h.ID); err != nil {
			t.Fatal(err)
		}
	}
	// A spec of another shape is made on demand and destroyed on release.
	other := spec
	other.Limits.MemoryBytes = 64 << 20
	h, err := sb.Acquire(ctx, other)
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Release(ctx, h.ID); err != nil {
		t.Fatal(err)
	}
	if err := sb.Release(ctx, h.ID); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("second release: %v, want ErrNotFound", err)
	}
	// So is a spec for another user: a warm sandbox runs its commands as the template's.
	other = spec
	other.User = "nobody"
	if h, err = sb.Acquire(ctx, other); err != nil {
		t.Fatal(err)
	}
	res, err := sb.Runtime().Exec(ctx, h.ID, sandbox.ExecRequest{Argv: []string{"id", "-u"}})
	if err != nil || string(res.Stdout) != "65534\n" {
		t.Errorf("a sandbox acquired for user nobody runs as %q (%v), want 65534", res.Stdout, err)
	}
	if err := sb.Release(ctx, h.ID); err != nil {
		t.Fatal(err)
	}
}

// TestImagesGetWarmPools: a spec on an image of its own (a task's image, which no env's
// template knows; here the process runtime's "host" root, another image than the
// configured one) gets a template of that image in the pool on its first acquire: that
// sandbox and the next ones come from the pool, each with exactly its spec's files. A
// spec of another shape on the same image is made on demand.
func TestImagesGetWarmPools(t *testing.T) {
	sb := runtimestest.Open(t, runtimes.Process, 1)
	ctx := context.Background()
	spec := sandbox.Spec{Template: "task", Image: "host", Workspace: []sandbox.File{{Path: "seed.txt", Data: []byte("seed\n")}}}
	pooled := func(round int) sandbox.Handle {
		t.Helper()
		h, err := sb.Acquire(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		if h.Spec.Template != "task@host" {
			t.Fatalf("round %d: a sandbox of template %q, want one of the image's pool template task@host", round, h.Spec.Template)
		}
		tb := tools.New(sb.Runtime(), h.ID, tools.Options{})
		if b, err := tb.Read(ctx, "seed.txt"); err != nil || string(b) != "seed\n" {
			t.Fatalf("round %d: seeded file = %q, %v", round, b, err)
		}
		if _, err := tb.Read(ctx, "left-over"); !errors.Is(err, tools.ErrNotExist) {
			t.Fatalf("round %d: the previous episode's file is still there (err %v)", round, err)
		}
		if err := tb.Write(ctx, "left-over", []byte("x"), 0); err != nil {
			t.Fatal(err)
		}
		return h
	}
	first := pooled(0)
	// The pool fills the new template beside the leased sandbox.
	deadline := time.Now().Add(30 * time.Second)
	for {
		hs, err := sb.Runtime().List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, h := range hs {
			if h.Spec.Template == "task@host" && h.ID != first.ID {
				n++
			}
		}
		if n >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no warm sandbox of template task@host after 30 s (%d sandboxes)", len(hs))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := sb.Release(ctx, first.ID); err != nil {
		t.Fatal(err)
	}
	for round := 1; round < 3; round++ {
		if err := sb.Release(ctx, pooled(round).ID); err != nil {
			t.Fatal(err)
		}
	}
	other := spec
	other.Limits.MemoryBytes = 64 << 20
	h, err := sb.Acquire(ctx, other)
	if err != nil {
		t.Fatal(err)
	}
	if h.Spec.Template != "task" {
		t.Errorf("a spec of another shape got a sandbox of template %q, want one made on demand", h.Spec.Template)
	}
	if err := sb.Release(ctx, h.ID); err != nil {
		t.Fatal(err)
	}
}

// TestImagePoolsGiveWayWhenIdle: with room for two image pools, a third image gets
// sandboxes made on demand while both pools are in use; once one has gone idle, the
// least lately used one gives way (its sandboxes destroyed) and the third image gets its
// pool. Three templates on the process runtime's "host" image stand for three task
// images: the pool is made per template and image.
func TestImagePoolsGiveWayWhenIdle(t *testing.T) {
	c := runtimestest.Config(t, runtimes.Process)
	c.PoolSize, c.ImagePools, c.ImagePoolIdle = 1, 2, 300*time.Millisecond
	sb := runtimestest.OpenConfig(t, c)
	ctx := context.Background()
	acquire := func(task string) sandbox.Handle {
		t.Helper()
		h, err := sb.Acquire(ctx, sandbox.Spec{Template: task, Image: "host"})
		if err != nil {
			t.Fatal(err)
		}
		if err := sb.Release(ctx, h.ID); err != nil {
			t.Fatal(err)
		}
		return h
	}
	of := func(template string) int {
		t.Helper()
		hs, err := sb.Runtime().List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, h := range hs {
			if h.Spec.Template == template {
				n++
			}
		}
		return n
	}
	acquire("a")
	acquire("b")
	if h := acquire("c"); h.Spec.Template != "c" {
		t.Fatalf("a third image while two pools are fresh got a sandbox of %q, want one made on demand", h.Spec.Template)
	}
	time.Sleep(2 * c.ImagePoolIdle)
	acquire("b") // b is used again: a is the one least lately used
	if h := acquire("c"); h.Spec.Template != "c@host" {
		t.Fatalf("the third image after a went idle got a sandbox of %q, want one of its own pool c@host", h.Spec.Template)
	}
	for deadline := time.Now().Add(30 * time.Second); of("a@host") > 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("a@host still has %d sandboxes 30 s after its pool gave way", of("a@host"))
		}
	}
	if h := acquire("b"); h.Spec.Template != "b@host" {
		t.Errorf("b, used lately, lost its pool: a sandbox of %q", h.Spec.Template)
	}
}

// TestOpenReapsLeftovers: sandboxes a crashed worker left in the state directory are
// destroyed by the next Open.
func TestOpenReapsLeftovers(t *testing.T) {
	ctx := context.Background()
	c := runtimestest.Config(t, runtimes.Process)
	first, err := runtimes.Open(ctx, c, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := first.Acquire(ctx, sandbox.Spec{}); err != nil {
		t.Fatal(err)
	}
	if err := first.Close(); err != nil { // the sandbox stays, as after a crash
		t.Fatal(err)
	}
	second, err := runtimes.Open(ctx, c, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	if hs, err := second.Runtime().List(ctx); err != nil || len(hs) != 0 {
		t.Errorf("after Open: %d sandboxes left (%v), want 0", len(hs), err)
	}
}

// TestOpenDeletesLeftoverSnapshots: snapshots a crashed process left in the state
// directory (a warm pool's template snapshot, an episode's branch point) are deleted by the
// next Open, so restarts do not pile up one snapshot file (and its layers) each.
func TestOpenDeletesLeftoverSnapshots(t *testing.T) {
	ctx := context.Background()
	c := runtimestest.Config(t, runtimes.Process)
	for i := range 3 {
		s, err := runtimes.Open(ctx, c, nil)
		if err != nil {
			t.Fatal(err)
		}
		h, err := s.Acquire(ctx, sandbox.Spec{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Runtime().(sandbox.Snapshotter).Snapshot(ctx, h.ID); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil { // sandbox and snapshot stay, as after a crash
			t.Fatal(err)
		}
		if n := len(snapshotFiles(t, c.StateDir)); n > 1 {
			t.Fatalf("after %d restarts: %d snapshot files, want at most the last process's one", i, n)
		}
	}
	s, err := runtimes.Open(ctx, c, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := snapshotFiles(t, c.StateDir); len(got) != 0 {
		t.Errorf("after Open: snapshot files %q, want none", got)
	}
	if l, ok := s.Runtime().(sandbox.SnapshotLister); !ok {
		t.Errorf("the process runtime does not list its snapshots")
	} else if got, err := l.ListSnapshots(ctx); err != nil || len(got) != 0 {
		t.Errorf("after Open: snapshots %v (%v), want none", got, err)
	}
}

// snapshotFiles lists the snapshot records in a process runtime's state directory.
func snapshotFiles(t *testing.T, stateDir string) []string {
	t.Helper()
	es, err := os.ReadDir(filepath.Join(stateDir, "snapshots"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	return out
}
