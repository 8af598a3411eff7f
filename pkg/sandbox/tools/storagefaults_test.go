package tools_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/faults"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/faultfs"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes/runtimestest"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/tools"
)

// storageSpec targets one storage fault at each directory of the workspace, and a coin
// flip (disk_full with probability 0.5) at coin/.
const storageSpec = `name: bad-disk
faults:
  - {id: full, kind: disk_full, match: {paths: ["/full/*"]}}
  - {id: ro, kind: read_only, match: {paths: ["/ro/*"]}}
  - {id: fds, kind: too_many_open_files, match: {paths: ["/many/*"]}}
  - {id: short, kind: short_write, match: {paths: ["/short/*"]}, params: {keep_fraction: 0.25}}
  - {id: slow, kind: io_latency, match: {paths: ["/slow/*"]}, params: {mean_ms: 150, jitter_ms: 0}}
  - {id: coin, kind: disk_full, probability: 0.5, match: {paths: ["/coin/*"]}}
`

// TestStorageFaultsReachTheTools: with a faultfs.Gate in the toolbox, the
// agent's fs tools meet each storage fault on both real runtimes and through both
// backends (host side and in-sandbox scripts), with the error the kernel would give; and
// the same seed and the same calls fire exactly the same faults everywhere.
func TestStorageFaultsReachTheTools(t *testing.T) {
	_, rules, err := faults.ParseSpec([]byte(storageSpec))
	if err != nil {
		t.Fatal(err)
	}
	var traces [][]string
	var names []string
	for _, rtName := range []string{runtimes.Process, runtimes.Containerd} {
		sb := runtimestest.Open(t, rtName, 0)
		for _, hostSide := range []bool{true, false} {
			name := rtName + map[bool]string{true: "/host", false: "/exec"}[hostSide]
			t.Run(name, func(t *testing.T) {
				traces = append(traces, storageRun(t, sb.Runtime(), hostSide, rules))
				names = append(names, name)
			})
		}
	}
	if len(traces) != 4 {
		t.Fatalf("%d of 4 runs finished", len(traces))
	}
	for i := 1; i < len(traces); i++ {
		if !slices.Equal(traces[0], traces[i]) {
			t.Errorf("fired faults differ between %s and %s:\n%s\n---\n%s", names[0], names[i], strings.Join(traces[0], "\n"), strings.Join(traces[i], "\n"))
		}
	}
	coin := 0
	for _, f := range traces[0] {
		if strings.Contains(f, " coin ") {
			coin++
		}
	}
	if coin == 0 || coin == 12 {
		t.Errorf("the coin (disk_full, probability 0.5) fired on %d of 12 writes", coin)
	}
	t.Logf("every run fired the same %d faults (coin: %d of 12)", len(traces[0]), coin)
}

func storageRun(t *testing.T, rt sandbox.Runtime, hostSide bool, rules []faults.Rule) []string {
	ctx := context.Background()
	h, err := rt.Create(ctx, sandbox.Spec{Workspace: []sandbox.File{
		{Path: "ro/keep.txt", Data: []byte("keep\n")},
		{Path: "many/a.txt", Data: []byte("a\n")},
		{Path: "slow/a.txt", Data: []byte("slow\n")},
		{Path: "ok.txt", Data: []byte("fine\n")},
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rt.Destroy(context.Background(), h.ID) })
	var mu sync.Mutex
	var trace []string
	gate := faultfs.NewGate(faults.NewDecider(42, rules), func(key string, ev faults.Event, fired []faults.Fired) {
		mu.Lock()
		defer mu.Unlock()
		for _, f := range fired {
			trace = append(trace, fmt.Sprintf("%s %s %s %s", key, ev.Op, f.RuleID, f.Detail))
		}
	}, nil)
	r := rt
	if !hostSide {
		r = execOnly{rt}
	}
	rec := &recorder{}
	tb := tools.New(r, h.ID, tools.Options{Storage: gate, OnEvent: rec.add})
	if tb.HostSide() != hostSide {
		t.Fatalf("HostSide() = %v, want %v", tb.HostSide(), hostSide)
	}
	agentErr := func(what string, err error, errno error, text string) {
		t.Helper()
		switch {
		case err == nil:
			t.Fatalf("%s: no error, want %v", what, errno)
		case !errors.Is(err, errno):
			t.Fatalf("%s: %v, want %v", what, err, errno)
		case !tools.AgentError(err):
			t.Fatalf("%s: %v is not an agent error", what, err)
		case err.Error() != text:
			t.Fatalf("%s: error %q, want %q", what, err, text)
		}
	}

	// disk_full: the write fails before anything is created.
	err = tb.Write(ctx, "full/notes.txt", []byte("hello\n"), 0)
	agentErr("disk_full", err, syscall.ENOSPC, "fs.write: create full/notes.txt: no space left on device")
	if _, err := tb.Read(ctx, "full/notes.txt"); !errors.Is(err, tools.ErrNotExist) {
		t.Fatalf("after ENOSPC the file exists: %v", err)
	}
	// read_only: writes and patches fail, reads work, the file is unchanged.
	agentErr("read_only write", tb.Write(ctx, "ro/keep.txt", []byte("changed\n"), 0), syscall.EROFS,
		"fs.write: write ro/keep.txt: read-only file system")
	err = tb.Patch(ctx, "ro/keep.txt", []tools.Edit{{Old: "keep", New: "lost"}})
	if !errors.Is(err, syscall.EROFS) || !tools.AgentError(err) {
		t.Fatalf("read_only patch: %v", err)
	}
	if b, err := tb.Read(ctx, "ro/keep.txt"); err != nil || string(b) != "keep\n" {
		t.Fatalf("read-only file: %q, %v", b, err)
	}
	// too_many_open_files: opening fails.
	_, err = tb.Read(ctx, "many/a.txt")
	agentErr("too_many_open_files", err, syscall.EMFILE, "fs.read: open many/a.txt: too many open files")
	// short_write: a quarter of the bytes land, the call says so.
	err = tb.Write(ctx, "short/a.txt", []byte("12345678"), 0)
	agentErr("short_write", err, io.ErrShortWrite, "fs.write: write short/a.txt: short write")
	if b, err := tb.Read(ctx, "short/a.txt"); err != nil || string(b) != "12" {
		t.Fatalf("after a short write the file holds %q (%v), want %q", b, err, "12")
	}
	// io_latency: open and read each wait 150 ms (the gate sleeps on the wall clock).
	start := time.Now()
	if b, err := tb.Read(ctx, "slow/a.txt"); err != nil || string(b) != "slow\n" {
		t.Fatalf("slow read: %q, %v", b, err)
	}
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Fatalf("slow read took %v, want at least 2 × 150 ms", d)
	}
	// Paths no fault matches work as usual.
	if err := tb.Write(ctx, "ok.txt", []byte("still fine\n"), 0); err != nil {
		t.Fatal(err)
	}
	// A symlink planted where disk_full applies is refused as a symlink, and recorded as
	// a safety event, not hidden behind the injected fault.
	if res, err := tb.Exec(ctx, tools.ExecArgs{Command: "mkdir -p full && ln -s /etc/passwd full/link"}); err != nil || res.ExitCode != 0 {
		t.Fatalf("plant symlink: %+v, %v", res, err)
	}
	if err := tb.Write(ctx, "full/link", []byte("x"), 0); !errors.Is(err, tools.ErrSymlink) || !rec.has(tools.EventSymlink) {
		t.Fatalf("write through a planted symlink: %v (symlink event recorded: %v)", err, rec.has(tools.EventSymlink))
	}
	// A coin flip per write: which ones fail is the seed's.
	for i := 0; i < 12; i++ {
		err := tb.Write(ctx, fmt.Sprintf("coin/%d.txt", i%3), []byte("x"), 0)
		if err != nil && !errors.Is(err, syscall.ENOSPC) {
			t.Fatalf("coin write %d: %v", i, err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	return slices.Clone(trace)
}
