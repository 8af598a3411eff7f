package ctrd_test

import (
	"context"
	"errors"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
)

// TestLinks: a spec's links are symlinks at the root into workspace folders, which
// exist; a fork keeps them and the workspace, but not what the sandbox wrote elsewhere in
// its root (a snapshot is of the workspace); a link that would hide the image's own file
// is refused.
func TestLinks(t *testing.T) {
	_, rt := start(t)
	ctx := context.Background()
	run := func(id, cmd string) string {
		t.Helper()
		res, err := rt.Exec(ctx, id, sandbox.ExecRequest{Argv: []string{"sh", "-c", cmd}})
		if err != nil {
			t.Fatal(err)
		}
		return string(res.Stdout) + string(res.Stderr)
	}
	h := mustCreate(t, rt, sandbox.Spec{Links: map[string]string{"/app": "app", "/logs": "x/logs"}, Workspace: []sandbox.File{{Path: "app/a.txt", Data: []byte("a\n")}}})
	if got, want := run(h.ID, "readlink /app; readlink /logs; cat /app/a.txt; ls -d /workspace/x/logs"), "/workspace/app\n/workspace/x/logs\na\n/workspace/x/logs\n"; got != want {
		t.Errorf("in the sandbox: %q, want %q", got, want)
	}
	run(h.ID, "echo b > /app/b.txt; echo planted > /etc/planted; mkdir -p /opt && echo o > /opt/o")
	snap, err := rt.Snapshot(ctx, h.ID)
	if err != nil {
		t.Fatal(err)
	}
	f, err := rt.Fork(ctx, snap.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Destroy(ctx, f.ID)
	if got, want := run(f.ID, "readlink /app; cat /app/a.txt /app/b.txt; ls /etc/planted /opt/o 2>&1 | grep -c 'No such file'"), "/workspace/app\na\nb\n2\n"; got != want {
		t.Errorf("in the fork: %q, want %q (the links and the workspace, nothing else the sandbox wrote)", got, want)
	}
	if _, err := rt.Create(ctx, sandbox.Spec{Links: map[string]string{"/.gauntlet": "x"}}); !errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("a link over the folder of the agent: %v, want ErrInvalid", err)
	}
}
