package codefix

import (
	"os"
	"path/filepath"
	"testing"
)

// TestHostListingRefusesALinkedWorkspace: a workspace path whose last component a
// sandbox swapped for a link (containerd's /proc/PID/root/workspace) is not followed, so
// the listing never hashes files outside the sandbox; a real folder is listed.
func TestHostListingRefusesALinkedWorkspace(t *testing.T) {
	dir := t.TempDir()
	real := filepath.Join(dir, "real")
	if err := os.MkdirAll(real, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(real, "a"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := hostListing(real); err != nil || len(got) != 1 {
		t.Fatalf("listing of a folder: %v, %v", got, err)
	}
	link := filepath.Join(dir, "workspace")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	if got, err := hostListing(link); err == nil {
		t.Errorf("listing through a link: %v, want an error", got)
	}
}
