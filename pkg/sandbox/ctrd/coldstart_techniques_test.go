package ctrd_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

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
	for _, want := range []string{`"run.oci.seccomp_bpf_data"`, `"io.containerd.runc.v2.group"`, `"ociVersion":"1.0.2"`} {
		if !strings.Contains(string(cfg), want) {
			t.Errorf("bundle config.json lacks %s", want)
		}
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
