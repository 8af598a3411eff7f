package tasks

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// Dataset is a set of tasks read from one folder or manifest.
type Dataset struct {
	// Root is the folder task IDs are relative to (the manifest's folder for a manifest).
	Root string
	// Tasks are sorted by ID.
	Tasks []*Task
}

// Manifest is a dataset listed in a JSON file, in the shape of a dataset of Harbor's
// registry: a name, a version, a description and the tasks by path. gauntlet reads only
// local paths (relative to the manifest's folder); a task fetched from git_url at
// git_commit_id is refused, as nothing here reaches a remote repository.
type Manifest struct {
	Name        string          `json:"name"`
	Version     string          `json:"version"`
	Description string          `json:"description"`
	Tasks       []ManifestEntry `json:"tasks"`
}

// ManifestEntry is one task of a Manifest.
type ManifestEntry struct {
	// Name is the task's ID in the dataset; its path when empty.
	Name        string `json:"name"`
	GitURL      string `json:"git_url"`
	GitCommitID string `json:"git_commit_id"`
	Path        string `json:"path"`
}

// LoadDataset reads the dataset at p: a task folder (a dataset of one), a folder searched
// recursively for task folders, or a JSON manifest. Every task is read; the error joins
// every task's problems, and the Dataset then holds the tasks that had none.
func LoadDataset(p string) (*Dataset, error) {
	abs, err := filepath.Abs(p)
	if err != nil {
		return nil, fmt.Errorf("load dataset %s: %w", p, err)
	}
	fi, err := os.Stat(abs)
	if err != nil {
		return nil, fmt.Errorf("load dataset: %w", err)
	}
	var dirs, ids []string
	ds := &Dataset{Root: abs}
	var errs []error
	switch {
	case !fi.IsDir():
		ds.Root = filepath.Dir(abs)
		dirs, ids, err = readManifest(abs)
		if err != nil {
			return nil, err
		}
	case isTaskDir(abs):
		ds.Root = filepath.Dir(abs)
		dirs, ids = []string{abs}, []string{filepath.Base(abs)}
	default:
		dirs, ids, err = findTasks(abs)
		if err != nil {
			return nil, err
		}
		if len(dirs) == 0 {
			return nil, fmt.Errorf("load dataset %s: no task folders (folders holding %s) in it", p, ConfigFile)
		}
	}
	seen := map[string]bool{}
	for i, dir := range dirs {
		if seen[ids[i]] {
			errs = append(errs, &FieldError{Task: ids[i], Err: errors.New("listed twice")})
			continue
		}
		seen[ids[i]] = true
		t, err := Load(dir, ids[i])
		if err != nil {
			errs = append(errs, err)
			continue
		}
		ds.Tasks = append(ds.Tasks, t)
	}
	sort.Slice(ds.Tasks, func(i, j int) bool { return ds.Tasks[i].ID < ds.Tasks[j].ID })
	return ds, errors.Join(errs...)
}

func isTaskDir(dir string) bool {
	_, err := os.Lstat(filepath.Join(dir, ConfigFile))
	return err == nil
}

// findTasks walks root for task folders: a folder holding task.toml is a task and is not
// searched further; hidden folders (.git) are skipped; symlinked folders are not followed.
func findTasks(root string) (dirs, ids []string, err error) {
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		if p != root && strings.HasPrefix(d.Name(), ".") {
			return filepath.SkipDir
		}
		if isTaskDir(p) {
			rel, err := filepath.Rel(root, p)
			if err != nil {
				return err
			}
			dirs = append(dirs, p)
			ids = append(ids, filepath.ToSlash(rel))
			return filepath.SkipDir
		}
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("find tasks under %s: %w", root, err)
	}
	return dirs, ids, nil
}

// readManifest reads a JSON manifest strictly (unknown fields refused) and resolves its
// entries against the manifest's folder. Entries may not leave that folder.
func readManifest(file string) (dirs, ids []string, err error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, nil, fmt.Errorf("read manifest: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var m Manifest
	if err := dec.Decode(&m); err != nil {
		return nil, nil, fmt.Errorf("read manifest %s: %w", file, err)
	}
	if dec.More() {
		return nil, nil, fmt.Errorf("read manifest %s: more than one JSON value", file)
	}
	if len(m.Tasks) == 0 {
		return nil, nil, fmt.Errorf("read manifest %s: no tasks", file)
	}
	base := filepath.Dir(file)
	var errs []error
	for i, e := range m.Tasks {
		field := fmt.Sprintf("%s: tasks[%d]", filepath.Base(file), i)
		clean := path.Clean(e.Path)
		switch {
		case e.GitURL != "" || e.GitCommitID != "":
			errs = append(errs, fmt.Errorf("%s: git_url: tasks fetched from git are %w; check the repository out and list local paths", field, ErrUnsupported))
			continue
		case e.Path == "":
			errs = append(errs, fmt.Errorf("%s: path: %w", field, ErrMissing))
			continue
		case path.IsAbs(e.Path) || clean == ".." || strings.HasPrefix(clean, "../"):
			errs = append(errs, fmt.Errorf("%s: path %q leaves the manifest's folder", field, e.Path))
			continue
		}
		id := e.Name
		if id == "" {
			id = clean
		}
		dirs = append(dirs, filepath.Join(base, filepath.FromSlash(clean)))
		ids = append(ids, id)
	}
	if len(errs) > 0 {
		return nil, nil, errors.Join(errs...)
	}
	return dirs, ids, nil
}

// HasCanaries reports whether any task of d is a canary (Metadata.Canary).
func (d *Dataset) HasCanaries() bool {
	return slices.ContainsFunc(d.Tasks, func(t *Task) bool { return t.Config.Metadata.Canary })
}

// Filter selects tasks. Its zero value selects every task but canaries.
type Filter struct {
	// Tags: a task must have every one of these (in [metadata].tags or [task].keywords).
	Tags []string
	// Difficulties: a task's difficulty must be one of these, when any are given.
	Difficulties []string
	// Globs: a task's ID must match one of these path.Match patterns, when any are given.
	Globs []string
	// Canaries lets canary tasks (Metadata.Canary) pass; without it none does, so a run
	// drawing tasks from a dataset plays its canaries only when it asks to, and seeds pick
	// the same tasks with or without canaries in the dataset.
	Canaries bool
}

// Check reports a pattern of f that path.Match cannot read, or a difficulty that no task
// can have.
func (f Filter) Check() error {
	var errs []error
	for _, g := range f.Globs {
		if _, err := path.Match(g, ""); err != nil {
			errs = append(errs, fmt.Errorf("glob %q: %w", g, err))
		}
	}
	for _, d := range f.Difficulties {
		if !slices.Contains(Difficulties, d) {
			errs = append(errs, fmt.Errorf("difficulty %q is not one of %s", d, strings.Join(Difficulties, ", ")))
		}
	}
	return errors.Join(errs...)
}

// Match reports whether t passes the filter.
func (f Filter) Match(t *Task) bool {
	if t.Config.Metadata.Canary && !f.Canaries {
		return false
	}
	if len(f.Difficulties) > 0 && !slices.Contains(f.Difficulties, t.Config.Metadata.Difficulty) {
		return false
	}
	if len(f.Tags) > 0 {
		tags := t.Config.Tags()
		for _, want := range f.Tags {
			if !slices.Contains(tags, want) {
				return false
			}
		}
	}
	if len(f.Globs) > 0 {
		return slices.ContainsFunc(f.Globs, func(g string) bool {
			ok, _ := path.Match(g, t.ID) // checked by Check
			return ok
		})
	}
	return true
}

// Select returns the tasks of d that pass f, in ID order.
func (d *Dataset) Select(f Filter) []*Task {
	var out []*Task
	for _, t := range d.Tasks {
		if f.Match(t) {
			out = append(out, t)
		}
	}
	return out
}

// Task returns the task with the given ID, or nil.
func (d *Dataset) Task(id string) *Task {
	i, ok := slices.BinarySearchFunc(d.Tasks, id, func(t *Task, id string) int { return strings.Compare(t.ID, id) })
	if !ok {
		return nil
	}
	return d.Tasks[i]
}
