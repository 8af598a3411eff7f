package faultfs_test

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/catalogue"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/faultfs"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/inject"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
)

func newFS(t *testing.T, spec string) (*faultfs.FS, string, *[]string) {
	t.Helper()
	_, rules, err := plans.ParseSpec([]byte("name: fs-test\nfaults:\n" + spec))
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	var fired []string
	f, err := faultfs.New(root, inject.NewDecider(7, rules), func(_ string, _ catalogue.Event, fs []catalogue.Fired) {
		for _, x := range fs {
			fired = append(fired, x.Kind)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return f, root, &fired
}

func TestENOSPCReachesWrite(t *testing.T) {
	f, root, fired := newFS(t, "  - {id: full, kind: disk_full, match: {paths: [\"/data/*\"]}}\n")
	if err := os.Mkdir(filepath.Join(root, "data"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "data", "log"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	file, err := f.OpenFile("data/log", os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	n, err := file.Write([]byte("hello\n"))
	if n != 0 || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("write = %d, %v; want 0, ENOSPC", n, err)
	}
	var pe *os.PathError
	if !errors.As(err, &pe) || pe.Op != "write" || pe.Path != "data/log" {
		t.Fatalf("error %#v does not name the op and path", err)
	}
	if len(*fired) != 1 || (*fired)[0] != catalogue.KindDiskFull {
		t.Fatalf("fired %v", *fired)
	}
	// Outside the matched paths, writes succeed.
	if err := f.WriteFile("notes.txt", []byte("ok"), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestStorageAborts(t *testing.T) {
	t.Run("inode exhaustion fails creates, not writes", func(t *testing.T) {
		f, root, _ := newFS(t, "  - {id: inodes, kind: inode_exhaustion}\n")
		_ = os.WriteFile(filepath.Join(root, "old"), nil, 0o644)
		if err := f.WriteFile("new", []byte("x"), 0o644); !errors.Is(err, syscall.ENOSPC) {
			t.Fatalf("create: %v, want ENOSPC", err)
		}
		if err := f.Mkdir("dir", 0o755); !errors.Is(err, syscall.ENOSPC) {
			t.Fatalf("mkdir: %v, want ENOSPC", err)
		}
		if err := f.WriteFile("old", []byte("x"), 0o644); err != nil {
			t.Fatalf("write to an existing file: %v", err)
		}
	})
	t.Run("too many open files", func(t *testing.T) {
		f, root, _ := newFS(t, "  - {id: emfile, kind: too_many_open_files}\n")
		_ = os.WriteFile(filepath.Join(root, "a"), []byte("x"), 0o644)
		if _, err := f.Open("a"); !errors.Is(err, syscall.EMFILE) {
			t.Fatalf("open: %v, want EMFILE", err)
		}
	})
	t.Run("read-only", func(t *testing.T) {
		f, root, _ := newFS(t, "  - {id: ro, kind: read_only, match: {ops: [write, remove]}}\n")
		_ = os.WriteFile(filepath.Join(root, "a"), []byte("x"), 0o644)
		file, err := f.OpenFile("a", os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer file.Close()
		if _, err := file.Write([]byte("y")); !errors.Is(err, syscall.EROFS) {
			t.Fatalf("write: %v, want EROFS", err)
		}
		if err := f.Remove("a"); !errors.Is(err, syscall.EROFS) {
			t.Fatalf("remove: %v, want EROFS", err)
		}
		if b, err := f.ReadFile("a"); err != nil || string(b) != "x" {
			t.Fatalf("read: %q, %v", b, err)
		}
	})
	t.Run("lock contention", func(t *testing.T) {
		f, root, _ := newFS(t, "  - {id: lock, kind: lock_contention, params: {wait_ms: 30}}\n")
		_ = os.WriteFile(filepath.Join(root, "db.lock"), nil, 0o644)
		file, err := f.OpenFile("db.lock", os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer file.Close()
		start := time.Now()
		if err := file.Lock(); !errors.Is(err, syscall.EWOULDBLOCK) {
			t.Fatalf("lock: %v, want EWOULDBLOCK", err)
		}
		if time.Since(start) < 30*time.Millisecond {
			t.Fatal("lock contention did not wait")
		}
	})
}

func TestShortWriteAndLatency(t *testing.T) {
	f, root, _ := newFS(t, `
  - {id: short, kind: short_write, params: {keep_fraction: 0.25}}
  - {id: slow, kind: io_latency, match: {ops: [write]}, params: {mean_ms: 25}}
`)
	file, err := f.Create("out")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	n, err := file.Write(make([]byte, 1000))
	file.Close()
	if n != 250 || !errors.Is(err, io.ErrShortWrite) {
		t.Fatalf("write = %d, %v; want 250, short write", n, err)
	}
	if time.Since(start) < 25*time.Millisecond {
		t.Fatal("io_latency did not delay the write")
	}
	if st, _ := os.Stat(filepath.Join(root, "out")); st.Size() != 250 {
		t.Fatalf("file holds %d bytes, want the 250 written", st.Size())
	}
}

func TestPathsCannotEscapeRoot(t *testing.T) {
	f, root, _ := newFS(t, "")
	if err := f.WriteFile("../../escape", []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	// "../../escape" is cleaned against the root, so it lands inside it.
	if _, err := os.Stat(filepath.Join(root, "escape")); err != nil {
		t.Fatalf("cleaned path not under the root: %v", err)
	}
}
