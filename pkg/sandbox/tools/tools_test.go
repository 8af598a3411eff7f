package tools_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/process"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/sandboxtest"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/tools"
)

// execOnly hides the runtime's optional abilities so the toolbox must use its in-sandbox
// backend; it is the real process runtime underneath.
type execOnly struct{ sandbox.Runtime }

type fixture struct {
	rt  *process.Runtime
	id  string
	ws  string
	tb  *tools.Toolbox
	rec *sandboxtest.EventLog
}

func setup(t *testing.T, hostSide bool) *fixture {
	t.Helper()
	rt, err := process.New(process.Config{StateDir: t.TempDir()})
	if err != nil {
		t.Fatalf("process runtime unavailable: %v", err)
	}
	t.Cleanup(func() {
		_ = rt.Purge(context.Background())
		rt.Close()
	})
	h, err := rt.Create(context.Background(), sandbox.Spec{Workspace: []sandbox.File{
		{Path: "src/main.go", Data: []byte("package main\n\nfunc add(a, b int) int { return a - b }\n")},
	}})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	t.Cleanup(func() { rt.Destroy(context.Background(), h.ID) })
	ws, err := rt.WorkspaceDir(context.Background(), h.ID)
	if err != nil {
		t.Fatal(err)
	}
	rec := &sandboxtest.EventLog{}
	var r sandbox.Runtime = rt
	if !hostSide {
		r = execOnly{rt}
	}
	tb := tools.New(r, h.ID, tools.Options{OnEvent: rec.Add, MaxFileBytes: 1 << 16})
	if tb.HostSide() != hostSide {
		t.Fatalf("HostSide() = %v, want %v", tb.HostSide(), hostSide)
	}
	return &fixture{rt: rt, id: h.ID, ws: ws, tb: tb, rec: rec}
}

func (f *fixture) sh(t *testing.T, script string) string {
	t.Helper()
	res, err := f.rt.Exec(context.Background(), f.id, sandbox.ExecRequest{Argv: []string{"sh", "-c", script}})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("%q: %v exit %d stderr %q", script, err, res.ExitCode, res.Stderr)
	}
	return string(res.Stdout)
}

func backends(t *testing.T, f func(t *testing.T, fx *fixture)) {
	for _, host := range []bool{true, false} {
		name := "exec"
		if host {
			name = "host"
		}
		t.Run(name, func(t *testing.T) { f(t, setup(t, host)) })
	}
}

func TestFileTools(t *testing.T) {
	backends(t, func(t *testing.T, fx *fixture) {
		ctx := context.Background()
		b, err := fx.tb.Read(ctx, "src/main.go")
		if err != nil || !strings.Contains(string(b), "return a - b") {
			t.Fatalf("read: %q, %v", b, err)
		}
		if _, err := fx.tb.Read(ctx, "/workspace/src/main.go"); err != nil {
			t.Fatalf("read by absolute workspace path: %v", err)
		}
		if err := fx.tb.Write(ctx, "new/deep/file.txt", []byte("hello"), 0o600); err != nil {
			t.Fatalf("write: %v", err)
		}
		// The sandbox user owns what the tools create: it can append and remove.
		if got := fx.sh(t, "echo more >> new/deep/file.txt; cat new/deep/file.txt; stat -c %a new/deep/file.txt; touch new/deep/x"); got != "hellomore\n600\n" {
			t.Fatalf("inside after write: %q", got)
		}
		if err := fx.tb.Write(ctx, "new/deep/file.txt", []byte("replaced"), 0); err != nil {
			t.Fatalf("overwrite: %v", err)
		}
		if got := fx.sh(t, "cat new/deep/file.txt"); got != "replaced" {
			t.Fatalf("overwrite: %q", got)
		}
		if err := fx.tb.Patch(ctx, "src/main.go", []tools.Edit{{Old: "a - b", New: "a + b"}}); err != nil {
			t.Fatalf("patch: %v", err)
		}
		if got := fx.sh(t, "grep -c 'a + b' src/main.go"); got != "1\n" {
			t.Fatalf("patched file: %q", got)
		}
		for _, edits := range [][]tools.Edit{{{Old: "not there", New: "x"}}, {{Old: "a", New: "b"}}} {
			if err := fx.tb.Patch(ctx, "src/main.go", edits); !errors.Is(err, tools.ErrPatch) {
				t.Fatalf("patch %v: got %v, want ErrPatch", edits, err)
			}
		}
		es, err := fx.tb.List(ctx, ".")
		if err != nil {
			t.Fatalf("list: %v", err)
		}
		var names []string
		for _, e := range es {
			names = append(names, e.Name+":"+e.Type)
		}
		if !slices.Equal(names, []string{"new:dir", "src:dir"}) {
			t.Fatalf("list: %v", names)
		}
		if _, err := fx.tb.Read(ctx, "missing"); !errors.Is(err, tools.ErrNotExist) {
			t.Fatalf("read missing: %v", err)
		}
		if _, err := fx.tb.Read(ctx, "src"); !errors.Is(err, tools.ErrIsDir) {
			t.Fatalf("read dir: %v", err)
		}
		fx.sh(t, "head -c 70000 /dev/zero > big")
		_, err = fx.tb.Read(ctx, "big")
		if !errors.Is(err, tools.ErrTooLarge) {
			t.Fatalf("read big: %v", err)
		}
		if !tools.AgentError(err) {
			t.Fatalf("AgentError(%v) = false", err)
		}
	})
}

func TestPathTraversalRefused(t *testing.T) {
	backends(t, func(t *testing.T, fx *fixture) {
		ctx := context.Background()
		for _, p := range []string{"../x", "a/../../x", "/etc/passwd", "/workspace/../etc/passwd", "/"} {
			if _, err := fx.tb.Read(ctx, p); !errors.Is(err, tools.ErrOutside) {
				t.Errorf("read %q: got %v, want ErrOutside", p, err)
			}
			if err := fx.tb.Write(ctx, p, []byte("x"), 0); !errors.Is(err, tools.ErrOutside) {
				t.Errorf("write %q: got %v, want ErrOutside", p, err)
			}
		}
		if !fx.rec.Has(tools.EventPathTraversal) {
			t.Fatalf("no %s event recorded: %v", tools.EventPathTraversal, fx.rec.Events())
		}
	})
}

func TestSymlinkEscapeRefused(t *testing.T) {
	backends(t, func(t *testing.T, fx *fixture) {
		ctx := context.Background()
		// The sandbox plants links that point out of the workspace; on the host side they
		// would resolve against the host's root.
		fx.sh(t, "ln -s /etc/passwd passwd; ln -s / root; ln -s .. up; mkdir d; ln -s ../src d/src")
		hostPasswd, _ := os.ReadFile("/etc/passwd")
		for _, p := range []string{"passwd", "root/etc/passwd", "up/x", "d/src/main.go"} {
			b, err := fx.tb.Read(ctx, p)
			if !errors.Is(err, tools.ErrSymlink) {
				t.Errorf("read %q: got %q, %v; want ErrSymlink", p, b, err)
			}
		}
		for _, p := range []string{"passwd", "root/tmp/planted", "up/planted"} {
			if err := fx.tb.Write(ctx, p, []byte("pwned"), 0); !errors.Is(err, tools.ErrSymlink) {
				t.Errorf("write %q: got %v, want ErrSymlink", p, err)
			}
		}
		if _, err := fx.tb.List(ctx, "root"); !errors.Is(err, tools.ErrSymlink) && !errors.Is(err, tools.ErrNotDir) {
			t.Errorf("list through symlink: got %v", err)
		}
		if after, _ := os.ReadFile("/etc/passwd"); string(after) != string(hostPasswd) {
			t.Fatal("host /etc/passwd changed")
		}
		if _, err := os.Stat("/tmp/planted"); err == nil {
			t.Fatal("a file was planted in the host's /tmp")
		}
		if !fx.rec.Has(tools.EventSymlink) {
			t.Fatalf("no %s event recorded: %v", tools.EventSymlink, fx.rec.Events())
		}
	})
}

func TestDeviceFilesRefused(t *testing.T) {
	backends(t, func(t *testing.T, fx *fixture) {
		ctx := context.Background()
		// A FIFO the sandbox made (opening it for reading would block forever) and a
		// device node planted from the host, standing for one smuggled in a layer.
		fx.sh(t, "mkfifo fifo")
		if err := unix.Mknod(filepath.Join(fx.ws, "mem"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 1))); err != nil {
			t.Fatalf("mknod: %v", err)
		}
		for _, p := range []string{"fifo", "mem"} {
			if b, err := fx.tb.Read(ctx, p); !errors.Is(err, tools.ErrSpecialFile) {
				t.Errorf("read %q: got %d bytes, %v; want ErrSpecialFile", p, len(b), err)
			}
			if err := fx.tb.Write(ctx, p, []byte("x"), 0); !errors.Is(err, tools.ErrSpecialFile) {
				t.Errorf("write %q: got %v, want ErrSpecialFile", p, err)
			}
		}
		if !fx.rec.Has(tools.EventSpecialFile) {
			t.Fatalf("no %s event recorded: %v", tools.EventSpecialFile, fx.rec.Events())
		}
		es, err := fx.tb.List(ctx, ".")
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range es {
			if (e.Name == "fifo" || e.Name == "mem") && e.Type != "other" {
				t.Errorf("list %s: type %q, want other", e.Name, e.Type)
			}
		}
	})
}

func TestShellExecAndCall(t *testing.T) {
	fx := setup(t, true)
	ctx := context.Background()
	res, err := fx.tb.Exec(ctx, tools.ExecArgs{Command: "cd src && ls; echo oops >&2; exit 4"})
	if err != nil || res.ExitCode != 4 || res.Stdout != "main.go\n" || res.Stderr != "oops\n" {
		t.Fatalf("exec: %+v, %v", res, err)
	}
	res, err = fx.tb.Exec(ctx, tools.ExecArgs{Command: "while :; do :; done", TimeoutMS: 200})
	if err != nil || !res.TimedOut {
		t.Fatalf("timeout: %+v, %v", res, err)
	}
	if !fx.rec.Has(sandbox.EventTimeout) {
		t.Fatalf("timeout not reported as an event")
	}
	out, err := fx.tb.Call(ctx, tools.FSWrite, json.RawMessage(`{"path":"a.txt","content":"x"}`))
	if err != nil || string(out) != `{"ok":true}` {
		t.Fatalf("call fs.write: %s, %v", out, err)
	}
	out, err = fx.tb.Call(ctx, tools.FSRead, json.RawMessage(`{"path":"a.txt"}`))
	if err != nil || string(out) != `{"content":"x"}` {
		t.Fatalf("call fs.read: %s, %v", out, err)
	}
	if _, err := fx.tb.Call(ctx, "fs.delete", json.RawMessage(`{}`)); !errors.Is(err, tools.ErrBadArgs) {
		t.Fatalf("unknown tool: %v", err)
	}
	if _, err := fx.tb.Call(ctx, tools.FSRead, json.RawMessage(`{"path":"a.txt","extra":1}`)); !errors.Is(err, tools.ErrBadArgs) {
		t.Fatalf("unknown field: %v", err)
	}
	for _, s := range tools.Specs() {
		if !json.Valid(s.Schema) {
			t.Errorf("%s: invalid schema", s.Name)
		}
	}
}
