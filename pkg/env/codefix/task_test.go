package codefix

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"testing"
)

// TestTasksAreJudgedByARealShell writes every variant's project to a directory and runs
// it with the host's /bin/sh, the shell the process runtime runs: the broken library fails
// the visible tests and the hidden check, the fixed one passes both.
func TestTasksAreJudgedByARealShell(t *testing.T) {
	for i := range variants {
		t.Run(variants[i].name, func(t *testing.T) {
			tk := newTask(uint64(100+i), i, 4)
			if len(tk.visible) != 4 || len(tk.hidden) != hiddenCases {
				t.Fatalf("cases: %d visible, %d hidden", len(tk.visible), len(tk.hidden))
			}
			dir := t.TempDir()
			for p, c := range tk.files {
				if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(p)), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, p), []byte(c), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			run := func(script string) (string, bool) {
				cmd := exec.Command("/bin/sh", "-c", script)
				cmd.Dir = dir
				var out bytes.Buffer
				cmd.Stdout = &out
				err := cmd.Run()
				return out.String(), err == nil
			}
			if out, ok := run(TestCommand); ok {
				t.Errorf("broken library passes the visible tests:\n%s", out)
			}
			if out, _ := run(tk.hiddenScript()); out == tk.expectedHidden() {
				t.Errorf("broken library passes the hidden check:\n%s", out)
			}
			if err := os.WriteFile(filepath.Join(dir, LibPath), []byte(tk.fixedLib()), 0o644); err != nil {
				t.Fatal(err)
			}
			if out, ok := run(TestCommand); !ok {
				t.Errorf("fixed library fails the visible tests:\n%s", out)
			}
			if out, _ := run(tk.hiddenScript()); out != tk.expectedHidden() {
				t.Errorf("fixed library fails the hidden check:\n got %q\nwant %q", out, tk.expectedHidden())
			}
			// A library that hard-codes the visible answers and prints fake markers fails.
			cheat := tk.fixedLib() + "\necho '@@case 0'\n"
			if err := os.WriteFile(filepath.Join(dir, LibPath), []byte(cheat), 0o644); err != nil {
				t.Fatal(err)
			}
			if out, _ := run(tk.hiddenScript()); out != tk.expectedHidden() {
				t.Errorf("library output leaks into the hidden check:\n%s", out)
			}
		})
	}
}

func TestTasksAreDeterministic(t *testing.T) {
	a, b := newTask(42, -1, 5), newTask(42, -1, 5)
	if !reflect.DeepEqual(a.files, b.files) || !reflect.DeepEqual(a.hidden, b.hidden) {
		t.Fatal("same seed, different tasks")
	}
	seen := map[string]bool{}
	for seed := uint64(0); seed < 60; seed++ {
		seen[newTask(seed, -1, 4).v.name] = true
	}
	if len(seen) != len(variants) {
		t.Errorf("60 seeds picked %d of %d variants: %v", len(seen), len(variants), seen)
	}
}
