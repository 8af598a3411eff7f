package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/gauntlet-rl/gauntlet/pkg/env/taskenv"
	"github.com/gauntlet-rl/gauntlet/pkg/tasks"
)

// taskOpts are a run's --tasks flags: a dataset of the stack and filters over its tasks.
// They make the run one of the tasks env with the selection as its params.
type taskOpts struct {
	dataset string
	filter  tasks.Filter
	// canaryRate is --tasks.canary-rate: the share of episodes that play a canary.
	canaryRate float64
	// datasets are the datasets the stack plays, by name (stack.json's, or the serving
	// config's for demo); called only when --tasks needs them.
	datasets func() (map[string]string, error)

	// selection is what the last request chose, for the caller to print.
	selection *taskSelection
}

// taskSelection is a run's selection as the submitter saw it.
type taskSelection struct {
	taskenv.Selection
	dir   string
	total int
	count int
}

func (o *taskOpts) register(fs *flag.FlagSet) {
	fs.StringVar(&o.dataset, "tasks", "", "run the tasks env over a dataset of the stack: its NAME (from the stack's --tasks.datasets), its DIR, or NAME=DIR (docs/tasks.md)")
	fs.Var((*listFlag)(&o.filter.Tags), "tasks.tag", "with --tasks: only tasks with this tag (repeat: all of them)")
	fs.Var((*listFlag)(&o.filter.Difficulties), "tasks.difficulty", "with --tasks: only tasks of this difficulty, easy, medium or hard (repeat or comma-separate: any of them)")
	fs.Float64Var(&o.canaryRate, "tasks.canary-rate", 0, "with --tasks: the share of episodes (0 to 1) that play one of the dataset's canaries (tasks no agent solves honestly) instead of their draw, chosen by each episode's seed; the canary detector flags any success (docs/tasks.md)")
	fs.Var((*listFlag)(&o.filter.Globs), "tasks.glob", "with --tasks: only tasks whose id matches this pattern, as path.Match (repeat: any of them)")
}

func (o *taskOpts) filtered() bool {
	return len(o.filter.Tags) > 0 || len(o.filter.Difficulties) > 0 || len(o.filter.Globs) > 0
}

// filterFlags is the filter as the flags that gave it, for messages.
func (o *taskOpts) filterFlags() string {
	var parts []string
	for _, f := range []struct {
		name string
		v    []string
	}{{"tasks.tag", o.filter.Tags}, {"tasks.difficulty", o.filter.Difficulties}, {"tasks.glob", o.filter.Globs}} {
		if len(f.v) > 0 {
			parts = append(parts, "--"+f.name+" "+strings.Join(f.v, ","))
		}
	}
	return strings.Join(parts, " ")
}

// resolve is the dataset --tasks names: its name on the stack and its folder. NAME=DIR is
// taken as given (the stack must know NAME as DIR: its episodes read the dataset by that
// name); a name or a folder is looked up among the stack's datasets.
func (o *taskOpts) resolve() (name, dir string, err error) {
	if n, _, ok := strings.Cut(o.dataset, "="); ok {
		var df taskenv.DatasetsFlag
		if err := df.Set(o.dataset); err != nil {
			return "", "", fmt.Errorf("--tasks: %w", err)
		}
		return n, df[n], nil
	}
	var known map[string]string
	err = errors.New("this command reads no stack")
	if o.datasets != nil {
		known, err = o.datasets()
	}
	if err != nil {
		return "", "", fmt.Errorf("--tasks %s: the stack's datasets are unknown (%w); name the dataset as NAME=DIR, NAME being what the stack's --tasks.datasets calls it", o.dataset, err)
	}
	if d, ok := known[o.dataset]; ok {
		return o.dataset, d, nil
	}
	knownList := "none: start it with --tasks.datasets NAME=DIR"
	if len(known) > 0 {
		var l []string
		for _, n := range slices.Sorted(maps.Keys(known)) {
			l = append(l, n+"="+known[n])
		}
		knownList = strings.Join(l, ", ")
	}
	if _, statErr := os.Stat(o.dataset); statErr == nil {
		abs, err := filepath.Abs(o.dataset)
		if err != nil {
			return "", "", fmt.Errorf("--tasks: %w", err)
		}
		for _, n := range slices.Sorted(maps.Keys(known)) {
			if filepath.Clean(known[n]) == abs {
				return n, abs, nil
			}
		}
		return "", "", fmt.Errorf("--tasks %s: the stack plays no dataset at %s (its datasets: %s)", o.dataset, abs, knownList)
	}
	return "", "", fmt.Errorf("--tasks %s: neither a dataset of the stack nor a folder (the stack's datasets: %s)", o.dataset, knownList)
}

// params makes the run's params from --tasks, its filters and --params: the dataset is
// read here, every task of it strictly, and the selection pinned by digest, so the run's
// params (the runs table's params column) record which tasks it covers and its episodes
// refuse a task changed since. --params may add the env's other params (max_invalid,
// deadline_ms), not the selection's.
func (o *taskOpts) params(extra string) (string, error) {
	o.selection = nil
	if o.dataset == "" {
		if o.filtered() {
			return "", fmt.Errorf("%s: filters a dataset: give it with --tasks", o.filterFlags())
		}
		if o.canaryRate != 0 {
			return "", errors.New("--tasks.canary-rate: mixes a dataset's canaries in: give it with --tasks")
		}
		return extra, nil
	}
	name, dir, err := o.resolve()
	if err != nil {
		return "", err
	}
	ds, err := tasks.LoadDataset(dir)
	if err != nil {
		return "", fmt.Errorf("--tasks %s: %w", o.dataset, err)
	}
	sel, err := taskenv.Select(name, ds, o.filter)
	if errors.Is(err, taskenv.ErrEmptySelection) {
		return "", fmt.Errorf("%s: %w", o.filterFlags(), err)
	}
	if err != nil {
		return "", fmt.Errorf("--tasks: %w", err)
	}
	switch r := o.canaryRate; {
	case math.IsNaN(r) || r < 0 || r > 1:
		return "", fmt.Errorf("--tasks.canary-rate: %v is outside 0..1", r)
	case r > 0 && !ds.HasCanaries():
		return "", fmt.Errorf("--tasks.canary-rate: dataset %s (%s) has no canary task (task.toml [metadata] canary = true)", name, ds.Root)
	}
	sel.CanaryRate = o.canaryRate
	var p map[string]json.RawMessage
	if err := json.Unmarshal(sel.Params(), &p); err != nil {
		return "", err
	}
	var more map[string]json.RawMessage
	if err := json.Unmarshal([]byte(extra), &more); err != nil {
		return "", fmt.Errorf("--params: with --tasks, a JSON object of the tasks env's other params: %w", err)
	}
	var errs []error
	for _, k := range slices.Sorted(maps.Keys(more)) {
		switch k {
		case "dataset", "task", "digest", "tags", "difficulty", "glob", "tasks":
			errs = append(errs, fmt.Errorf("--params: %s: --tasks and its filters make the selection", k))
		default:
			p[k] = more[k]
		}
	}
	if len(errs) > 0 {
		return "", errors.Join(errs...)
	}
	b, err := json.Marshal(p)
	if err != nil {
		return "", err
	}
	o.selection = &taskSelection{Selection: sel, dir: ds.Root, total: len(ds.Tasks), count: len(ds.Select(o.filter))}
	return string(b), nil
}

// String is the selection in one line, e.g. "tasks: 3 of 30 of dataset gauntlet
// (/data/gauntlet), pinned by digest: python/fix-median, ...".
func (s *taskSelection) String() string {
	head := fmt.Sprintf("tasks: %d of %d of dataset %s (%s)", s.count, s.total, s.Dataset, s.dir)
	if len(s.Tasks) == 0 {
		return head + fmt.Sprintf(", chosen by the filters on the stack (more than %d are not pinned)", taskenv.MaxPinned)
	}
	ids := make([]string, 0, 8)
	for i, t := range s.Tasks {
		if i == 8 {
			ids = append(ids, fmt.Sprintf("… %d more", len(s.Tasks)-i))
			break
		}
		ids = append(ids, t.ID)
	}
	return head + ", pinned by digest: " + strings.Join(ids, ", ")
}
