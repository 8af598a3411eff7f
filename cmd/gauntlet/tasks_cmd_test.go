package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeFiles writes path: content under dir; ".sh" files are executable.
func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for rel, content := range files {
		p := filepath.Join(dir, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		mode := os.FileMode(0o644)
		if strings.HasSuffix(rel, ".sh") {
			mode = 0o755
		}
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
	}
}

func runTasksCmd(args ...string) (string, string, error) {
	var out, errOut bytes.Buffer
	err := runMain(context.Background(), append([]string{"tasks"}, args...), &out, &errOut)
	return out.String(), errOut.String(), err
}

// TestTasksValidateListsEveryProblem: validate exits with an error and names every problem
// of every broken task, and still counts the good ones.
func TestTasksValidateListsEveryProblem(t *testing.T) {
	root := t.TempDir()
	if out, _, err := runTasksCmd("generate", "--n", "3", "--seed", "5", root); err != nil {
		t.Fatalf("generate: %v %s", err, out)
	}
	writeFiles(t, root, map[string]string{
		"broken-a/task.toml":              "[agent]\ntimeout_sec = -1\n[verifier]\nretries = 3\n",
		"broken-a/instruction.md":         "do it\n",
		"broken-a/environment/Dockerfile": "FROM debian:bookworm-slim\n",
		"nested/broken-b/task.toml":       "[metadata]\ndifficulty = \"impossible\"\n",
		"nested/broken-b/tests/test.sh":   "#!/bin/bash\n",
	})
	out, _, err := runTasksCmd("validate", root)
	if err == nil {
		t.Fatalf("validate passed a broken dataset:\n%s", out)
	}
	for _, want := range []string{
		"BAD broken-a:", "agent.timeout_sec", "verifier.retries: unknown key", "tests/test.sh: missing",
		"BAD nested/broken-b:", "metadata.difficulty", "instruction.md: missing", "environment: missing",
		"3 tasks valid, 2 invalid",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("validate output lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(err.Error(), "2 invalid") {
		t.Errorf("error %v", err)
	}

	out, _, err = runTasksCmd("validate", filepath.Join(root, "gen-000000-sum"))
	if err != nil || !strings.Contains(out, "1 tasks valid, 0 invalid") {
		t.Errorf("validate of one good task: %v\n%s", err, out)
	}
}

func TestTasksLsAndDescribe(t *testing.T) {
	root := t.TempDir()
	if _, _, err := runTasksCmd("generate", "--n", "6", root); err != nil {
		t.Fatal(err)
	}
	out, _, err := runTasksCmd("ls", root, "--tag", "sum", "--difficulty", "easy")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "gen-000000-sum") || strings.Contains(out, "gen-000003-sum") || !strings.Contains(out, "1 of 6 tasks") {
		t.Errorf("ls --tag sum --difficulty easy:\n%s", out)
	}
	out, _, err = runTasksCmd("ls", "--glob", "gen-00000[45]-*", "--json", root)
	if err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 2 || !strings.Contains(lines[0], `"id":"gen-000004-count"`) {
		t.Errorf("ls --glob --json:\n%s", out)
	}
	if _, _, err := runTasksCmd("ls", root, "--difficulty", "nightmare"); err == nil {
		t.Error("ls accepted an unknown difficulty")
	}

	out, _, err = runTasksCmd("describe", filepath.Join(root, "gen-000004-count"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"digest:", "sha256:", "difficulty:", "medium", "timeouts:", "agent 2m0s, verifier 30s", "metadata.seed:", "Generated task 4"} {
		if !strings.Contains(out, want) {
			t.Errorf("describe lacks %q:\n%s", want, out)
		}
	}
	if _, _, err := runTasksCmd("describe", root); err == nil {
		t.Error("describe of a folder that is no task succeeded")
	}
}
