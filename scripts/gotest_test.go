package scripts

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestGotestRemovesOnlyItsOwnDirectories runs scripts/gotest.sh on a test that go test's
// timeout kills, so it leaves its t.TempDir behind, while a directory of another go test
// on the same machine, named as t.TempDir names them and newer than the run's start, sits
// in the same $TMPDIR with nothing holding it open (between two of its steps, say). The
// script must remove the first and leave the second alone.
func TestGotestRemovesOnlyItsOwnDirectories(t *testing.T) {
	if os.Getenv("GAUNTLET_GOTEST_HELPER") != "" {
		t.Skip("the helper run's own copy of this test")
	}
	tmp := t.TempDir()
	other := filepath.Join(tmp, "TestAnotherRunsTest1234567890")
	if err := os.MkdirAll(filepath.Join(other, "001"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(other, "001", "tenants.yaml"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Made while this run goes on: newer than anything the script marks at its start.
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(other, later, later); err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command("bash", "scripts/gotest.sh", "-count=1", "-timeout", "5s",
		"-run", "^TestHelperLeavesItsDirectory$", "./scripts/")
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp, "GAUNTLET_GOTEST_HELPER=1")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "panic: test timed out") {
		t.Fatalf("gotest.sh on a test that outlives its timeout: %v, want go test's timeout\n%s", err, out)
	}

	if _, err := os.Stat(filepath.Join(other, "001", "tenants.yaml")); err != nil {
		t.Errorf("another run's directory was touched: %v", err)
	}
	left, err := os.ReadDir(tmp)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range left {
		if e.Name() != filepath.Base(other) {
			t.Errorf("gotest.sh left %s in $TMPDIR", e.Name())
		}
	}
}

// TestHelperLeavesItsDirectory is the test TestGotestRemovesOnlyItsOwnDirectories runs:
// it makes a temporary directory and outlives go test's timeout, which ends it with no
// cleanup.
func TestHelperLeavesItsDirectory(t *testing.T) {
	if os.Getenv("GAUNTLET_GOTEST_HELPER") == "" {
		t.Skip("run by TestGotestRemovesOnlyItsOwnDirectories")
	}
	if err := os.WriteFile(filepath.Join(t.TempDir(), "left"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Minute)
}
