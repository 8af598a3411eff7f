//go:build linux

package faultfuse_test

import (
	"bufio"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/catalogue"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/faultfs"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/inject"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/faultfuse"
)

const spec = `name: fuse-test
faults:
  - {id: full, kind: disk_full, match: {paths: ["/full/*"]}}
  - {id: ro, kind: read_only, match: {paths: ["/ro/*"]}}
  - {id: fds, kind: too_many_open_files, match: {paths: ["/many/*"]}}
  - {id: short, kind: short_write, match: {paths: ["/short/*"]}, params: {keep_fraction: 0.5}}
  - {id: slow, kind: io_latency, match: {paths: ["/slow/*"], ops: [read]}, params: {mean_ms: 60, jitter_ms: 0}}
  - {id: locked, kind: lock_contention, match: {paths: ["/lock/*"]}, params: {wait_ms: 10}}
`

// mount mounts a layer over a fresh workspace and opens it; it fails (never skips) when
// FUSE cannot mount.
func mount(t *testing.T) (ws, mnt string, fired func() []string) {
	t.Helper()
	_, rules, err := plans.ParseSpec([]byte(spec))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ws, mnt, shadow := filepath.Join(dir, "ws"), filepath.Join(dir, "mnt"), filepath.Join(dir, "shadow")
	for _, d := range []string{ws, mnt, shadow, filepath.Join(ws, "full"), filepath.Join(ws, "ro"), filepath.Join(ws, "many"), filepath.Join(ws, "short"), filepath.Join(ws, "slow"), filepath.Join(ws, "lock")} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"ro/keep", "many/a", "slow/a", "lock/a"} {
		if err := os.WriteFile(filepath.Join(ws, f), []byte("data\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	var got []string
	gate := faultfs.NewGate(inject.NewDecider(7, rules), func(_ string, ev catalogue.Event, fs []catalogue.Fired) {
		mu.Lock()
		defer mu.Unlock()
		for _, f := range fs {
			got = append(got, f.RuleID+" "+ev.Op+" "+ev.Path)
		}
	}, nil)
	l, err := faultfuse.New(faultfuse.Config{Workspace: ws, Mountpoint: mnt, Shadow: shadow, Gate: gate})
	if err != nil {
		t.Fatalf("FUSE unavailable here (needs root and /dev/fuse): %v", err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Error(err)
		}
	})
	if err := l.Begin(); err != nil {
		t.Fatalf("FUSE cannot mount here: %v", err)
	}
	var sfs unix.Statfs_t // the shadow is the workspace's own filesystem, not FUSE
	if err := unix.Statfs(shadow, &sfs); err != nil || sfs.Flags&stNoSymfollow == 0 {
		t.Fatalf("shadow bind flags %#x (%v): want nosymfollow", sfs.Flags, err)
	}
	return ws, mnt, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(got)
	}
}

// sh runs a shell command in dir, as a child process: a process must never be its own
// FUSE server's client (a garbage collection waiting on a thread blocked in its own
// filesystem can deadlock), and commands are what the layer serves anyway.
func sh(t *testing.T, dir, cmd string) (out string, err error) {
	t.Helper()
	c := exec.Command("sh", "-c", cmd)
	c.Dir = dir
	b, err := c.CombinedOutput()
	return string(b), err
}

// TestLayerAppliesStorageFaults: each storage kind reaches a command's file
// operation made through the mount, with the errno the kernel would give, and is
// reported to the gate.
func TestLayerAppliesStorageFaults(t *testing.T) {
	ws, mnt, fired := mount(t)
	fails := func(cmd, want string) {
		t.Helper()
		if out, err := sh(t, mnt, cmd); err == nil || !strings.Contains(out, want) {
			t.Errorf("%s: %v %q; want %q", cmd, err, out, want)
		}
	}
	fails("echo x > full/x", "No space left on device")
	fails(": > ro/new", "Read-only file system")
	fails("rm ro/keep", "Read-only file system")
	if out, err := sh(t, mnt, "cat ro/keep"); err != nil || out != "data\n" {
		t.Errorf("read under read_only: %v %q", err, out)
	}
	fails("cat many/a", "Too many open files")
	// head retries what a short write did not store, until nothing is kept (ENOSPC).
	fails("head -c 1000 /dev/zero > short/x", "No space left on device")
	if st, err := os.Stat(filepath.Join(ws, "short/x")); err != nil || st.Size() < 500 || st.Size() >= 1000 {
		t.Errorf("short writes stored %v (%v), want 500 to 999 bytes", st, err)
	}
	start := time.Now()
	if out, err := sh(t, mnt, "cat slow/a"); err != nil || out != "data\n" {
		t.Errorf("read under io_latency: %v %q", err, out)
	}
	if d := time.Since(start); d < 100*time.Millisecond { // two reads (data, EOF) of 60 ms
		t.Errorf("read under io_latency took %v, want at least 120 ms", d)
	}
	fails("flock -n lock/a true", "")
	if out, err := sh(t, mnt, "flock lock/a echo locked"); err != nil || out != "locked\n" {
		t.Errorf("blocking flock under lock_contention: %v %q, want the lock after the wait", err, out)
	}
	// Files created through the layer land in the workspace; untouched paths work.
	if out, err := sh(t, mnt, "mkdir d && echo fine > d/ok.txt && mv d/ok.txt d/ok2.txt && cat d/ok2.txt"); err != nil || out != "fine\n" {
		t.Fatalf("ordinary commands: %v %q", err, out)
	}
	if b, err := os.ReadFile(filepath.Join(ws, "d/ok2.txt")); err != nil || string(b) != "fine\n" {
		t.Fatalf("workspace has %q (%v)", b, err)
	}
	got := fired()
	var shorts int
	for _, f := range got {
		if f == "short write /short/x" {
			shorts++
		}
	}
	got = slices.DeleteFunc(got, func(f string) bool { return f == "short write /short/x" })
	want := []string{
		"full create /full/x", "ro create /ro/new", "ro remove /ro/keep", "fds open /many/a",
		"slow read /slow/a", "slow read /slow/a", "locked lock /lock/a", "locked lock /lock/a",
	}
	if !slices.Equal(got, want) || shorts < 2 {
		t.Errorf("fired (besides %d short writes):\n%q\nwant:\n%q", shorts, got, want)
	}
}

// plainLayer is a layer with no faults over a fresh workspace, not mounted yet, closed
// when the test ends.
func plainLayer(t *testing.T) (l *faultfuse.Layer, ws, mnt, shadow string) {
	t.Helper()
	dir := t.TempDir()
	ws, mnt, shadow = filepath.Join(dir, "ws"), filepath.Join(dir, "mnt"), filepath.Join(dir, "shadow")
	for _, d := range []string{ws, mnt, shadow} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	l, err := faultfuse.New(faultfuse.Config{Workspace: ws, Mountpoint: mnt, Shadow: shadow, Gate: faultfs.NewGate(inject.NewDecider(1, nil), nil, nil)})
	if err != nil {
		t.Fatalf("FUSE unavailable here (needs root and /dev/fuse): %v", err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l, ws, mnt, shadow
}

// TestLayerMountedOnlyDuringCommands: outside Begin/End nothing is mounted and nothing
// reaches the workspace through the mount point; Begin and End can repeat.
func TestLayerMountedOnlyDuringCommands(t *testing.T) {
	l, ws, mnt, shadow := plainLayer(t)
	mounted := func() bool {
		b, err := os.ReadFile("/proc/self/mountinfo")
		return err == nil && strings.Contains(string(b), " "+mnt+" ")
	}
	// held lists the test process's descriptors open on a file or directory of the
	// workspace (by device and inode, whatever path they show after End's unmounts): the
	// server's open files and directories, which must not outlive End.
	held := func() []string {
		in := map[[2]uint64]bool{}
		_ = filepath.WalkDir(ws, func(p string, _ fs.DirEntry, err error) error {
			var st unix.Stat_t
			if err == nil && unix.Lstat(p, &st) == nil {
				in[[2]uint64{st.Dev, st.Ino}] = true
			}
			return nil
		})
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range ents {
			var st unix.Stat_t
			if unix.Stat("/proc/self/fd/"+e.Name(), &st) == nil && in[[2]uint64{st.Dev, st.Ino}] {
				l, _ := os.Readlink("/proc/self/fd/" + e.Name())
				out = append(out, e.Name()+" -> "+l)
			}
		}
		return out
	}
	for i := range 2 {
		if mounted() {
			t.Fatalf("round %d: mounted before Begin", i)
		}
		if err := l.Begin(); err != nil {
			t.Fatalf("FUSE cannot mount here: %v", err)
		}
		if !mounted() {
			t.Fatalf("round %d: not mounted after Begin", i)
		}
		if out, err := sh(t, mnt, "printf "+strconv.Itoa(i)+" > x && ls >/dev/null && cat x >/dev/null"); err != nil {
			t.Fatalf("%v %s", err, out)
		}
		if err := l.End(); err != nil {
			t.Fatal(err)
		}
		if b, err := os.ReadFile(filepath.Join(ws, "x")); err != nil || string(b) != strconv.Itoa(i) {
			t.Fatalf("round %d: workspace has %q (%v)", i, b, err)
		}
		if ents, _ := os.ReadDir(mnt); len(ents) != 0 {
			t.Fatalf("round %d: the mount point shows %v after End", i, ents)
		}
		if ents, _ := os.ReadDir(shadow); len(ents) != 0 {
			t.Fatalf("round %d: the shadow shows %v after End", i, ents)
		}
		// Nothing of the command's files or directories stays open in the server (an
		// open descriptor would keep the workspace's mount alive).
		if h := held(); len(h) != 0 {
			t.Fatalf("round %d: the server still holds %v after End", i, h)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Begin(); !errors.Is(err, faultfuse.ErrClosed) {
		t.Fatalf("Begin after Close: %v", err)
	}
}

// stNoSymfollow is statfs's ST_NOSYMFOLLOW flag (Linux 5.10+).
const stNoSymfollow = 0x2000

// TestLayerEndsDespiteACopy: a mount namespace made while the layer is mounted (here by
// unshare; in production another sandbox's or a container shim's) keeps a copy of the
// mount after End's unmount; End aborts the connection so its server still stops, and
// the copy fails instead of reaching the workspace.
func TestLayerEndsDespiteACopy(t *testing.T) {
	l, _, mnt, _ := plainLayer(t)
	if err := l.Begin(); err != nil {
		t.Fatalf("FUSE cannot mount here: %v", err)
	}
	// The copy: a private mount namespace whose process says it is there, waits, then
	// lists the copy. Its first line means unshare has copied the mount table.
	cp := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c", "echo in; read x; ls "+mnt+" 2>&1; true")
	in, err := cp.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cp.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cp.Start(); err != nil {
		t.Fatal(err)
	}
	defer cp.Process.Kill()
	r := bufio.NewReader(stdout)
	if line, err := r.ReadString('\n'); err != nil || line != "in\n" {
		t.Fatalf("the copy's first line: %q, %v", line, err)
	}
	var out strings.Builder
	copied := make(chan struct{})
	go func() { _, _ = io.Copy(&out, r); close(copied) }()
	// End must not hang on the copy; how long it takes is not this test's business (the
	// bound below only tells a hang from a slow machine).
	ended := make(chan error, 1)
	go func() { ended <- l.End() }()
	select {
	case err := <-ended:
		if err != nil {
			t.Fatalf("End with a copy of the mount elsewhere: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("End hung with a copy of the mount in another namespace")
	}
	in.Close()
	<-copied
	_ = cp.Wait()
	if !strings.Contains(out.String(), "not connected") {
		t.Errorf("the copy listed %q after End; want ENOTCONN", out.String())
	}
}

// TestLayerAppliesChmod: a mode change through the layer reaches the workspace and the
// command sees it at once, for directories as for files, mode 000 included (which the
// FUSE library would otherwise show as 0755 or 0644, and which the kernel then would not
// enforce).
func TestLayerAppliesChmod(t *testing.T) {
	ws, mnt, _ := mount(t)
	out, err := sh(t, mnt, "mkdir dir d0 && echo x > dir/f && touch f0 && chmod 700 dir && chmod 600 dir/f && chmod 000 d0 f0 && chmod 711 full && stat -c %a dir dir/f d0 f0 full")
	if err != nil || out != "700\n600\n0\n0\n711\n" {
		t.Errorf("through the layer: %v %q, want 700, 600, 0, 0 and 711", err, out)
	}
	for name, want := range map[string]os.FileMode{"dir": 0o700, "dir/f": 0o600, "d0": 0, "f0": 0, "full": 0o711} {
		if st, err := os.Stat(filepath.Join(ws, name)); err != nil || st.Mode().Perm() != want {
			t.Errorf("workspace %s: %v (%v), want mode %o", name, st.Mode(), err, want)
		}
	}
}
