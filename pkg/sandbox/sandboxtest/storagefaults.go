package sandboxtest

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

	"github.com/gauntlet-rl/gauntlet/pkg/faults/catalogue"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/faultfs"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/inject"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/tools"
)

// The storage-fault suite: the one place that checks that storage faults reach what the
// agent does in a sandbox of a real runtime, through the file tools (a faultfs.Gate in
// the toolbox, on both of its backends) and through commands (the runtime's
// sandbox.StorageFaulter layer), with the error the kernel would give, and that the
// same seed and the same calls fire the same faults. A package that opens runtimes runs
// it on each and compares the traces StorageFaults returns, so every runtime fires
// exactly the same faults.

// toolStorageSpec targets one storage fault at each directory of the workspace, and a
// coin flip (disk_full with probability 0.5) at coin/.
const toolStorageSpec = `name: bad-disk
faults:
  - {id: full, kind: disk_full, match: {paths: ["/full/*"]}}
  - {id: ro, kind: read_only, match: {paths: ["/ro/*"]}}
  - {id: fds, kind: too_many_open_files, match: {paths: ["/many/*"]}}
  - {id: short, kind: short_write, match: {paths: ["/short/*"]}, params: {keep_fraction: 0.25}}
  - {id: slow, kind: io_latency, match: {paths: ["/slow/*"]}, params: {mean_ms: 150, jitter_ms: 0}}
  - {id: coin, kind: disk_full, probability: 0.5, match: {paths: ["/coin/*"]}}
`

// commandStorageSpec is the storage faults the suite's commands meet.
const commandStorageSpec = `name: bad-disk
faults:
  - {id: full, kind: disk_full, match: {paths: ["/full/*"]}}
  - {id: ro, kind: read_only, match: {paths: ["/ro/*"]}}
  - {id: slow, kind: io_latency, match: {paths: ["/slow/*"], ops: [read]}, params: {mean_ms: 150, jitter_ms: 0}}
  - {id: coin, kind: disk_full, probability: 0.5, match: {paths: ["/coin/*"]}}
`

// StorageTrace is what fired in the storage-fault suite on one runtime, for comparing
// runtimes: the same seed and calls must fire the same faults everywhere.
type StorageTrace struct {
	// Tools is what the file tools met, through the host-side backend and through the
	// in-sandbox one (equal to each other, or the suite failed).
	Tools []string
	// Commands is what the agent's commands met (nil for a runtime that is no
	// sandbox.StorageFaulter).
	Commands []string
}

// StorageFaults runs the storage-fault suite against rt, each part a subtest; the
// commands' part runs when rt is a sandbox.StorageFaulter. It returns what fired.
func StorageFaults(t *testing.T, rt sandbox.Runtime, opts ...Option) StorageTrace {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	var out StorageTrace
	_, rules, err := plans.ParseSpec([]byte(toolStorageSpec))
	if err != nil {
		t.Fatal(err)
	}
	var traces [2][]string
	for i, hostSide := range []bool{true, false} {
		t.Run("Tools/"+map[bool]string{true: "host", false: "exec"}[hostSide], func(t *testing.T) {
			traces[i] = toolStorageRun(t, rt, o, hostSide, rules)
		})
	}
	switch {
	case traces[0] == nil || traces[1] == nil:
		t.Error("a run of the file tools did not finish")
	case !slices.Equal(traces[0], traces[1]):
		t.Errorf("fired faults differ between the host-side and the in-sandbox tools:\n%s\n---\n%s", strings.Join(traces[0], "\n"), strings.Join(traces[1], "\n"))
	default:
		coin := 0
		for _, f := range traces[0] {
			if strings.Contains(f, " coin ") {
				coin++
			}
		}
		if coin == 0 || coin == 12 {
			t.Errorf("the coin (disk_full, probability 0.5) fired on %d of 12 writes", coin)
		}
		out.Tools = traces[0]
	}
	sf, ok := rt.(sandbox.StorageFaulter)
	if !ok {
		return out
	}
	t.Run("Commands", func(t *testing.T) { out.Commands = commandStorageRun(t, rt, sf, o) })
	t.Run("CommandsSameSeedSameFaults", func(t *testing.T) { commandsSameSeed(t, rt, o) })
	return out
}

// EventLog collects a toolbox's safety events (its tools.Options.OnEvent is Add); it is
// safe for concurrent use.
type EventLog struct {
	mu     sync.Mutex
	events []sandbox.Event
}

// Add records e.
func (r *EventLog) Add(e sandbox.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

// Events returns a copy of what was recorded.
func (r *EventLog) Events() []sandbox.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

// Has reports whether an event of kind k was recorded.
func (r *EventLog) Has(k sandbox.EventKind) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.ContainsFunc(r.events, func(e sandbox.Event) bool { return e.Kind == k })
}

// firedLog collects what a gate fires, from whatever goroutines the gate runs on.
type firedLog struct {
	mu    sync.Mutex
	fired []string
}

func (r *firedLog) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.fired
	r.fired = nil
	return out
}

// execOnly hides the runtime's optional abilities so the toolbox must use its
// in-sandbox backend.
type execOnly struct{ sandbox.Runtime }

// toolStorageRun: with a faultfs.Gate in the toolbox, the file tools meet each storage
// fault with the error the kernel would give.
func toolStorageRun(t *testing.T, rt sandbox.Runtime, o options, hostSide bool, rules []catalogue.Rule) []string {
	ctx := context.Background()
	h, err := rt.Create(ctx, sandbox.Spec{Image: o.image, Workspace: []sandbox.File{
		{Path: "ro/keep.txt", Data: []byte("keep\n")},
		{Path: "many/a.txt", Data: []byte("a\n")},
		{Path: "slow/a.txt", Data: []byte("slow\n")},
		{Path: "ok.txt", Data: []byte("fine\n")},
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rt.Destroy(context.Background(), h.ID) })
	log := &firedLog{}
	gate := faultfs.NewGate(inject.NewDecider(42, rules), func(key string, ev catalogue.Event, fired []catalogue.Fired) {
		log.mu.Lock()
		defer log.mu.Unlock()
		for _, f := range fired {
			log.fired = append(log.fired, fmt.Sprintf("%s %s %s %s", key, ev.Op, f.RuleID, f.Detail))
		}
	}, nil)
	r := rt
	if !hostSide {
		r = execOnly{rt}
	}
	rec := &EventLog{}
	tb := tools.New(r, h.ID, tools.Options{Storage: gate, OnEvent: rec.Add})
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
	if err := tb.Write(ctx, "full/link", []byte("x"), 0); !errors.Is(err, tools.ErrSymlink) || !rec.Has(tools.EventSymlink) {
		t.Fatalf("write through a planted symlink: %v (symlink event recorded: %v)", err, rec.Has(tools.EventSymlink))
	}
	// A coin flip per write: which ones fail is the seed's.
	for i := 0; i < 12; i++ {
		err := tb.Write(ctx, fmt.Sprintf("coin/%d.txt", i%3), []byte("x"), 0)
		if err != nil && !errors.Is(err, syscall.ENOSPC) {
			t.Fatalf("coin write %d: %v", i, err)
		}
	}
	return slices.Clone(log.take())
}

// StorageFaulted is a sandbox with the runtime's storage-fault layer attached, for
// checks of what commands meet (NewStorageFaulted).
type StorageFaulted struct {
	// Toolbox runs the agent's tools in the sandbox (without a gate of its own).
	Toolbox *tools.Toolbox
	// ID is the sandbox's id.
	ID  string
	log *firedLog
}

// Take returns and forgets what fired since the last Take, each as "<rule> <op> <path>".
func (s *StorageFaulted) Take() []string { return s.log.take() }

// NewStorageFaulted creates a sandbox of rt whose workspace holds full/, ro/keep.txt,
// slow/a.txt and coin/, and attaches the runtime's storage-fault layer to it, deciding
// the suite's command faults with seed: disk_full under full/, read_only under ro/,
// io_latency of 150 ms on reads under slow/, and disk_full with probability 0.5 on
// creates under coin/. It fails t when rt is no sandbox.StorageFaulter or cannot
// attach; the sandbox is destroyed when the test ends.
func NewStorageFaulted(t *testing.T, rt sandbox.Runtime, seed uint64, opts ...Option) *StorageFaulted {
	t.Helper()
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	sf, ok := rt.(sandbox.StorageFaulter)
	if !ok {
		t.Fatalf("runtime %s cannot apply storage faults to commands", rt.Name())
	}
	ctx := context.Background()
	_, rules, err := plans.ParseSpec([]byte(commandStorageSpec))
	if err != nil {
		t.Fatal(err)
	}
	h, err := rt.Create(ctx, sandbox.Spec{Image: o.image, Workspace: []sandbox.File{
		{Path: "full/.keep"}, {Path: "ro/keep.txt", Data: []byte("keep\n")},
		{Path: "slow/a.txt", Data: []byte("slow\n")}, {Path: "coin/.keep"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rt.Destroy(context.Background(), h.ID) })
	log := &firedLog{}
	gate := faultfs.NewGate(inject.NewDecider(seed, rules), func(_ string, ev catalogue.Event, fs []catalogue.Fired) {
		log.mu.Lock()
		defer log.mu.Unlock()
		for _, f := range fs {
			log.fired = append(log.fired, f.RuleID+" "+ev.Op+" "+ev.Path)
		}
	}, nil)
	if err := sf.AttachStorageFaults(ctx, h.ID, gate); err != nil {
		t.Fatalf("attach storage faults (FUSE must mount here): %v", err)
	}
	return &StorageFaulted{Toolbox: tools.New(rt, h.ID, tools.Options{}), ID: h.ID, log: log}
}

// shell runs cmd by shell.exec, failing t when the runtime fails.
func shell(t *testing.T, tb *tools.Toolbox, cmd string) tools.ExecResult {
	t.Helper()
	res, err := tb.Exec(context.Background(), tools.ExecArgs{Command: cmd})
	if err != nil {
		t.Fatalf("shell.exec %q: %v", cmd, err)
	}
	return res
}

// commandStorageRun: the agent's commands meet the storage faults through the runtime's
// layer: ENOSPC on `echo x > f`, EROFS on `touch`, io_latency on `cat`; ordinary commands
// work; after detaching no fault and no FUSE mount is left.
func commandStorageRun(t *testing.T, rt sandbox.Runtime, sf sandbox.StorageFaulter, o options) []string {
	ctx := context.Background()
	f := NewStorageFaulted(t, rt, 7, WithImage(o.image))
	tb, id, log := f.Toolbox, f.ID, f.log
	var trace []string
	if res := shell(t, tb, "echo x > full/f"); res.ExitCode == 0 || !strings.Contains(strings.ToLower(res.Stderr), "no space left on device") {
		t.Errorf("echo x > full/f: exit %d %q, want ENOSPC", res.ExitCode, res.Stderr)
	}
	if got := log.take(); len(got) != 1 || got[0] != "full create /full/f" {
		t.Errorf("fired %q, want disk_full on create /full/f", got)
	} else {
		trace = append(trace, got...)
	}
	if res := shell(t, tb, "touch ro/new"); res.ExitCode == 0 || !strings.Contains(strings.ToLower(res.Stderr), "read-only file system") {
		t.Errorf("touch ro/new: exit %d %q, want EROFS", res.ExitCode, res.Stderr)
	}
	if got := log.take(); len(got) != 1 || got[0] != "ro create /ro/new" {
		t.Errorf("fired %q, want read_only on create /ro/new", got)
	} else {
		trace = append(trace, got...)
	}
	start := time.Now()
	if res := shell(t, tb, "cat slow/a.txt"); res.Stdout != "slow\n" {
		t.Errorf("cat slow/a.txt: %q %q", res.Stdout, res.Stderr)
	}
	// At least one read of 150 ms (busybox's cat makes one, coreutils' two); a lower bound
	// only, the machine is shared.
	if d := time.Since(start); d < 150*time.Millisecond {
		t.Errorf("cat under io_latency took %v", d)
	}
	if got := log.take(); len(got) == 0 || got[0] != "slow read /slow/a.txt" {
		t.Errorf("fired %q, want io_latency on the reads of /slow/a.txt", got)
	}
	if res := shell(t, tb, "for i in 1 2 3 4 5 6 7 8 9 10 11 12; do echo $i > coin/f$i || true; done 2>/dev/null; mkdir -p d && echo ok > d/ok && mv d/ok d/ok2 && cat d/ok2"); res.Stdout != "ok\n" {
		t.Errorf("ordinary commands: %q %q", res.Stdout, res.Stderr)
	}
	trace = append(trace, log.take()...)
	if err := sf.DetachStorageFaults(ctx, id); err != nil {
		t.Fatal(err)
	}
	if res := shell(t, tb, "echo y > full/g && cat full/g && grep -c ' fuse' /proc/self/mountinfo || true"); res.Stdout != "y\n0\n" {
		t.Errorf("after detach: %q %q", res.Stdout, res.Stderr)
	}
	if got := log.take(); len(got) != 0 {
		t.Errorf("fired %q after detach", got)
	}
	return trace
}

// commandsSameSeed: a single-threaded command meets the same faults on the same seed, in
// the same order, and another seed differs.
func commandsSameSeed(t *testing.T, rt sandbox.Runtime, o options) {
	cmd := "for i in $(seq 1 16); do echo $i > coin/f$i || true; done 2>/dev/null; ls coin | wc -l"
	var traces [][]string
	for _, seed := range []uint64{7, 7, 8} {
		f := NewStorageFaulted(t, rt, seed, WithImage(o.image))
		res := shell(t, f.Toolbox, cmd)
		fired := f.Take()
		creates := 0 // a file whose create failed does not exist; one whose write failed is empty
		for _, f := range fired {
			if strings.HasPrefix(f, "coin create ") {
				creates++
			}
		}
		if want := fmt.Sprint(16 - creates); strings.TrimSpace(res.Stdout) != want {
			t.Errorf("seed %d: %s files made, want %s (16 minus %d failed creates)", seed, strings.TrimSpace(res.Stdout), want, creates)
		}
		traces = append(traces, fired)
	}
	if len(traces[0]) == 0 || len(traces[0]) == 16 {
		t.Errorf("the coin (disk_full, probability 0.5) fired %d times on 16 files", len(traces[0]))
	}
	if !slices.Equal(traces[0], traces[1]) {
		t.Errorf("seed 7 twice fired different faults:\n%q\n%q", traces[0], traces[1])
	}
	if slices.Equal(traces[0], traces[2]) {
		t.Errorf("seeds 7 and 8 fired the same faults: %q", traces[0])
	}
}
