//go:build linux

package faultfuse_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gauntlet-rl/gauntlet/pkg/faults"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/faultfs"
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
	_, rules, err := faults.ParseSpec([]byte(spec))
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
	gate := faultfs.NewGate(faults.NewDecider(7, rules), func(_ string, ev faults.Event, fs []faults.Fired) {
		mu.Lock()
		defer mu.Unlock()
		for _, f := range fs {
			got = append(got, f.RuleID+" "+ev.Op+" "+ev.Path)
		}
	}, nil)
	l, err := faultfuse.Mount(faultfuse.Config{Workspace: ws, Mountpoint: mnt, Shadow: shadow, Gate: gate})
	if err != nil {
		t.Fatalf("FUSE cannot mount here (needs root and /dev/fuse): %v", err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Error(err)
		}
	})
	if err := l.Begin(); err != nil {
		t.Fatal(err)
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs(shadow, &sfs); err != nil || sfs.Flags&stNoSymfollow == 0 {
		t.Fatalf("shadow bind flags %#x (%v): want nosymfollow", sfs.Flags, err)
	}
	return ws, mnt, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(got)
	}
}

// TestLayerAppliesStorageFaults (B1, B2): each storage kind reaches a file operation made
// through the mount, with the errno the kernel would give, and is reported to the gate.
func TestLayerAppliesStorageFaults(t *testing.T) {
	ws, mnt, fired := mount(t)
	at := func(p string) string { return filepath.Join(mnt, p) }

	if err := os.WriteFile(at("full/x"), []byte("x"), 0o644); !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("create under disk_full: %v, want ENOSPC", err)
	}
	if err := os.WriteFile(at("ro/new"), nil, 0o644); !errors.Is(err, syscall.EROFS) {
		t.Errorf("create under read_only: %v, want EROFS", err)
	}
	if err := os.Remove(at("ro/keep")); !errors.Is(err, syscall.EROFS) {
		t.Errorf("remove under read_only: %v, want EROFS", err)
	}
	if _, err := os.ReadFile(at("ro/keep")); err != nil {
		t.Errorf("read under read_only: %v", err)
	}
	if _, err := os.Open(at("many/a")); !errors.Is(err, syscall.EMFILE) {
		t.Errorf("open under too_many_open_files: %v, want EMFILE", err)
	}
	f, err := os.OpenFile(at("short/x"), os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	n, err := syscall.Write(int(f.Fd()), make([]byte, 1000))
	if n != 500 || err != nil {
		t.Errorf("short write: %d, %v; want 500, nil", n, err)
	}
	f.Close()
	if st, err := os.Stat(filepath.Join(ws, "short/x")); err != nil || st.Size() != 500 {
		t.Errorf("short write stored %v (%v), want 500 bytes", st, err)
	}
	start := time.Now()
	if b, err := os.ReadFile(at("slow/a")); err != nil || string(b) != "data\n" {
		t.Errorf("read under io_latency: %q, %v", b, err)
	}
	if d := time.Since(start); d < 100*time.Millisecond { // two reads (data, EOF) of 60 ms
		t.Errorf("read under io_latency took %v, want at least 120 ms", d)
	}
	lf, err := os.Open(at("lock/a"))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(lf.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); !errors.Is(err, syscall.EWOULDBLOCK) {
		t.Errorf("flock under lock_contention: %v, want EWOULDBLOCK", err)
	}
	if err := syscall.Flock(int(lf.Fd()), syscall.LOCK_EX); err != nil {
		t.Errorf("blocking flock under lock_contention: %v, want the lock after the wait", err)
	}
	lf.Close()
	// Files created through the layer land in the workspace; untouched paths work.
	if err := os.WriteFile(at("ok.txt"), []byte("fine"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(ws, "ok.txt")); err != nil || string(b) != "fine" {
		t.Fatalf("workspace has %q (%v)", b, err)
	}
	want := []string{
		"full create /full/x", "ro create /ro/new", "ro remove /ro/keep", "fds open /many/a",
		"short write /short/x", "slow read /slow/a", "slow read /slow/a", "locked lock /lock/a", "locked lock /lock/a",
	}
	if got := fired(); !slices.Equal(got, want) {
		t.Errorf("fired:\n%q\nwant:\n%q", got, want)
	}
}

// TestLayerClosedBetweenCommands: outside Begin/End nothing reaches the workspace.
func TestLayerClosedBetweenCommands(t *testing.T) {
	dir := t.TempDir()
	ws, mnt, shadow := filepath.Join(dir, "ws"), filepath.Join(dir, "mnt"), filepath.Join(dir, "shadow")
	for _, d := range []string{ws, mnt, shadow} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	l, err := faultfuse.Mount(faultfuse.Config{Workspace: ws, Mountpoint: mnt, Shadow: shadow, Gate: faultfs.NewGate(faults.NewDecider(1, nil), nil, nil)})
	if err != nil {
		t.Fatalf("FUSE cannot mount here (needs root and /dev/fuse): %v", err)
	}
	defer l.Close()
	if err := os.WriteFile(filepath.Join(mnt, "x"), nil, 0o644); !errors.Is(err, syscall.EIO) {
		t.Fatalf("write before Begin: %v, want EIO", err)
	}
	if err := l.Begin(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mnt, "x"), []byte("1"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := l.End(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.ReadFile(filepath.Join(mnt, "x")); !errors.Is(err, syscall.EIO) {
		t.Fatalf("read after End: %v, want EIO", err)
	}
	if ents, _ := os.ReadDir(shadow); len(ents) != 0 {
		t.Fatalf("shadow still shows the workspace after End: %v", ents)
	}
}

// stNoSymfollow is statfs's ST_NOSYMFOLLOW flag (Linux 5.10+).
const stNoSymfollow = 0x2000
