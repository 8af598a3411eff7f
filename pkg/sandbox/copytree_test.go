package sandbox

import (
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestCopyTree copies a tree holding a set-uid file, a link out of the tree and a fifo
// between two roots: the file arrives with its contents and the kept mode bits, the link
// as the same link (not followed), the fifo not at all, and every entry owned as told.
func TestCopyTree(t *testing.T) {
	srcDir, dstDir := t.TempDir(), t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(srcDir, "app", "bin"), 0o755))
	must(os.WriteFile(filepath.Join(srcDir, "app", "bin", "run"), []byte("#!/bin/sh\n"), 0o755))
	must(os.Chmod(filepath.Join(srcDir, "app", "bin", "run"), fs.ModeSetuid|0o755))
	must(os.Symlink("../../../../etc/passwd", filepath.Join(srcDir, "app", "out")))
	must(syscall.Mkfifo(filepath.Join(srcDir, "app", "pipe"), 0o644))
	must(os.MkdirAll(filepath.Join(dstDir, "ws"), 0o755))

	from, err := os.OpenRoot(srcDir)
	must(err)
	defer from.Close()
	to, err := os.OpenRoot(dstDir)
	must(err)
	defer to.Close()
	owned := 0
	owner := func(fs.FileInfo) (int, int) { owned++; return 1234, 5678 }
	must(CopyTree(from, "app", to, "ws/app", fs.ModePerm, owner))

	run := filepath.Join(dstDir, "ws", "app", "bin", "run")
	if b, err := os.ReadFile(run); err != nil || string(b) != "#!/bin/sh\n" {
		t.Errorf("copied file: %q, %v", b, err)
	}
	fi, err := os.Lstat(run)
	must(err)
	if fi.Mode() != 0o755 {
		t.Errorf("copied file's mode %v, want the set-uid bit dropped: -rwxr-xr-x", fi.Mode())
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != 1234 || st.Gid != 5678 {
		t.Errorf("copied file owned by %d:%d, want 1234:5678", st.Uid, st.Gid)
	}
	if link, err := os.Readlink(filepath.Join(dstDir, "ws", "app", "out")); err != nil || link != "../../../../etc/passwd" {
		t.Errorf("copied link: %q, %v; want the same link", link, err)
	}
	if _, err := os.Lstat(filepath.Join(dstDir, "ws", "app", "pipe")); !os.IsNotExist(err) {
		t.Errorf("the fifo was copied: %v", err)
	}
	if owned != 4 { // app, app/bin, app/bin/run, app/out
		t.Errorf("owner asked %d times, want 4", owned)
	}

	// With the set-id bits kept, as the containerd runtime copies within one image.
	must(CopyTree(from, "app/bin", to, "ws/bin", fs.ModePerm|fs.ModeSetuid, owner))
	if fi, err := os.Lstat(filepath.Join(dstDir, "ws", "bin", "run")); err != nil || fi.Mode() != fs.ModeSetuid|0o755 {
		t.Errorf("with set-uid kept: %v, %v", fi.Mode(), err)
	}
}
