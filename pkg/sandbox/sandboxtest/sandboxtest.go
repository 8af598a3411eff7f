// Package sandboxtest is the conformance suite every sandbox.Runtime passes (in the manner of
// containerd's snapshotter testsuite). A runtime's own tests call Run with a Factory that
// opens the runtime over a state directory; the suite calls the factory again over the same
// directory to play a worker restart.
//
// The suite needs only a POSIX shell and the usual small tools (sh, cat, echo, head, ls, dd,
// sleep, mkdir, seq, wc) inside the sandbox, so a busybox image passes it. It asserts the
// isolation contract too: no capabilities, no_new_privs, a seccomp filter, loopback-only
// network, a private workspace. A runtime that cannot provide one of them fails; it never
// skips.
package sandboxtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
)

// Factory opens the runtime under test over stateDir. It fails t (t.Fatal) when the runtime
// cannot start, saying why. The suite closes every runtime it opens.
type Factory func(t *testing.T, stateDir string) sandbox.Runtime

// Option adjusts the suite.
type Option func(*options)

type options struct {
	image     string
	abilities []Ability
}

// Ability is an optional interface of sandbox.Runtime a runtime may offer.
type Ability string

// The optional abilities the suite tests.
const (
	Snapshots     Ability = "sandbox.Snapshotter"
	Forks         Ability = "sandbox.Forker"
	WorkspaceDirs Ability = "sandbox.WorkspaceDirer"
	Streams       Ability = "sandbox.Streamer"
	Dials         Ability = "sandbox.Dialer"
)

// Expect declares the abilities the runtime offers (as its documentation says): the suite
// fails when one of them is missing, instead of passing over the subtests it cannot run.
// Abilities not declared are tested when present.
func Expect(abilities ...Ability) Option {
	return func(o *options) { o.abilities = append(o.abilities, abilities...) }
}

// lacks ends the ability's subtest when the runtime does not offer it: a failure when
// the runtime declared it, a logged pass otherwise.
func (s *suite) lacks(t *testing.T, rt sandbox.Runtime, a Ability) {
	t.Helper()
	if slices.Contains(s.o.abilities, a) {
		t.Fatalf("%s is declared to implement %s and does not", rt.Name(), a)
	}
	t.Logf("%s does not implement %s", rt.Name(), a)
}

// WithImage sets Spec.Image for every sandbox the suite creates (containerd needs one).
func WithImage(image string) Option { return func(o *options) { o.image = image } }

// Run runs the conformance suite against the runtime f opens. Optional abilities
// (Snapshotter, Forker, WorkspaceDirer) are tested when the runtime implements them, and
// their subtests say so in their names; those declared with Expect must be there.
func Run(t *testing.T, f Factory, opts ...Option) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	s := &suite{f: f, o: o}
	t.Run("ExecBasics", s.execBasics)
	t.Run("InvalidRequests", s.invalidRequests)
	t.Run("NotFound", s.notFound)
	t.Run("WorkspaceSeedAndPersistence", s.workspace)
	t.Run("Timeout", s.timeout)
	t.Run("ContextCancel", s.cancel)
	t.Run("OutputLimit", s.outputLimit)
	t.Run("NotRootEquivalent", s.notRoot)
	t.Run("LoopbackOnlyNetwork", s.network)
	t.Run("WorkspacesArePrivate", s.private)
	t.Run("PidsLimit", s.pidsLimit)
	t.Run("MemoryLimit", s.memoryLimit)
	t.Run("Metering", s.metering)
	t.Run("Stats", s.stats)
	t.Run("RecoverAfterRestart", s.recover)
	t.Run("Concurrent", s.concurrent)
	t.Run("Snapshotter", s.snapshotter)
	t.Run("Forker", s.forker)
	t.Run("WorkspaceDirer", s.workspaceDirer)
	t.Run("User", s.user)
	t.Run("Streamer", s.streamer)
	t.Run("Dialer", s.dialer)
}

type suite struct {
	f Factory
	o options
}

func (s *suite) open(t *testing.T, dir string) sandbox.Runtime {
	t.Helper()
	rt := s.f(t, dir)
	if rt == nil {
		t.Fatal("factory returned a nil runtime")
	}
	t.Cleanup(func() { _ = rt.Close() })
	return rt
}

func (s *suite) spec(sp sandbox.Spec) sandbox.Spec {
	if sp.Image == "" {
		sp.Image = s.o.image
	}
	return sp
}

func (s *suite) create(t *testing.T, rt sandbox.Runtime, sp sandbox.Spec) sandbox.Handle {
	t.Helper()
	h, err := rt.Create(ctx(t), s.spec(sp))
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if h.ID == "" || h.Runtime != rt.Name() {
		t.Fatalf("create returned handle %+v: want an id and runtime %q", h, rt.Name())
	}
	t.Cleanup(func() { _ = rt.Destroy(context.Background(), h.ID) })
	return h
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return c
}

func sh(script string) sandbox.ExecRequest {
	return sandbox.ExecRequest{Argv: []string{"sh", "-c", script}, Timeout: 30 * time.Second}
}

func run(t *testing.T, rt sandbox.Runtime, id string, req sandbox.ExecRequest) sandbox.ExecResult {
	t.Helper()
	res, err := rt.Exec(ctx(t), id, req)
	if err != nil {
		t.Fatalf("exec %q: %v", req.Argv, err)
	}
	return res
}

// ok runs a shell script and fails unless it exits 0; it returns stdout.
func ok(t *testing.T, rt sandbox.Runtime, id, script string) string {
	t.Helper()
	res := run(t, rt, id, sh(script))
	if res.ExitCode != 0 {
		t.Fatalf("%q exited %d; stdout %q stderr %q", script, res.ExitCode, res.Stdout, res.Stderr)
	}
	return string(res.Stdout)
}

func hasEvent(res sandbox.ExecResult, k sandbox.EventKind) bool {
	return slices.ContainsFunc(res.Events, func(e sandbox.Event) bool { return e.Kind == k })
}

func (s *suite) execBasics(t *testing.T) {
	rt := s.open(t, t.TempDir())
	h := s.create(t, rt, sandbox.Spec{Env: []string{"FROM_SPEC=spec"}})

	res := run(t, rt, h.ID, sandbox.ExecRequest{Argv: []string{"echo", "hello", "world"}})
	if res.ExitCode != 0 || string(res.Stdout) != "hello world\n" || res.Truncated || res.TimedOut {
		t.Fatalf("echo: got %+v", res)
	}
	res = run(t, rt, h.ID, sh("echo out; echo err >&2; exit 3"))
	if res.ExitCode != 3 || string(res.Stdout) != "out\n" || string(res.Stderr) != "err\n" {
		t.Fatalf("exit 3: got code %d stdout %q stderr %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	res = run(t, rt, h.ID, sandbox.ExecRequest{Argv: []string{"cat"}, Stdin: []byte("from stdin")})
	if string(res.Stdout) != "from stdin" {
		t.Fatalf("stdin: got %q", res.Stdout)
	}
	if got := ok(t, rt, h.ID, "pwd"); got != sandbox.WorkspacePath+"\n" {
		t.Fatalf("default dir: got %q want %s", got, sandbox.WorkspacePath)
	}
	ok(t, rt, h.ID, "mkdir -p sub/dir")
	req := sh("pwd; echo $FROM_SPEC $FROM_REQ")
	req.Dir = "sub/dir"
	req.Env = []string{"FROM_REQ=req"}
	res = run(t, rt, h.ID, req)
	if want := sandbox.WorkspacePath + "/sub/dir\nspec req\n"; string(res.Stdout) != want {
		t.Fatalf("dir/env: got %q want %q", res.Stdout, want)
	}
	res = run(t, rt, h.ID, sandbox.ExecRequest{Argv: []string{"no-such-program-xyz"}})
	if res.ExitCode == 0 {
		t.Fatalf("missing program: exit code 0, want non-zero")
	}
	res = run(t, rt, h.ID, sh("kill -9 $$"))
	if res.ExitCode != 128+9 {
		t.Fatalf("killed by SIGKILL: exit code %d, want %d", res.ExitCode, 128+9)
	}
}

func (s *suite) invalidRequests(t *testing.T) {
	rt := s.open(t, t.TempDir())
	bad := []sandbox.Spec{
		{ID: "../escape"},
		{Limits: sandbox.Limits{MemoryBytes: -1}},
		{Limits: sandbox.Limits{Pids: 2}},
		{Network: "host"},
		{Env: []string{"NOEQUALS"}},
		{Workspace: []sandbox.File{{Path: "../x"}}},
		{Workspace: []sandbox.File{{Path: "/etc/passwd"}}},
	}
	for _, sp := range bad {
		if _, err := rt.Create(ctx(t), s.spec(sp)); !errors.Is(err, sandbox.ErrInvalid) {
			t.Errorf("create %+v: got %v, want ErrInvalid", sp, err)
		}
	}
	h := s.create(t, rt, sandbox.Spec{})
	if _, err := rt.Create(ctx(t), s.spec(sandbox.Spec{ID: h.ID})); !errors.Is(err, sandbox.ErrExists) {
		t.Errorf("create with an existing id: got %v, want ErrExists", err)
	}
	for _, req := range []sandbox.ExecRequest{
		{},
		{Argv: []string{""}},
		{Argv: []string{"echo"}, Env: []string{"=x"}},
		{Argv: []string{"echo"}, Timeout: -time.Second},
		{Argv: []string{"echo"}, OutputLimit: -1},
	} {
		if _, err := rt.Exec(ctx(t), h.ID, req); !errors.Is(err, sandbox.ErrInvalid) {
			t.Errorf("exec %+v: got %v, want ErrInvalid", req, err)
		}
	}
}

func (s *suite) notFound(t *testing.T) {
	rt := s.open(t, t.TempDir())
	c := ctx(t)
	if _, err := rt.Exec(c, "nope", sandbox.ExecRequest{Argv: []string{"true"}}); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("exec unknown: got %v, want ErrNotFound", err)
	}
	if _, err := rt.Stats(c, "nope"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("stats unknown: got %v, want ErrNotFound", err)
	}
	if err := rt.Destroy(c, "nope"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("destroy unknown: got %v, want ErrNotFound", err)
	}
	h := s.create(t, rt, sandbox.Spec{})
	if err := rt.Destroy(c, h.ID); err != nil {
		t.Fatalf("destroy: %v", err)
	}
	if _, err := rt.Exec(c, h.ID, sandbox.ExecRequest{Argv: []string{"true"}}); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("exec destroyed: got %v, want ErrNotFound", err)
	}
	if err := rt.Destroy(c, h.ID); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("destroy twice: got %v, want ErrNotFound", err)
	}
	hs, err := rt.List(c)
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	for _, x := range hs {
		if x.ID == h.ID {
			t.Errorf("list still shows destroyed sandbox %s", h.ID)
		}
	}
}

func (s *suite) workspace(t *testing.T) {
	rt := s.open(t, t.TempDir())
	h := s.create(t, rt, sandbox.Spec{Workspace: []sandbox.File{
		{Path: "README", Data: []byte("seeded\n")},
		{Path: "bin/run.sh", Data: []byte("#!/bin/sh\necho ran\n"), Mode: 0o755},
	}})
	if got := ok(t, rt, h.ID, "cat README"); got != "seeded\n" {
		t.Fatalf("seed file: got %q", got)
	}
	if got := ok(t, rt, h.ID, "./bin/run.sh"); got != "ran\n" {
		t.Fatalf("seeded executable: got %q", got)
	}
	ok(t, rt, h.ID, "echo one > state; mkdir -p d; echo two > d/f")
	if got := ok(t, rt, h.ID, "cat state d/f"); got != "one\ntwo\n" {
		t.Fatalf("workspace did not persist across execs: got %q", got)
	}
	ok(t, rt, h.ID, "rm README")
	if got := ok(t, rt, h.ID, "ls"); strings.Contains(got, "README") {
		t.Fatalf("deleted file still listed: %q", got)
	}
}

func (s *suite) timeout(t *testing.T) {
	rt := s.open(t, t.TempDir())
	h := s.create(t, rt, sandbox.Spec{})
	req := sh("echo started; sleep 60 & while :; do :; done")
	req.Timeout = 1500 * time.Millisecond
	res := run(t, rt, h.ID, req)
	if !res.TimedOut || !hasEvent(res, sandbox.EventTimeout) {
		t.Fatalf("got TimedOut=%v events %v, want a timeout", res.TimedOut, res.Events)
	}
	if res.ExitCode == 0 {
		t.Fatalf("timed out command exited 0")
	}
	if string(res.Stdout) != "started\n" {
		t.Fatalf("output before the timeout lost: %q", res.Stdout)
	}
	// Nothing of the killed command survives: the sandbox runs the next command normally
	// and sees no leftover process.
	if got := ok(t, rt, h.ID, "echo alive"); got != "alive\n" {
		t.Fatalf("after timeout: got %q", got)
	}
	st, err := rt.Stats(ctx(t), h.ID)
	if err != nil {
		t.Fatalf("stats: %v", err)
	}
	if st.Pids != 0 {
		t.Fatalf("%d processes left after a timed-out command", st.Pids)
	}
}

func (s *suite) cancel(t *testing.T) {
	rt := s.open(t, t.TempDir())
	h := s.create(t, rt, sandbox.Spec{})
	c, cancel := context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel)
	_, err := rt.Exec(c, h.ID, sh("sleep 60"))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("exec with cancelled ctx: got %v, want context.Canceled", err)
	}
	if got := ok(t, rt, h.ID, "echo alive"); got != "alive\n" {
		t.Fatalf("after cancel: got %q", got)
	}
}

func (s *suite) outputLimit(t *testing.T) {
	rt := s.open(t, t.TempDir())
	h := s.create(t, rt, sandbox.Spec{})
	req := sh("head -c 200000 /dev/zero; head -c 5000 /dev/zero >&2; exit 7")
	req.OutputLimit = 1000
	res := run(t, rt, h.ID, req)
	if len(res.Stdout) != 1000 || len(res.Stderr) != 1000 || !res.Truncated {
		t.Fatalf("got stdout %d stderr %d truncated %v, want 1000, 1000, true", len(res.Stdout), len(res.Stderr), res.Truncated)
	}
	if res.ExitCode != 7 {
		t.Fatalf("exit code %d with capped output, want 7 (the command must run to completion)", res.ExitCode)
	}
	if !hasEvent(res, sandbox.EventOutputCapped) {
		t.Fatalf("events %v, want %s", res.Events, sandbox.EventOutputCapped)
	}
}

func (s *suite) notRoot(t *testing.T) {
	rt := s.open(t, t.TempDir())
	h := s.create(t, rt, sandbox.Spec{})
	status := ok(t, rt, h.ID, "cat /proc/self/status")
	want := map[string]string{
		"CapEff":     "0000000000000000",
		"CapPrm":     "0000000000000000",
		"CapBnd":     "0000000000000000",
		"NoNewPrivs": "1",
		"Seccomp":    "2",
	}
	for _, line := range strings.Split(status, "\n") {
		k, v, _ := strings.Cut(line, ":")
		if w, ok := want[k]; ok {
			if strings.TrimSpace(v) != w {
				t.Errorf("/proc/self/status %s = %q, want %q", k, strings.TrimSpace(v), w)
			}
			delete(want, k)
		}
	}
	for k := range want {
		t.Errorf("/proc/self/status has no %s line", k)
	}
	// Only stdin, stdout and stderr reach the command (ls opens the directory as 3).
	if got := strings.Fields(ok(t, rt, h.ID, "ls /proc/self/fd")); !slices.Equal(got, []string{"0", "1", "2", "3"}) {
		t.Errorf("open descriptors in the sandbox: %v, want 0 1 2 (and ls's own 3)", got)
	}
	// /dev/mem is absent or a decoy (package safety): either way not one byte of it.
	if got := strings.TrimSpace(ok(t, rt, h.ID, "cat /dev/mem 2>/dev/null | wc -c")); got != "0" {
		t.Errorf("read %s bytes of /dev/mem", got)
	}
	res := run(t, rt, h.ID, sh("mount -t tmpfs none /tmp"))
	if res.ExitCode == 0 {
		t.Errorf("mount succeeded inside the sandbox")
	}
}

func (s *suite) network(t *testing.T) {
	rt := s.open(t, t.TempDir())
	h := s.create(t, rt, sandbox.Spec{})
	out := ok(t, rt, h.ID, "cat /proc/net/dev")
	var ifaces []string
	for _, line := range strings.Split(out, "\n") {
		if name, _, found := strings.Cut(line, ":"); found {
			ifaces = append(ifaces, strings.TrimSpace(name))
		}
	}
	if !slices.Equal(ifaces, []string{"lo"}) {
		t.Fatalf("interfaces %v, want only lo", ifaces)
	}
}

func (s *suite) private(t *testing.T) {
	rt := s.open(t, t.TempDir())
	a := s.create(t, rt, sandbox.Spec{})
	b := s.create(t, rt, sandbox.Spec{})
	ok(t, rt, a.ID, "echo secret-of-a > secret")
	if got := ok(t, rt, b.ID, "ls -a"); strings.Contains(got, "secret") {
		t.Fatalf("sandbox b sees a's file: %q", got)
	}
	// b looks for a's id anywhere it can reach.
	// System directories (/usr, /bin, /lib…) are shared read-only images and /proc, /sys
	// are kernel views; everything else is searched. Only regular files are read (stat,
	// not the directory entry's type: a bind-mounted /dev/zero sits on an empty regular
	// file, and reading it never ends).
	script := fmt.Sprintf(`for d in /* /.[!.]*; do
	  case $d in /proc|/sys|/usr|/bin|/sbin|/lib|/lib32|/lib64|/libx32) continue;; esac
	  [ -e "$d" ] || continue
	  find "$d" -type f 2>/dev/null | while read -r f; do
	    [ -f "$f" ] && [ ! -c "$f" ] && grep -l secret-of-a "$f" 2>/dev/null
	  done | head -5
	  find "$d" -name '*%s*' 2>/dev/null | head -5
	done; true`, a.ID)
	req := sh(script)
	req.Timeout = 60 * time.Second
	res := run(t, rt, b.ID, req)
	if res.TimedOut {
		t.Fatalf("the search for a's traces timed out after %v before covering everything", req.Timeout)
	}
	if strings.TrimSpace(string(res.Stdout)) != "" {
		t.Fatalf("sandbox b found traces of a: %q", res.Stdout)
	}
}

func (s *suite) pidsLimit(t *testing.T) {
	rt := s.open(t, t.TempDir())
	h := s.create(t, rt, sandbox.Spec{Limits: sandbox.Limits{Pids: 16}})
	req := sh("n=0; for i in $(seq 64); do sleep 5 & n=$((n+1)); done; echo $n")
	req.Timeout = 20 * time.Second
	res := run(t, rt, h.ID, req)
	if !hasEvent(res, sandbox.EventPidsLimit) {
		t.Fatalf("64 background sleeps under pids=16: events %v (exit %d, stderr %q), want %s",
			res.Events, res.ExitCode, res.Stderr, sandbox.EventPidsLimit)
	}
	if got := ok(t, rt, h.ID, "echo alive"); got != "alive\n" {
		t.Fatalf("after hitting the pids limit: got %q", got)
	}
}

func (s *suite) memoryLimit(t *testing.T) {
	rt := s.open(t, t.TempDir())
	h := s.create(t, rt, sandbox.Spec{Limits: sandbox.Limits{MemoryBytes: 32 << 20}})
	// dd allocates its block buffer and fills it from /dev/zero: 128 MiB resident.
	res := run(t, rt, h.ID, sh("dd if=/dev/zero of=/dev/null bs=128M count=1"))
	if res.ExitCode == 0 || !hasEvent(res, sandbox.EventOOMKill) {
		t.Fatalf("128 MiB under a 32 MiB limit: exit %d events %v, want a kill and %s", res.ExitCode, res.Events, sandbox.EventOOMKill)
	}
	if res.Metering.PeakMemoryBytes > 40<<20 {
		t.Fatalf("peak memory %d exceeds the 32 MiB limit", res.Metering.PeakMemoryBytes)
	}
	if got := ok(t, rt, h.ID, "echo alive"); got != "alive\n" {
		t.Fatalf("after the OOM kill: got %q", got)
	}
}

func (s *suite) metering(t *testing.T) {
	rt := s.open(t, t.TempDir())
	h := s.create(t, rt, sandbox.Spec{})
	res := run(t, rt, h.ID, sh("i=0; while [ $i -lt 30000 ]; do i=$((i+1)); done; head -c 300000 /dev/zero > f; cat f > /dev/null; cat f | wc -c"))
	m := res.Metering
	if res.ExitCode != 0 || strings.TrimSpace(string(res.Stdout)) != "300000" {
		t.Fatalf("exit %d stdout %q", res.ExitCode, res.Stdout)
	}
	if m.CPUTime <= 0 || m.WallTime <= 0 || m.PeakMemoryBytes <= 0 {
		t.Errorf("cpu %v wall %v peak %d: want all positive", m.CPUTime, m.WallTime, m.PeakMemoryBytes)
	}
	// sh, head, cat, cat, wc at least.
	if m.Processes < 5 {
		t.Errorf("processes %d, want at least 5", m.Processes)
	}
	if m.BytesWritten < 300000 || m.BytesRead < 600000 {
		t.Errorf("bytes read %d written %d, want at least 600000 and 300000", m.BytesRead, m.BytesWritten)
	}
}

func (s *suite) stats(t *testing.T) {
	rt := s.open(t, t.TempDir())
	h := s.create(t, rt, sandbox.Spec{})
	var sum sandbox.Metering
	for i := range 3 {
		res := run(t, rt, h.ID, sh(fmt.Sprintf("head -c 100000 /dev/zero > f%d", i)))
		sum.Add(res.Metering)
	}
	st, err := rt.Stats(ctx(t), h.ID)
	if err != nil {
		t.Fatalf("stats: %v", err)
	}
	if st.Execs != 3 {
		t.Errorf("execs %d, want 3", st.Execs)
	}
	if st.Total.CPUTime != sum.CPUTime || st.Total.Processes != sum.Processes || st.Total.BytesWritten != sum.BytesWritten {
		t.Errorf("total %+v, want the sum of the execs %+v", st.Total, sum)
	}
	if st.WorkspaceBytes < 300000 {
		t.Errorf("workspace bytes %d, want at least 300000", st.WorkspaceBytes)
	}
}

func (s *suite) recover(t *testing.T) {
	dir := t.TempDir()
	rt1 := s.f(t, dir)
	h, err := rt1.Create(ctx(t), s.spec(sandbox.Spec{Labels: map[string]string{"episode": "e1"}}))
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	ok(t, rt1, h.ID, "echo kept > state")
	if err := rt1.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if _, err := rt1.Exec(ctx(t), h.ID, sh("true")); !errors.Is(err, sandbox.ErrClosed) {
		t.Errorf("exec after close: got %v, want ErrClosed", err)
	}

	rt2 := s.open(t, dir)
	t.Cleanup(func() { _ = rt2.Destroy(context.Background(), h.ID) })
	hs, err := rt2.List(ctx(t))
	if err != nil {
		t.Fatalf("list after restart: %v", err)
	}
	i := slices.IndexFunc(hs, func(x sandbox.Handle) bool { return x.ID == h.ID })
	if i < 0 {
		t.Fatalf("list after restart: %s missing from %v", h.ID, hs)
	}
	if hs[i].Spec.Labels["episode"] != "e1" {
		t.Errorf("recovered labels %v", hs[i].Spec.Labels)
	}
	if err := rt2.Recover(ctx(t), hs[i]); err != nil {
		t.Fatalf("recover: %v", err)
	}
	if err := rt2.Recover(ctx(t), hs[i]); err != nil {
		t.Fatalf("recover twice: %v", err)
	}
	if got := ok(t, rt2, h.ID, "cat state"); got != "kept\n" {
		t.Fatalf("workspace after recover: got %q", got)
	}
	if err := rt2.Destroy(ctx(t), h.ID); err != nil {
		t.Fatalf("destroy recovered: %v", err)
	}
	if err := rt2.Recover(ctx(t), hs[i]); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("recover destroyed: got %v, want ErrNotFound", err)
	}
}

func (s *suite) concurrent(t *testing.T) {
	rt := s.open(t, t.TempDir())
	const n = 4
	var wg sync.WaitGroup
	errs := make(chan error, n*4)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := context.Background()
			h, err := rt.Create(c, s.spec(sandbox.Spec{}))
			if err != nil {
				errs <- err
				return
			}
			defer func() { _ = rt.Destroy(c, h.ID) }()
			var inner sync.WaitGroup
			for j := range 3 {
				inner.Add(1)
				go func() {
					defer inner.Done()
					want := fmt.Sprintf("%d-%d", i, j)
					res, err := rt.Exec(c, h.ID, sh("echo "+want+" > f"+want+"; cat f"+want))
					if err != nil {
						errs <- err
					} else if strings.TrimSpace(string(res.Stdout)) != want {
						errs <- fmt.Errorf("sandbox %d exec %d: got %q", i, j, res.Stdout)
					}
				}()
			}
			inner.Wait()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func (s *suite) snapshotter(t *testing.T) {
	rt := s.open(t, t.TempDir())
	sn, isSnap := rt.(sandbox.Snapshotter)
	if !isSnap {
		s.lacks(t, rt, Snapshots)
		return
	}
	h := s.create(t, rt, sandbox.Spec{Workspace: []sandbox.File{{Path: "seed", Data: []byte("s")}}})
	ok(t, rt, h.ID, "echo v1 > f; mkdir d; echo in-d > d/x")
	snap, err := sn.Snapshot(ctx(t), h.ID)
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	if snap.ID == "" || snap.Sandbox != h.ID {
		t.Fatalf("snapshot %+v", snap)
	}
	for round := range 2 {
		ok(t, rt, h.ID, "echo v2 > f; rm -r d seed; echo new > g")
		if err := sn.Restore(ctx(t), h.ID, snap.ID); err != nil {
			t.Fatalf("restore round %d: %v", round, err)
		}
		if got := ok(t, rt, h.ID, "cat f d/x seed; ls"); got != "v1\nin-d\nsd\nf\nseed\n" {
			t.Fatalf("after restore round %d: got %q", round, got)
		}
	}
	// A second snapshot on top of the first, then back to the first.
	ok(t, rt, h.ID, "echo v3 > f")
	snap2, err := sn.Snapshot(ctx(t), h.ID)
	if err != nil {
		t.Fatalf("second snapshot: %v", err)
	}
	if err := sn.Restore(ctx(t), h.ID, snap.ID); err != nil {
		t.Fatalf("restore first: %v", err)
	}
	if got := ok(t, rt, h.ID, "cat f"); got != "v1\n" {
		t.Fatalf("restore first after second: got %q", got)
	}
	if err := sn.Restore(ctx(t), h.ID, snap2.ID); err != nil {
		t.Fatalf("restore second: %v", err)
	}
	if got := ok(t, rt, h.ID, "cat f"); got != "v3\n" {
		t.Fatalf("restore second: got %q", got)
	}
	if err := sn.Restore(ctx(t), h.ID, "no-such-snapshot"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("restore unknown snapshot: got %v, want ErrNotFound", err)
	}
	listed(t, rt, snap.ID, snap2.ID)
	if err := sn.DeleteSnapshot(ctx(t), snap2.ID); err != nil {
		t.Fatalf("delete snapshot: %v", err)
	}
	listed(t, rt, snap.ID)
	if err := sn.Restore(ctx(t), h.ID, snap2.ID); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("restore deleted snapshot: got %v, want ErrNotFound", err)
	}
	if err := sn.DeleteSnapshot(ctx(t), snap2.ID); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("delete snapshot twice: got %v, want ErrNotFound", err)
	}
	// Restore into another sandbox of the same image.
	other := s.create(t, rt, sandbox.Spec{})
	if err := sn.Restore(ctx(t), other.ID, snap.ID); err != nil {
		t.Fatalf("restore into another sandbox: %v", err)
	}
	if got := ok(t, rt, other.ID, "cat f"); got != "v1\n" {
		t.Fatalf("restore into another sandbox: got %q", got)
	}
	// The snapshot survives its source's destruction.
	if err := rt.Destroy(ctx(t), h.ID); err != nil {
		t.Fatalf("destroy source: %v", err)
	}
	ok(t, rt, other.ID, "echo changed > f")
	if err := sn.Restore(ctx(t), other.ID, snap.ID); err != nil {
		t.Fatalf("restore after source destroyed: %v", err)
	}
	if got := ok(t, rt, other.ID, "cat f"); got != "v1\n" {
		t.Fatalf("restore after source destroyed: got %q", got)
	}
	if err := sn.DeleteSnapshot(ctx(t), snap.ID); err != nil {
		t.Fatalf("delete snapshot: %v", err)
	}
	if got := ok(t, rt, other.ID, "cat f"); got != "v1\n" {
		t.Fatalf("sandbox restored from a deleted snapshot lost its workspace: got %q", got)
	}
}

// listed checks, when rt lists its snapshots, that they are the ones named, oldest first.
func listed(t *testing.T, rt sandbox.Runtime, want ...string) {
	t.Helper()
	l, ok := rt.(sandbox.SnapshotLister)
	if !ok {
		return
	}
	snaps, err := l.ListSnapshots(ctx(t))
	if err != nil {
		t.Fatalf("list snapshots: %v", err)
	}
	var got []string
	for _, sn := range snaps {
		got = append(got, sn.ID)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("snapshots listed %q, want %q", got, want)
	}
}

func (s *suite) forker(t *testing.T) {
	rt := s.open(t, t.TempDir())
	sn, isSnap := rt.(sandbox.Snapshotter)
	fk, isFork := rt.(sandbox.Forker)
	if !isSnap || !isFork {
		s.lacks(t, rt, Forks)
		return
	}
	src := s.create(t, rt, sandbox.Spec{Limits: sandbox.Limits{Pids: 64}, Env: []string{"ORIGIN=src"}})
	ok(t, rt, src.ID, "echo base > f")
	snap, err := sn.Snapshot(ctx(t), src.ID)
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	var forks []sandbox.Handle
	for i := range 2 {
		h, err := fk.Fork(ctx(t), snap.ID)
		if err != nil {
			t.Fatalf("fork %d: %v", i, err)
		}
		t.Cleanup(func() { _ = rt.Destroy(context.Background(), h.ID) })
		if h.ID == src.ID || h.Spec.Limits.Pids != 64 {
			t.Fatalf("fork handle %+v: want a new id and the source's limits", h)
		}
		forks = append(forks, h)
	}
	ok(t, rt, forks[0].ID, "echo fork0 > f")
	ok(t, rt, src.ID, "echo src > f")
	if got := ok(t, rt, forks[1].ID, "cat f; echo $ORIGIN"); got != "base\nsrc\n" {
		t.Fatalf("fork 1 sees %q, want the snapshot's content and the source's env", got)
	}
	if got := ok(t, rt, forks[0].ID, "cat f"); got != "fork0\n" {
		t.Fatalf("fork 0 sees %q", got)
	}
	if err := rt.Destroy(ctx(t), src.ID); err != nil {
		t.Fatalf("destroy source: %v", err)
	}
	if err := sn.DeleteSnapshot(ctx(t), snap.ID); err != nil {
		t.Fatalf("delete snapshot: %v", err)
	}
	if got := ok(t, rt, forks[1].ID, "cat f"); got != "base\n" {
		t.Fatalf("fork after source and snapshot deleted: got %q", got)
	}
	if _, err := fk.Fork(ctx(t), snap.ID); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("fork deleted snapshot: got %v, want ErrNotFound", err)
	}
	if uf, is := rt.(sandbox.UserForker); is {
		userFork(t, rt, sn, uf)
	}
}

// userFork: a fork started as another user runs its commands as that user, sees the
// snapshot's files and may write its workspace's top folder, which its source's user
// (root here) owned; a user the root does not know is refused.
func userFork(t *testing.T, rt sandbox.Runtime, sn sandbox.Snapshotter, uf sandbox.UserForker) {
	src, err := rt.Create(ctx(t), sandbox.Spec{})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	t.Cleanup(func() { _ = rt.Destroy(context.Background(), src.ID) })
	ok(t, rt, src.ID, "echo base > f && chmod 0644 f")
	snap, err := sn.Snapshot(ctx(t), src.ID)
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	t.Cleanup(func() { _ = sn.DeleteSnapshot(context.Background(), snap.ID) })
	h, err := uf.ForkAs(ctx(t), snap.ID, "nobody")
	if err != nil {
		t.Fatalf("fork as nobody: %v", err)
	}
	t.Cleanup(func() { _ = rt.Destroy(context.Background(), h.ID) })
	if h.Spec.User != "nobody" {
		t.Fatalf("fork as nobody: spec user %q", h.Spec.User)
	}
	if got := ok(t, rt, h.ID, "id -u; cat f; echo mine > g && cat g"); got != "65534\nbase\nmine\n" {
		t.Fatalf("fork as nobody: got %q, want its uid, the snapshot's file and its own", got)
	}
	if h, err := uf.ForkAs(ctx(t), snap.ID, "no-such-user"); err == nil {
		_ = rt.Destroy(context.Background(), h.ID)
		t.Fatalf("fork as a user the root does not know: no error")
	}
}

// user: Spec.User runs every command as that user, a name with its primary group from
// the root's /etc/passwd or numbers as given, and the workspace (its seeded files
// included) is the user's to change; a user the root does not know is refused.
func (s *suite) user(t *testing.T) {
	rt := s.open(t, t.TempDir())
	for _, u := range []string{"nobody", "65534:65534"} {
		h := s.create(t, rt, sandbox.Spec{User: u, Workspace: []sandbox.File{{Path: "dir/seeded", Data: []byte("seed\n")}}})
		if got := ok(t, rt, h.ID, "id -u; id -g"); got != "65534\n65534\n" {
			t.Errorf("user %q: id -u, id -g = %q, want 65534 twice", u, got)
		}
		ok(t, rt, h.ID, "echo more >> dir/seeded && echo new > dir/new && mkdir made && rm dir/new")
		if got := ok(t, rt, h.ID, "cat dir/seeded"); got != "seed\nmore\n" {
			t.Errorf("user %q: the seeded file holds %q", u, got)
		}
	}
	if _, err := rt.Create(ctx(t), s.spec(sandbox.Spec{User: "no-such-user"})); !errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("create as a user the root does not know: %v, want ErrInvalid", err)
	}
}

func (s *suite) workspaceDirer(t *testing.T) {
	rt := s.open(t, t.TempDir())
	wd, is := rt.(sandbox.WorkspaceDirer)
	if !is {
		s.lacks(t, rt, WorkspaceDirs)
		return
	}
	h := s.create(t, rt, sandbox.Spec{})
	dir, err := wd.WorkspaceDir(ctx(t), h.ID)
	if err != nil {
		t.Fatalf("workspace dir: %v", err)
	}
	ok(t, rt, h.ID, "echo from-inside > inside")
	b, err := os.ReadFile(filepath.Join(dir, "inside"))
	if err != nil || !bytes.Equal(b, []byte("from-inside\n")) {
		t.Fatalf("host read of a file written inside: %q, %v", b, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "outside"), []byte("from-host"), 0o644); err != nil {
		t.Fatalf("host write: %v", err)
	}
	if wo, ok := rt.(sandbox.WorkspaceOwner); ok {
		uid, gid, err := wo.WorkspaceOwner(ctx(t), h.ID)
		if err != nil {
			t.Fatalf("workspace owner: %v", err)
		}
		if err := os.Chown(filepath.Join(dir, "outside"), uid, gid); err != nil {
			t.Fatalf("chown: %v", err)
		}
	}
	if got := ok(t, rt, h.ID, "cat outside; echo more >> outside"); got != "from-host" {
		t.Fatalf("inside read of a host-written file: %q", got)
	}
	if _, err := wd.WorkspaceDir(ctx(t), "nope"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("workspace dir of unknown: got %v, want ErrNotFound", err)
	}
}
