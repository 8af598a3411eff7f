package ctrd

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"testing"
)

func TestBaseLayoutIsDeterministic(t *testing.T) {
	agentBin := filepath.Join(t.TempDir(), "agent")
	if err := os.WriteFile(agentBin, []byte("not really an agent"), 0o755); err != nil {
		t.Fatal(err)
	}
	a, err := baseLayout(agentBin)
	if err != nil {
		t.Fatal(err)
	}
	b, err := baseLayout(agentBin)
	if err != nil {
		t.Fatal(err)
	}
	if a.manifest != b.manifest || !bytes.Equal(a.tar, b.tar) {
		t.Fatalf("two builds from the same inputs differ: %s vs %s", a.manifest, b.manifest)
	}
	names := map[string]bool{}
	tr := tar.NewReader(bytes.NewReader(a.tar))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names[h.Name] = true
	}
	for _, want := range []string{"oci-layout", "index.json", "blobs/sha256/" + a.manifest.Encoded()} {
		if !names[want] {
			t.Errorf("layout has no %s", want)
		}
	}
	if err := os.WriteFile(agentBin, []byte("another agent"), 0o755); err != nil {
		t.Fatal(err)
	}
	c, err := baseLayout(agentBin)
	if err != nil {
		t.Fatal(err)
	}
	if c.manifest == a.manifest {
		t.Fatal("a different agent gave the same image digest")
	}
	if _, err := baseLayout(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Fatal("a missing agent binary gave no error")
	}
}

func TestMergeEnvLastWins(t *testing.T) {
	got := mergeEnv([]string{"A=1", "B=2", "A=3", "C=", "B=4"})
	want := []string{"A=3", "B=4", "C="}
	if len(got) != len(want) {
		t.Fatalf("got %q, want %q", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("got %q, want %q", got, want)
		}
	}
}
