package ctrd_test

import (
	"context"
	"errors"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/tools"
)

// execOnly hides the runtime's WorkspaceDir so the toolbox uses its in-sandbox
// backend; the containerd runtime is underneath.
type execOnly struct{ sandbox.Runtime }

// TestToolsOnContainerd runs the workspace tools (package tools) on containerd
// sandboxes through both backends: host side through WorkspaceDir (/proc/PID/root)
// and in-sandbox scripts run by busybox. Traversal and symlink escapes are refused
// and reported, as are a command's refused mount, /dev/mem read and egress; the host's
// files stay untouched.
func TestToolsOnContainerd(t *testing.T) {
	_, rt := start(t)
	ctx := context.Background()
	for _, hostSide := range []bool{true, false} {
		name := map[bool]string{true: "host", false: "exec"}[hostSide]
		t.Run(name, func(t *testing.T) {
			h := mustCreate(t, rt, sandbox.Spec{Workspace: []sandbox.File{{Path: "src/a.txt", Data: []byte("one\ntwo\n")}}})
			var mu sync.Mutex
			var events []sandbox.EventKind
			var r sandbox.Runtime = rt
			if !hostSide {
				r = execOnly{rt}
			}
			tb := tools.New(r, h.ID, tools.Options{OnEvent: func(e sandbox.Event) {
				mu.Lock()
				events = append(events, e.Kind)
				mu.Unlock()
			}})
			if tb.HostSide() != hostSide {
				t.Fatalf("HostSide() = %v, want %v", tb.HostSide(), hostSide)
			}
			if b, err := tb.Read(ctx, "src/a.txt"); err != nil || string(b) != "one\ntwo\n" {
				t.Fatalf("read: %q, %v", b, err)
			}
			if err := tb.Write(ctx, "src/b.txt", []byte("new\n"), 0o644); err != nil {
				t.Fatalf("write: %v", err)
			}
			ents, err := tb.List(ctx, "src")
			if err != nil || len(ents) != 2 {
				t.Fatalf("list: %+v, %v", ents, err)
			}
			res := run(t, rt, h.ID, sh("cat src/b.txt; echo more >> src/b.txt; ln -s /etc/passwd passwd; ln -s / root", 10*time.Second))
			if res.ExitCode != 0 || string(res.Stdout) != "new\n" {
				t.Fatalf("inside after a tool write: exit %d %q %q", res.ExitCode, res.Stdout, res.Stderr)
			}
			if _, err := tb.Read(ctx, "../../etc/passwd"); !errors.Is(err, tools.ErrOutside) {
				t.Errorf("read ../../etc/passwd: got %v, want ErrOutside", err)
			}
			hostPasswd, _ := os.ReadFile("/etc/passwd")
			if b, err := tb.Read(ctx, "passwd"); !errors.Is(err, tools.ErrSymlink) {
				t.Errorf("read through a symlink: got %q, %v; want ErrSymlink", b, err)
			}
			if err := tb.Write(ctx, "root/tmp/planted-by-ctrd-test", []byte("x"), 0); !errors.Is(err, tools.ErrSymlink) {
				t.Errorf("write through a symlink to /: got %v, want ErrSymlink", err)
			}
			if after, _ := os.ReadFile("/etc/passwd"); string(after) != string(hostPasswd) {
				t.Fatal("host /etc/passwd changed")
			}
			if _, err := os.Stat("/tmp/planted-by-ctrd-test"); err == nil {
				t.Fatal("a file was planted in the host's /tmp")
			}
			// shell.exec forwards the sandbox's own safety events (package safety).
			if _, err := tb.Exec(ctx, tools.ExecArgs{Command: "mount -t tmpfs none /tmp; cat /dev/mem; nc -w 1 192.0.2.1 80 </dev/null; true"}); err != nil {
				t.Fatalf("shell.exec: %v", err)
			}
			mu.Lock()
			defer mu.Unlock()
			for _, k := range []sandbox.EventKind{tools.EventPathTraversal, tools.EventSymlink, sandbox.EventSyscallDenied, sandbox.EventDeviceAccess, sandbox.EventEgress} {
				if !slices.Contains(events, k) {
					t.Errorf("events %v, want %s", events, k)
				}
			}
		})
	}
}

// TestWorkspaceReplacedByALink: a command that replaces /workspace with a symlink to
// the container's / (its root may do that: it owns /) must not lead the host-side tools
// into the host's root, which /proc/PID/root/workspace would resolve to (an absolute
// link is followed from the host's root): WorkspaceDir refuses, and a tool neither lists
// nor writes the host's files.
func TestWorkspaceReplacedByALink(t *testing.T) {
	_, rt := start(t)
	ctx := context.Background()
	h := mustCreate(t, rt, sandbox.Spec{})
	res, err := rt.Exec(ctx, h.ID, sandbox.ExecRequest{Argv: []string{"sh", "-c", "cd / && rm -rf /workspace && ln -s / /workspace"}, Dir: "/"})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("replace the workspace: %v, %s", err, res.Stderr)
	}
	if dir, err := rt.WorkspaceDir(ctx, h.ID); err == nil {
		ents, _ := os.ReadDir(dir)
		t.Errorf("WorkspaceDir gave %s, which holds %d entries of the host's root", dir, len(ents))
	}
	var events []sandbox.EventKind
	tb := tools.New(rt, h.ID, tools.Options{OnEvent: func(e sandbox.Event) { events = append(events, e.Kind) }})
	if out, err := tb.Call(ctx, tools.FSList, []byte(`{"path":"."}`)); err == nil || !tools.AgentError(err) {
		t.Errorf("fs.list of the replaced workspace: %s, %v; want the agent's error", out, err)
	}
	if !slices.Contains(events, tools.EventSymlink) {
		t.Errorf("events %v lack %s", events, tools.EventSymlink)
	}
	canary := "gauntlet-escape-" + h.ID
	_, _ = tb.Call(ctx, tools.FSWrite, []byte(`{"path":"tmp/`+canary+`","content":"x"}`))
	if _, err := os.Stat("/tmp/" + canary); err == nil {
		_ = os.Remove("/tmp/" + canary)
		t.Errorf("fs.write reached the host's /tmp")
	}
}
