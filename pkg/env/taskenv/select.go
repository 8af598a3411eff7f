package taskenv

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strings"

	"github.com/gauntlet-rl/gauntlet/pkg/rng"
	"github.com/gauntlet-rl/gauntlet/pkg/tasks"
)

// MaxPinned bounds the tasks a run's params may pin. Every episode carries its run's
// params (and ClickHouse records them with it), so a pinned list costs about 100 bytes a
// task on each: a larger selection is given by its filters alone.
const MaxPinned = 2000

// Pinned is one task of a selection, by ID and by the content digest it had when the
// selection was made: an episode refuses the task when its content changed since.
type Pinned struct {
	ID     string `json:"id"`
	Digest string `json:"digest"`
}

// Selection is the tasks a run (or a curriculum stage) plays: a dataset by name, the
// filters that chose among its tasks, and, when the submitter could read the dataset,
// the tasks they chose, pinned. Its Params are the tasks env's params, so every path that
// plays envs plays a selection alike, and the run's params record it.
type Selection struct {
	Dataset string
	Filter  tasks.Filter
	Tasks   []Pinned
	// CanaryRate is the share of the episodes that play one of the dataset's canaries
	// instead (params.canary_rate; 0: none).
	CanaryRate float64
}

// Select chooses the tasks of ds that pass f, for the dataset named name, and pins them
// when there are at most MaxPinned. A filter that selects nothing is ErrEmptySelection,
// naming the dataset and the filter.
func Select(name string, ds *tasks.Dataset, f tasks.Filter) (Selection, error) {
	if err := f.Check(); err != nil {
		return Selection{}, err
	}
	sel := Selection{Dataset: name, Filter: f}
	picked := ds.Select(f)
	if len(picked) == 0 {
		return sel, fmt.Errorf("%w: %s selects none of the %d tasks of dataset %s (%s)", ErrEmptySelection, describeFilter(f), len(ds.Tasks), name, ds.Root)
	}
	if len(picked) <= MaxPinned {
		sel.Tasks = make([]Pinned, len(picked))
		for i, t := range picked {
			sel.Tasks[i] = Pinned{ID: t.ID, Digest: t.Digest}
		}
	}
	return sel, nil
}

// ErrEmptySelection is a filter that selects no task of its dataset.
var ErrEmptySelection = errors.New("tasks: no task selected")

// describeFilter is f as its params say it, e.g. `tags ["python"], difficulty ["hard"]`.
func describeFilter(f tasks.Filter) string {
	var parts []string
	add := func(name string, v []string) {
		if len(v) > 0 {
			b, _ := json.Marshal(v)
			parts = append(parts, name+" "+string(b))
		}
	}
	add("tags", f.Tags)
	add("difficulty", f.Difficulties)
	add("glob", f.Globs)
	if len(parts) == 0 {
		return "no filter"
	}
	return "the filter " + strings.Join(parts, ", ")
}

// Params are the selection as the tasks env's params: {"dataset", "tags", "difficulty",
// "glob", "tasks", "canary_rate"}, empty ones left out.
func (s Selection) Params() json.RawMessage {
	p := struct {
		Dataset    string   `json:"dataset"`
		Tags       []string `json:"tags,omitempty"`
		Difficulty []string `json:"difficulty,omitempty"`
		Glob       []string `json:"glob,omitempty"`
		Tasks      []Pinned `json:"tasks,omitempty"`
		CanaryRate float64  `json:"canary_rate,omitempty"`
	}{s.Dataset, s.Filter.Tags, s.Filter.Difficulties, s.Filter.Globs, s.Tasks, s.CanaryRate}
	b, _ := json.Marshal(p) // strings and slices of them always marshal
	return b
}

var digestRE = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// checkSelection reports what is wrong with p's choice of task: a task named beside
// filters or a pinned list, a bad filter, a pinned entry without an ID or a digest, or
// one listed twice.
func (p params) checkSelection() []error {
	var errs []error
	filtered := len(p.Tags) > 0 || len(p.Difficulty) > 0 || len(p.Glob) > 0
	if p.Task != "" && (filtered || len(p.Tasks) > 0) {
		errs = append(errs, errors.New("params.task: names one task; tags, difficulty, glob and tasks choose among many: give one or the other"))
	}
	if p.Digest != "" && len(p.Tasks) > 0 {
		errs = append(errs, errors.New("params.digest: with params.tasks, each pinned task carries its own digest"))
	}
	if err := p.filter().Check(); err != nil {
		errs = append(errs, fmt.Errorf("params: %w", err))
	}
	for i, t := range p.Tags {
		if strings.TrimSpace(t) == "" {
			errs = append(errs, fmt.Errorf("params.tags[%d]: empty", i))
		}
	}
	switch r := p.CanaryRate; {
	case math.IsNaN(r) || r < 0 || r > 1:
		errs = append(errs, fmt.Errorf("params.canary_rate: %v is outside 0..1", r))
	case r > 0 && p.Task != "":
		errs = append(errs, errors.New("params.canary_rate: mixes canaries into a draw; a task named by params.task is played as named"))
	}
	if len(p.Tasks) > MaxPinned {
		errs = append(errs, fmt.Errorf("params.tasks: %d tasks, more than %d: select them by tags, difficulty or glob instead", len(p.Tasks), MaxPinned))
	}
	seen := make(map[string]bool, len(p.Tasks))
	for i, t := range p.Tasks {
		switch {
		case t.ID == "":
			errs = append(errs, fmt.Errorf("params.tasks[%d].id: required", i))
		case seen[t.ID]:
			errs = append(errs, fmt.Errorf("params.tasks[%d].id: %q is listed twice", i, t.ID))
		case !digestRE.MatchString(t.Digest):
			errs = append(errs, fmt.Errorf("params.tasks[%d].digest: %q is not a task digest (sha256: and 64 hex digits)", i, t.Digest))
		}
		seen[t.ID] = true
	}
	return errs
}

func (p params) filter() tasks.Filter {
	return tasks.Filter{Tags: p.Tags, Difficulties: p.Difficulty, Globs: p.Glob}
}

// pick is the task an episode of seed plays: the task p names; else, of the tasks p pins
// (or, pinning none, those its filters select in ID order), the one at seed modulo their
// count, so a run's seeds spread its episodes over its selection alike on every
// process. The second result is the digest the task must have ("" when p says none).
func (p params) pick(name string, ds *tasks.Dataset, seed uint64) (*tasks.Task, string, error) {
	if p.CanaryRate > 0 && p.Task == "" {
		t, err := drawCanary(name, ds, seed, p.CanaryRate)
		if err != nil || t != nil {
			return t, "", err
		}
	}
	switch {
	case p.Task != "":
		t := ds.Task(p.Task)
		if t == nil {
			return nil, "", fmt.Errorf("params.task: %q is not a task of %s", p.Task, ds.Root)
		}
		return t, p.Digest, nil
	case len(p.Tasks) > 0:
		i := seed % uint64(len(p.Tasks))
		pin := p.Tasks[i]
		t := ds.Task(pin.ID)
		if t == nil {
			return nil, "", fmt.Errorf("params.tasks[%d]: %q is not a task of dataset %s (%s)", i, pin.ID, name, ds.Root)
		}
		// A pinned task was named, so a canary among them is played as asked.
		if f := p.filter(); !(tasks.Filter{Tags: f.Tags, Difficulties: f.Difficulties, Globs: f.Globs, Canaries: true}).Match(t) {
			return nil, "", fmt.Errorf("params.tasks[%d]: %q does not pass %s", i, pin.ID, describeFilter(f))
		}
		return t, pin.Digest, nil
	}
	f := p.filter()
	if len(f.Tags) == 0 && len(f.Difficulties) == 0 && len(f.Globs) == 0 && !ds.HasCanaries() {
		return ds.Tasks[seed%uint64(len(ds.Tasks))], p.Digest, nil
	}
	// A draw skips the dataset's canaries (tasks.Filter.Canaries): the same seeds pick
	// the same tasks with or without them.
	sel := ds.Select(f)
	if len(sel) == 0 {
		return nil, "", fmt.Errorf("params: %w: %s selects none of the %d tasks of dataset %s (%s)", ErrEmptySelection, describeFilter(f), len(ds.Tasks), name, ds.Root)
	}
	return sel[seed%uint64(len(sel))], p.Digest, nil
}

// drawCanary is the canary an episode of seed plays instead of its draw, in a run that
// mixes canaries in at rate (params.canary_rate): with probability rate, from the seed
// alone (so a replay, a retry and every process draw the same), one of the dataset's
// canaries (in ID order, whatever the run's filters: canaries are not among the tasks
// they select); nil for an episode that plays its draw, which is then the task it would
// play at rate 0: mixing canaries in changes no other episode's task.
// A dataset without canaries is an error: the run asked for what it cannot have.
func drawCanary(name string, ds *tasks.Dataset, seed uint64, rate float64) (*tasks.Task, error) {
	if rng.Float64(seed, "canary", 0) >= rate {
		return nil, nil
	}
	var canaries []*tasks.Task
	for _, t := range ds.Tasks {
		if t.Config.Metadata.Canary {
			canaries = append(canaries, t)
		}
	}
	if len(canaries) == 0 {
		return nil, fmt.Errorf("params.canary_rate: dataset %s (%s) has no canary task (task.toml [metadata] canary = true)", name, ds.Root)
	}
	return canaries[rng.Derive(seed, "canary-task")%uint64(len(canaries))], nil
}
