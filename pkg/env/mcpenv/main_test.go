package mcpenv_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/env/mcpenv"
)

// notesDir is a copy of examples/mcp-notes-server's declaration with the server built
// into its bin/, made once, by the first test that needs it (fuzzing workers never do).
var (
	notesDir  string
	notesOnce sync.Once
	notesErr  error
	tmpDir    string
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "mcpenv-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	tmpDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// NotesDir builds examples/mcp-notes-server (statically) into dir/bin and copies its
// declaration beside it.
func NotesDir(dir string) error {
	root, err := filepath.Abs("../../..")
	if err != nil {
		return err
	}
	ex := filepath.Join(root, "examples", "mcp-notes-server")
	// Static, as docs/mcp.md tells: a containerd sandbox's root has no C library.
	cmd := exec.Command("go", "build", "-o", filepath.Join(dir, "bin", "mcp-notes-server"), ".")
	cmd.Dir = ex
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build the notes server: %v: %s", err, out)
	}
	decl, err := os.ReadFile(filepath.Join(ex, "notes.yaml"))
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "notes.yaml"), decl, 0o644)
}

// notes loads the test's notes declaration.
func notes(t testing.TB) *mcpenv.Decl {
	t.Helper()
	notesOnce.Do(func() {
		if notesErr = NotesDir(tmpDir); notesErr == nil {
			notesDir = tmpDir
		}
	})
	if notesErr != nil {
		t.Fatal(notesErr)
	}
	d, err := mcpenv.Load(filepath.Join(notesDir, "notes.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return d
}
