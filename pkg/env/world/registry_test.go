package world

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
)

func writeWorld(t *testing.T, dir, file, name string) {
	t.Helper()
	src := strings.Replace(small, "name: tiny", "name: "+name, 1)
	if err := os.WriteFile(filepath.Join(dir, file), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestUserWorldsRegister: a directory's worlds become envs; registering it again is a
// no-op; a changed world, a name clash and an invalid file are refused at start,
// before anything of the directory is registered.
func TestUserWorldsRegister(t *testing.T) {
	dir := t.TempDir()
	writeWorld(t, dir, "a.yaml", "tiny_registered")
	os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("not a world"), 0o644)
	cfg := Config{Dir: dir}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Register(); err != nil {
		t.Fatal(err)
	}
	e, err := env.Lookup("tiny_registered")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := Of(e); !ok {
		t.Fatalf("registered env is not a world: %T", e)
	}
	if err := cfg.Register(); err != nil {
		t.Fatalf("registering the same directory again: %v", err)
	}

	changed := t.TempDir()
	src := strings.Replace(strings.Replace(small, "name: tiny", "name: tiny_registered", 1), "n >= 9", "n >= 8", 1)
	os.WriteFile(filepath.Join(changed, "a.yaml"), []byte(src), 0o644)
	if err := (&Config{Dir: changed}).Validate(); !errors.Is(err, ErrNameTaken) {
		t.Fatalf("changed world: got %v, want ErrNameTaken", err)
	}

	clash := t.TempDir()
	writeWorld(t, clash, "bank.yaml", "bank")
	writeWorld(t, clash, "fresh.yaml", "tiny_fresh")
	if err := (&Config{Dir: clash}).Register(); !errors.Is(err, ErrNameTaken) || !strings.Contains(err.Error(), "env.worlds") {
		t.Fatalf("clash with the built-in bank: got %v", err)
	}
	if _, err := env.Lookup("tiny_fresh"); err == nil {
		t.Fatal("a directory with a clash registered some of its worlds")
	}

	dup := t.TempDir()
	writeWorld(t, dup, "a.yaml", "tiny_dup")
	writeWorld(t, dup, "b.yml", "tiny_dup")
	if err := (&Config{Dir: dup}).Validate(); !errors.Is(err, ErrNameTaken) {
		t.Fatalf("two files of one name: got %v", err)
	}

	bad := t.TempDir()
	os.WriteFile(filepath.Join(bad, "x.yaml"), []byte("name: x\ncolour: red\n"), 0o644)
	writeWorld(t, bad, "y.yaml", "bank")
	err = (&Config{Dir: bad}).Validate()
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), filepath.Join(bad, "x.yaml")+":2:1: colour: unknown key") {
		t.Fatalf("invalid file: got %v", err)
	}
	if !errors.Is(err, ErrNameTaken) {
		t.Fatalf("the clash of a valid file is not reported with the invalid file's errors: %v", err)
	}
	if err := (&Config{Dir: filepath.Join(dir, "missing")}).Validate(); err == nil {
		t.Fatal("a missing directory validated")
	}
}

// TestGraphOfBank: the causal graph links each rule to the tools that change what it
// reads.
func TestGraphOfBank(t *testing.T) {
	w, _ := Of(bank(t))
	g := w.Graph()
	var b strings.Builder
	if err := g.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"fraud.verify [fraud]\n  changes: transfer.status\n",
		"  requires code_before_verify: transfer[args.transfer_id].code_sent\n    reads: transfer, transfer.code_sent\n    changed by: transfer.create, fraud.request_code\n",
		"  requires daily_limit: sent_today + args.amount <= daily_limit\n    reads: daily_limit, sent_today\n    changed by: transfer.create, transfer.cancel\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("graph lacks %q:\n%s", want, b.String())
		}
	}
	b.Reset()
	if err := g.WriteDOT(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`digraph "bank" {`, `"state:transfer.code_sent" -> "tool:fraud.verify" [label="code_before_verify"];`, `"tool:fraud.request_code" -> "state:transfer.code_sent" [style=dashed];`} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("DOT lacks %q:\n%s", want, b.String())
		}
	}
}
