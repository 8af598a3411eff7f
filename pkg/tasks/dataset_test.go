package tasks

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

var time0 = time.Unix(0, 0)

func taskIDs(ts []*Task) []string {
	var ids []string
	for _, t := range ts {
		ids = append(ids, t.ID)
	}
	return ids
}

// TestLoadDatasetFolder: task folders are found at any depth, each once, hidden folders
// skipped; every broken task is reported in the same error, and the good ones still load.
func TestLoadDatasetFolder(t *testing.T) {
	root := t.TempDir()
	writeTask(t, filepath.Join(root, "a"), goodTask())
	writeTask(t, filepath.Join(root, "group", "b"), goodTask())
	writeTask(t, filepath.Join(root, "group", "deeper", "c"), goodTask())
	writeTask(t, filepath.Join(root, ".git", "hidden"), goodTask())
	bad1 := goodTask()
	delete(bad1, "tests/test.sh")
	writeTask(t, filepath.Join(root, "group", "bad1"), bad1)
	bad2 := goodTask()
	bad2["task.toml"] = "[agent]\ntimeout_sec = 0\n"
	writeTask(t, filepath.Join(root, "bad2"), bad2)

	ds, err := LoadDataset(root)
	if err == nil {
		t.Fatal("broken tasks accepted")
	}
	msg := err.Error()
	for _, want := range []string{"task group/bad1: tests/test.sh: missing", "task bad2: agent.timeout_sec"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error lacks %q:\n%s", want, msg)
		}
	}
	if got := taskIDs(ds.Tasks); !slices.Equal(got, []string{"a", "group/b", "group/deeper/c"}) {
		t.Errorf("tasks %q", got)
	}
	if ds.Task("group/b") == nil || ds.Task("nope") != nil {
		t.Error("Task lookup")
	}
}

func TestLoadDatasetSingleTaskAndEmpty(t *testing.T) {
	root := t.TempDir()
	writeTask(t, filepath.Join(root, "only"), goodTask())
	ds, err := LoadDataset(filepath.Join(root, "only"))
	if err != nil || len(ds.Tasks) != 1 || ds.Tasks[0].ID != "only" {
		t.Fatalf("single task: %v %v", ds, err)
	}
	if _, err := LoadDataset(t.TempDir()); err == nil || !strings.Contains(err.Error(), "no task folders") {
		t.Fatalf("empty folder: %v", err)
	}
}

func TestLoadDatasetManifest(t *testing.T) {
	root := t.TempDir()
	writeTask(t, filepath.Join(root, "tasks", "a"), goodTask())
	writeTask(t, filepath.Join(root, "tasks", "b"), goodTask())
	write := func(s string) string {
		p := filepath.Join(root, "dataset.json")
		must(t, os.WriteFile(p, []byte(s), 0o644))
		return p
	}
	ds, err := LoadDataset(write(`{"name": "mine", "version": "1.0", "tasks": [{"name": "first", "path": "tasks/a"}, {"path": "tasks/b"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if got := taskIDs(ds.Tasks); !slices.Equal(got, []string{"first", "tasks/b"}) {
		t.Errorf("tasks %q", got)
	}
	for name, bad := range map[string]string{
		"unknown field": `{"tasks": [{"path": "tasks/a", "weight": 2}]}`,
		"git":           `{"tasks": [{"path": "a", "git_url": "https://example.com/x.git"}]}`,
		"escape":        `{"tasks": [{"path": "../outside"}]}`,
		"absolute":      `{"tasks": [{"path": "/etc"}]}`,
		"no tasks":      `{"name": "x"}`,
		"twice":         `{"tasks": [{"path": "tasks/a"}, {"path": "tasks/a/"}]}`,
		"missing":       `{"tasks": [{"path": "tasks/zzz"}]}`,
	} {
		if _, err := LoadDataset(write(bad)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestFilter(t *testing.T) {
	root := t.TempDir()
	for _, tc := range []struct{ id, difficulty, tags string }{
		{"shell/a", "easy", `["shell"]`},
		{"shell/b", "hard", `["shell", "text"]`},
		{"py/c", "medium", `["python", "text"]`},
		{"canary/d", "hard", `["shell"]`},
	} {
		files := goodTask()
		files["task.toml"] = "[metadata]\ndifficulty = \"" + tc.difficulty + "\"\ntags = " + tc.tags + "\n"
		if strings.HasPrefix(tc.id, "canary/") {
			files["task.toml"] += "canary = true\n"
		}
		writeTask(t, filepath.Join(root, tc.id), files)
	}
	ds, err := LoadDataset(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		f    Filter
		want []string
	}{
		{Filter{}, []string{"py/c", "shell/a", "shell/b"}},
		{Filter{Tags: []string{"text"}}, []string{"py/c", "shell/b"}},
		{Filter{Tags: []string{"text", "shell"}}, []string{"shell/b"}},
		{Filter{Difficulties: []string{"easy", "medium"}}, []string{"py/c", "shell/a"}},
		{Filter{Globs: []string{"shell/*"}}, []string{"shell/a", "shell/b"}},
		{Filter{Globs: []string{"shell/*"}, Tags: []string{"python"}}, nil},
		// A canary passes only a filter that lets canaries in.
		{Filter{Globs: []string{"canary/*"}}, nil},
		{Filter{Tags: []string{"shell"}, Canaries: true}, []string{"canary/d", "shell/a", "shell/b"}},
	} {
		if got := taskIDs(ds.Select(tc.f)); !slices.Equal(got, tc.want) {
			t.Errorf("%+v: %q, want %q", tc.f, got, tc.want)
		}
	}
	if d := ds.Task("canary/d"); d == nil || !d.Config.Metadata.Canary || d.Config.Metadata.Extra["canary"] != nil {
		t.Errorf("canary/d's metadata: %+v", d)
	}
	if err := (Filter{Globs: []string{"["}, Difficulties: []string{"nightmare"}}).Check(); err == nil || len(Problems(err)) != 2 {
		t.Errorf("Check: %v", err)
	}
}
