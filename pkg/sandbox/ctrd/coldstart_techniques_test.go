package ctrd_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/ctrd"
)

// parentPid is the parent of a sandbox's init: its shim.
func parentPid(t *testing.T, rt *ctrd.Runtime, id string) int {
	t.Helper()
	dir, err := rt.WorkspaceDir(context.Background(), id) // /proc/PID/root/workspace
	if err != nil {
		t.Fatal(err)
	}
	pid := strings.Split(dir, "/")[2]
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	ppid, err := strconv.Atoi(f[1])
	if err != nil {
		t.Fatal(err)
	}
	return ppid
}

// TestColdStartTechniques checks that the cold-start cuts are really in use by default:
// crun with the precompiled seccomp filter, and sandboxes sharing a shim (up to
// SandboxesPerShim), while SandboxesPerShim 1 gives each its own.
func TestColdStartTechniques(t *testing.T) {
	srv, rt := start(t)
	if got := filepath.Base(rt.OCIRuntime()); got != "crun" {
		t.Fatalf("OCI runtime %s, want crun (scripts/deps.sh installs it)", got)
	}
	a := mustCreate(t, rt, sandbox.Spec{})
	b := mustCreate(t, rt, sandbox.Spec{})
	if pa, pb := parentPid(t, rt, a.ID), parentPid(t, rt, b.ID); pa != pb {
		t.Fatalf("sandboxes have shims %d and %d, want one shared shim", pa, pb)
	}
	cfg, err := os.ReadFile(filepath.Join(srv.Dir(), "state", "io.containerd.runtime.v2.task", ctrd.DefaultNamespace, a.ID, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"run.oci.seccomp_bpf_data"`, `"io.containerd.runc.v2.group"`, `"ociVersion":"1.0.2"`, `"GOMAXPROCS=1"`} {
		if !strings.Contains(string(cfg), want) {
			t.Errorf("bundle config.json lacks %s", want)
		}
	}
	// The group's first sandbox was started by the real shim, whose answer the start
	// script kept; the second joined through the script, which wrote the same address
	// into its bundle as the shim would have.
	ctx := context.Background()
	cc, err := srv.Client(ctrd.DefaultNamespace)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	for _, id := range []string{a.ID, b.ID} {
		ctr, err := cc.LoadContainer(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		info, err := ctr.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if filepath.Base(info.Runtime.Name) != "containerd-shim-gauntlet-v2" {
			t.Errorf("sandbox %s runtime %q, want the shim start script", id, info.Runtime.Name)
		}
	}
	bundle := func(id string) string {
		return filepath.Join(srv.Dir(), "state", "io.containerd.runtime.v2.task", ctrd.DefaultNamespace, id)
	}
	started, err := os.ReadFile(filepath.Join(ctrd.SandboxDir(rt, a.ID), "shim-started-address"))
	if err != nil {
		t.Fatalf("the first sandbox's start did not go through the real shim: %v", err)
	}
	addrA, errA := os.ReadFile(filepath.Join(bundle(a.ID), "address"))
	addrB, errB := os.ReadFile(filepath.Join(bundle(b.ID), "address"))
	if errA != nil || errB != nil {
		t.Fatalf("bundle address files: %v, %v", errA, errB)
	}
	if string(addrA) != strings.TrimSpace(string(started)) || string(addrB) != string(addrA) || !strings.HasPrefix(string(addrA), "unix://") {
		t.Errorf("shim addresses: started %q, bundle a %q, bundle b %q; want one unix:// address", started, addrA, addrB)
	}
	if _, err := os.Stat(filepath.Join(ctrd.SandboxDir(rt, b.ID), "shim-address")); err != nil {
		t.Errorf("the second sandbox was not started by the script: %v", err)
	}
	res, err := rt.Exec(context.Background(), b.ID, sandbox.ExecRequest{Argv: []string{"sh", "-c", "grep -E '^(Seccomp|NoNewPrivs|CapEff):' /proc/self/status"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Seccomp:\t2", "NoNewPrivs:\t1", "CapEff:\t0000000000000000"} {
		if !strings.Contains(string(res.Stdout), want) {
			t.Errorf("sandbox status lacks %q:\n%s", want, res.Stdout)
		}
	}

	solo := openWith(t, srv, ctrd.Options{OCIRuntime: "runc", SandboxesPerShim: 1})
	defer solo.Close()
	c := mustCreate(t, solo, sandbox.Spec{})
	d := mustCreate(t, solo, sandbox.Spec{})
	if pc, pd := parentPid(t, solo, c.ID), parentPid(t, solo, d.ID); pc == pd {
		t.Fatalf("SandboxesPerShim 1: both sandboxes under shim %d", pc)
	}
	for _, id := range []string{c.ID, d.ID} {
		if r, err := solo.Exec(context.Background(), id, sandbox.ExecRequest{Argv: []string{"true"}}); err != nil || r.ExitCode != 0 {
			t.Fatalf("runc sandbox exec: %+v %v", r, err)
		}
	}
}

// TestJoiningADeadShimStartsANewOne kills the shim a group's sandboxes run under: the next
// sandbox, which would join that group through the start script, gets a new shim instead.
func TestJoiningADeadShimStartsANewOne(t *testing.T) {
	_, rt := start(t)
	a := mustCreate(t, rt, sandbox.Spec{})
	shim := parentPid(t, rt, a.ID)
	if err := syscall.Kill(shim, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for range 200 { // until the dead shim's socket refuses connections
		if err := syscall.Kill(shim, 0); err != nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	b := mustCreate(t, rt, sandbox.Spec{})
	if p := parentPid(t, rt, b.ID); p == shim {
		t.Fatalf("new sandbox under the killed shim %d", p)
	}
	res, err := rt.Exec(context.Background(), b.ID, sandbox.ExecRequest{Argv: []string{"echo", "ok"}})
	if err != nil || strings.TrimSpace(string(res.Stdout)) != "ok" {
		t.Fatalf("exec in the new sandbox: %+v %v", res, err)
	}
	// A third sandbox joins the new group through the script.
	c := mustCreate(t, rt, sandbox.Spec{})
	if pb, pc := parentPid(t, rt, b.ID), parentPid(t, rt, c.ID); pb != pc {
		t.Fatalf("sandboxes after the retry have shims %d and %d, want one", pb, pc)
	}
}

// TestGroupedSandboxesSurviveADaemonRestart restarts containerd under two sandboxes of one
// shim, the second started by the start script: the daemon finds both tasks again from their
// bundles (the script wrote the second's address file as the shim would have), and they
// can still be updated through it and destroyed.
func TestGroupedSandboxesSurviveADaemonRestart(t *testing.T) {
	srv, rt := start(t)
	a := mustCreate(t, rt, sandbox.Spec{})
	b := mustCreate(t, rt, sandbox.Spec{})
	if pa, pb := parentPid(t, rt, a.ID), parentPid(t, rt, b.ID); pa != pb {
		t.Fatalf("sandboxes have shims %d and %d, want one", pa, pb)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{a.ID, b.ID} {
		if err := rt.UpdateLimits(ctx, id, sandbox.Limits{MemoryBytes: 300 << 20}); err != nil {
			t.Fatalf("update %s through the restarted daemon: %v", id, err)
		}
		if res, err := rt.Exec(ctx, id, sandbox.ExecRequest{Argv: []string{"true"}}); err != nil || res.ExitCode != 0 {
			t.Fatalf("exec in %s: %+v %v", id, res, err)
		}
		if err := rt.Destroy(ctx, id); err != nil {
			t.Fatalf("destroy %s: %v", id, err)
		}
	}
	c := mustCreate(t, rt, sandbox.Spec{})
	if res, err := rt.Exec(ctx, c.ID, sandbox.ExecRequest{Argv: []string{"true"}}); err != nil || res.ExitCode != 0 {
		t.Fatalf("exec in a sandbox created after the restart: %+v %v", res, err)
	}
}
