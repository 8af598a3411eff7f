package tasks

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// writeTask writes files (path relative to dir: content) under dir; a content of "\x00dir"
// makes a folder, and a path ending in ".sh" is executable.
func writeTask(t testing.TB, dir string, files map[string]string) {
	t.Helper()
	for rel, content := range files {
		p := filepath.Join(dir, filepath.FromSlash(rel))
		if content == "\x00dir" {
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
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

// goodTask is a minimal valid task folder.
func goodTask() map[string]string {
	return map[string]string{
		"task.toml":              "version = \"1.0\"\n[metadata]\ndifficulty = \"easy\"\ntags = [\"shell\"]\n[agent]\ntimeout_sec = 60\n[verifier]\ntimeout_sec = 30\n",
		"instruction.md":         "Write hello to /app/out.txt.\n",
		"environment/Dockerfile": "FROM debian:bookworm-slim\nWORKDIR /app\n",
		"tests/test.sh":          "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n",
		"solution/solve.sh":      "#!/bin/bash\necho hello > /app/out.txt\n",
	}
}

func TestLoadGoodTask(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "hello")
	writeTask(t, dir, goodTask())
	task, err := Load(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	if task.ID != "hello" || task.Instruction != "Write hello to /app/out.txt.\n" || !task.HasSolution {
		t.Errorf("task %+v", task)
	}
	if task.Environment.Dockerfile != filepath.Join(dir, "environment", "Dockerfile") || task.Environment.Context != filepath.Join(dir, "environment") || task.Environment.Image != "" {
		t.Errorf("environment %+v", task.Environment)
	}
	if !strings.HasPrefix(task.Digest, "sha256:") || len(task.Digest) != len("sha256:")+64 {
		t.Errorf("digest %q", task.Digest)
	}
	if task.Name() != "hello" {
		t.Errorf("Name = %q", task.Name())
	}
}

func TestLoadImageOnlyAndNoSolution(t *testing.T) {
	dir := t.TempDir()
	files := goodTask()
	delete(files, "environment/Dockerfile")
	delete(files, "solution/solve.sh")
	files["task.toml"] += "[environment]\ndocker_image = \"localhost:5000/base/bookworm:1\"\n"
	writeTask(t, dir, files)
	task, err := Load(dir, "img")
	if err != nil {
		t.Fatal(err)
	}
	if task.Environment.Image != "localhost:5000/base/bookworm:1" || task.Environment.Dockerfile != "" || task.HasSolution {
		t.Errorf("task %+v", task)
	}
}

// TestLoadReportsEveryProblem: one Load names each problem of the task with its field.
func TestLoadReportsEveryProblem(t *testing.T) {
	dir := t.TempDir()
	writeTask(t, dir, map[string]string{
		"task.toml":               "[verifier]\ntimeout_sec = -5\n[agent]\ncolour = 1\n",
		"instruction.md":          "   \n",
		"environment/notes.txt":   "no Dockerfile here",
		"environment/compose.txt": "",
		"solution/README":         "no solve.sh",
		"steps":                   "\x00dir",
	})
	_, err := Load(dir, "broken")
	if err == nil {
		t.Fatal("accepted")
	}
	var fields []string
	for _, p := range Problems(err) {
		var fe *FieldError
		if !errors.As(p, &fe) {
			t.Fatalf("%v is not a *FieldError", p)
		}
		if fe.Task != "broken" {
			t.Errorf("problem %v names task %q", p, fe.Task)
		}
		fields = append(fields, fe.Field)
	}
	want := []string{"verifier.timeout_sec", "agent.colour", InstructionFile, TestScript, SolutionScript, EnvironmentDir, "steps"}
	for _, f := range want {
		if !slices.Contains(fields, f) {
			t.Errorf("no problem for %s in %q", f, fields)
		}
	}
	if len(fields) != len(want) {
		t.Errorf("problems %q, want %q", fields, want)
	}
	if !strings.Contains(err.Error(), "task broken: tests/test.sh: missing") {
		t.Errorf("error does not name the task and the file:\n%v", err)
	}
	if !errors.Is(err, ErrMissing) || !errors.Is(err, ErrUnsupported) {
		t.Errorf("sentinels not found in %v", err)
	}
}

func TestLoadRefusesSymlinkedTestScript(t *testing.T) {
	dir := t.TempDir()
	files := goodTask()
	delete(files, "tests/test.sh")
	files["tests"] = "\x00dir"
	writeTask(t, dir, files)
	must(t, os.Symlink("/etc/passwd", filepath.Join(dir, "tests", "test.sh")))
	if _, err := Load(dir, ""); !errors.Is(err, ErrNotRegular) {
		t.Fatalf("symlinked test.sh: %v", err)
	}
}

func TestLoadRefusesCompose(t *testing.T) {
	dir := t.TempDir()
	files := goodTask()
	files["environment/docker-compose.yaml"] = "services: {}\n"
	writeTask(t, dir, files)
	if _, err := Load(dir, ""); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("compose: %v", err)
	}
}

// TestDigestCoversContentModeAndPaths: the digest changes with any byte, the execute bit,
// a rename or a new file anywhere in the folder, and with nothing else.
func TestDigestCoversContentModeAndPaths(t *testing.T) {
	base := t.TempDir()
	mk := func(name string, edit func(dir string)) string {
		dir := filepath.Join(base, name)
		writeTask(t, dir, goodTask())
		if edit != nil {
			edit(dir)
		}
		d, err := Digest(dir)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	orig := mk("orig", nil)
	if again := mk("again", nil); again != orig {
		t.Fatalf("same content, other folder: %s != %s", again, orig)
	}
	same := map[string]func(string){
		"group write bit": func(d string) { must(t, os.Chmod(filepath.Join(d, "task.toml"), 0o664)) },
		"empty folder":    func(d string) { must(t, os.Mkdir(filepath.Join(d, "environment", "empty"), 0o755)) },
		"mtime": func(d string) {
			must(t, os.Chtimes(filepath.Join(d, "instruction.md"), time0, time0))
		},
	}
	for name, edit := range same {
		if got := mk("same-"+strings.ReplaceAll(name, " ", "-"), edit); got != orig {
			t.Errorf("%s changed the digest", name)
		}
	}
	differ := map[string]func(string){
		"one byte": func(d string) {
			writeTask(t, d, map[string]string{"tests/test.sh": "#!/bin/bash\necho 0 > /logs/verifier/reward.txt\n"})
		},
		"execute bit": func(d string) { must(t, os.Chmod(filepath.Join(d, "instruction.md"), 0o755)) },
		"new file":    func(d string) { writeTask(t, d, map[string]string{"environment/data.csv": ""}) },
		"hidden file": func(d string) { writeTask(t, d, map[string]string{"tests/.hidden": "x"}) },
		"rename":      func(d string) { must(t, os.Rename(filepath.Join(d, "solution"), filepath.Join(d, "solutions"))) },
		"symlink":     func(d string) { must(t, os.Symlink("Dockerfile", filepath.Join(d, "environment", "link"))) },
		"content move": func(d string) {
			writeTask(t, d, map[string]string{"instruction.md": "Write hello to /app/out.txt.", "task.toml": goodTask()["task.toml"] + "\n"})
		},
	}
	seen := map[string]string{orig: "orig"}
	for name, edit := range differ {
		got := mk("differ-"+strings.ReplaceAll(name, " ", "-"), edit)
		if prev, dup := seen[got]; dup {
			t.Errorf("%s gives the digest of %s", name, prev)
		}
		seen[got] = name
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
