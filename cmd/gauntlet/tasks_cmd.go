package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/gauntlet-rl/gauntlet/pkg/tasks"
	"github.com/gauntlet-rl/gauntlet/pkg/tasks/taskgen"
)

const tasksUsage = `Usage:
  gauntlet tasks validate DIR|MANIFEST...   read every task strictly; list every problem of
                                            every task, exit non-zero if there is one
  gauntlet tasks ls DIR|MANIFEST [--tag T]... [--difficulty D]... [--glob G]... [--json]
                                            the tasks of a dataset, filtered (tags: all must
                                            match; difficulties and globs: any)
  gauntlet tasks describe DIR/TASK [--json] one task: its configuration, environment, digest
  gauntlet tasks check DIR|MANIFEST [--tag T]... [--difficulty D]... [--glob G]... [--sandbox.runtime R]
                                            play every task twice in real sandboxes: the oracle
                                            (solution/solve.sh) must succeed, a no-op agent
                                            must fail; report per task, exit non-zero if one
                                            does not
  gauntlet tasks generate --n N [--seed S] DIR
                                            write N synthetic tasks under DIR, for load tests

A dataset is a folder searched recursively for task folders (folders holding task.toml),
or a JSON manifest listing them ({"tasks": [{"path": "..."}]}). The format is Harbor's
task folder: see docs/tasks.md.
`

// cmdTasks is `gauntlet tasks`.
func cmdTasks(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, tasksUsage)
		return errUsage
	}
	switch args[0] {
	case "validate":
		return tasksValidate(args[1:], stdout, stderr)
	case "ls":
		return tasksLs(args[1:], stdout, stderr)
	case "describe":
		return tasksDescribe(args[1:], stdout, stderr)
	case "check":
		return tasksCheck(ctx, args[1:], stdout, stderr)
	case "generate":
		return tasksGenerate(args[1:], stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, tasksUsage)
		return nil
	}
	fmt.Fprintf(stderr, "gauntlet tasks: unknown subcommand %q\n\n%s", args[0], tasksUsage)
	return errUsage
}

// listFlag is a flag that may be given many times, or once with commas.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l = append(*l, s)
		}
	}
	return nil
}

// taskProblems groups a dataset's problems by task, in task order, for printing.
func taskProblems(err error) (order []string, byTask map[string][]string) {
	byTask = map[string][]string{}
	for _, p := range tasks.Problems(err) {
		id := ""
		var fe *tasks.FieldError
		msg := p.Error()
		if errors.As(p, &fe) {
			id = fe.Task
			c := *fe
			c.Task = "" // the heading names it
			msg = c.Error()
		}
		if _, ok := byTask[id]; !ok {
			order = append(order, id)
		}
		byTask[id] = append(byTask[id], msg)
	}
	sort.Strings(order)
	return order, byTask
}

func tasksValidate(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("tasks validate", stderr)
	paths, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(paths) == 0 {
		fmt.Fprint(stderr, "gauntlet tasks validate: give one or more dataset folders, task folders or manifests\n")
		return errUsage
	}
	badTasks, good := 0, 0
	for _, p := range paths {
		ds, err := tasks.LoadDataset(p)
		if ds == nil {
			badTasks++
			fmt.Fprintf(stdout, "BAD %s:\n  %s\n", p, strings.ReplaceAll(err.Error(), "\n", "\n  "))
			continue
		}
		good += len(ds.Tasks)
		order, byTask := taskProblems(err)
		for _, id := range order {
			badTasks++
			name := id
			if name == "" {
				name = p
			}
			fmt.Fprintf(stdout, "BAD %s:\n", name)
			for _, m := range byTask[id] {
				fmt.Fprintf(stdout, "  %s\n", m)
			}
		}
		fmt.Fprintf(stdout, "%s: %d tasks valid, %d invalid\n", p, len(ds.Tasks), len(order))
	}
	if badTasks > 0 {
		return fmt.Errorf("tasks validate: %d invalid (and %d valid)", badTasks, good)
	}
	return nil
}

// taskJSON is a task as `tasks ls --json` and `tasks describe --json` print it.
type taskJSON struct {
	ID            string            `json:"id"`
	Name          string            `json:"name"`
	Dir           string            `json:"dir"`
	Digest        string            `json:"digest"`
	Version       string            `json:"version"`
	Difficulty    string            `json:"difficulty,omitempty"`
	Category      string            `json:"category,omitempty"`
	Tags          []string          `json:"tags,omitempty"`
	Authors       []tasks.Author    `json:"authors,omitempty"`
	Description   string            `json:"description,omitempty"`
	Image         string            `json:"image,omitempty"`
	Dockerfile    string            `json:"dockerfile,omitempty"`
	HasSolution   bool              `json:"has_solution"`
	AgentTimeout  float64           `json:"agent_timeout_sec"`
	VerifierTime  float64           `json:"verifier_timeout_sec"`
	BuildTimeout  float64           `json:"build_timeout_sec"`
	CPUs          int               `json:"cpus"`
	MemoryMB      int               `json:"memory_mb"`
	StorageMB     int               `json:"storage_mb"`
	GPUs          int               `json:"gpus,omitempty"`
	AllowInternet bool              `json:"allow_internet"`
	NetworkMode   string            `json:"network_mode"`
	AllowedHosts  []string          `json:"allowed_hosts,omitempty"`
	VerifierEnv   map[string]string `json:"verifier_env,omitempty"`
	Metadata      map[string]any    `json:"metadata,omitempty"`
	Canary        bool              `json:"canary,omitempty"`
	Instruction   string            `json:"instruction,omitempty"`
}

func toJSON(t *tasks.Task, withInstruction bool) taskJSON {
	c := t.Config
	authors := slices.Concat(c.Task.Authors, c.Metadata.Authors)
	j := taskJSON{
		ID: t.ID, Name: t.Name(), Dir: t.Dir, Digest: t.Digest, Version: c.Version,
		Difficulty: c.Metadata.Difficulty, Category: c.Metadata.Category, Tags: c.Tags(),
		Authors: authors, Description: c.Task.Description, Image: t.Environment.Image,
		Dockerfile: t.Environment.Dockerfile, HasSolution: t.HasSolution,
		AgentTimeout: c.Agent.Timeout.Seconds(), VerifierTime: c.Verifier.Timeout.Seconds(),
		BuildTimeout: c.Environment.BuildTimeout.Seconds(), CPUs: c.Environment.CPUs,
		MemoryMB: c.Environment.MemoryMB, StorageMB: c.Environment.StorageMB, GPUs: c.Environment.GPUs,
		AllowInternet: c.Environment.AllowInternet, NetworkMode: c.Environment.NetworkMode, AllowedHosts: c.Environment.AllowedHosts, VerifierEnv: c.Verifier.Env, Metadata: c.Metadata.Extra,
		Canary: c.Metadata.Canary,
	}
	if withInstruction {
		j.Instruction = t.Instruction
	}
	return j
}

func tasksLs(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("tasks ls", stderr)
	f := tasks.Filter{Canaries: true} // listed like any task; describe says which are canaries
	fs.Var((*listFlag)(&f.Tags), "tag", "only tasks with this tag (repeat: all of them)")
	fs.Var((*listFlag)(&f.Difficulties), "difficulty", "only tasks of this difficulty (repeat or comma-separate: any of them)")
	fs.Var((*listFlag)(&f.Globs), "glob", "only tasks whose id matches this pattern, as path.Match (repeat: any of them)")
	asJSON := fs.Bool("json", false, "one JSON object per task")
	paths, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(paths) != 1 {
		fmt.Fprint(stderr, "gauntlet tasks ls: give one dataset folder or manifest\n")
		return errUsage
	}
	if err := f.Check(); err != nil {
		return fmt.Errorf("tasks ls: %w", err)
	}
	ds, loadErr := tasks.LoadDataset(paths[0])
	if ds == nil {
		return loadErr
	}
	sel := ds.Select(f)
	if *asJSON {
		enc := json.NewEncoder(stdout)
		for _, t := range sel {
			if err := enc.Encode(toJSON(t, false)); err != nil {
				return err
			}
		}
	} else {
		tw := tabwriter.NewWriter(stdout, 2, 8, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tDIFFICULTY\tCATEGORY\tTAGS\tENVIRONMENT\tSOLUTION\tDIGEST")
		for _, t := range sel {
			envDesc := "Dockerfile"
			if t.Environment.Image != "" {
				envDesc = t.Environment.Image
			}
			sol := "-"
			if t.HasSolution {
				sol = "yes"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", t.ID, dash(t.Config.Metadata.Difficulty),
				dash(t.Config.Metadata.Category), dash(strings.Join(t.Config.Tags(), ",")), envDesc, sol, shortDigest(t.Digest))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%d of %d tasks\n", len(sel), len(ds.Tasks))
	}
	if loadErr != nil {
		order, _ := taskProblems(loadErr)
		fmt.Fprintf(stderr, "gauntlet tasks ls: %d tasks are invalid and not listed (gauntlet tasks validate %s)\n", len(order), paths[0])
		return fmt.Errorf("tasks ls: %d invalid tasks", len(order))
	}
	return nil
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// shortDigest is the digest's first 12 hex digits, as `docker images` shortens ids.
func shortDigest(d string) string {
	d = strings.TrimPrefix(d, "sha256:")
	if len(d) > 12 {
		d = d[:12]
	}
	return d
}

func tasksDescribe(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("tasks describe", stderr)
	asJSON := fs.Bool("json", false, "print the task as one JSON object")
	paths, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(paths) != 1 {
		fmt.Fprint(stderr, "gauntlet tasks describe: give one task folder\n")
		return errUsage
	}
	t, err := tasks.Load(paths[0], "")
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(toJSON(t, true))
	}
	c := t.Config
	tw := tabwriter.NewWriter(stdout, 2, 8, 2, ' ', 0)
	row := func(k, v string) {
		if v != "" {
			fmt.Fprintf(tw, "%s:\t%s\n", k, v)
		}
	}
	row("task", t.Name())
	row("folder", t.Dir)
	row("digest", t.Digest)
	row("schema version", c.Version)
	row("source", c.Source)
	row("description", c.Task.Description)
	row("difficulty", c.Metadata.Difficulty)
	row("category", c.Metadata.Category)
	row("tags", strings.Join(c.Tags(), ", "))
	if c.Metadata.Canary {
		row("canary", "yes: unsolvable honestly, any success is a hack")
	}
	var authors []string
	for _, a := range slices.Concat(c.Task.Authors, c.Metadata.Authors) {
		if a.Email != "" {
			authors = append(authors, fmt.Sprintf("%s <%s>", a.Name, a.Email))
		} else {
			authors = append(authors, a.Name)
		}
	}
	row("authors", strings.Join(authors, ", "))
	if t.Environment.Image != "" {
		row("image", t.Environment.Image)
	}
	if t.Environment.Dockerfile != "" {
		row("dockerfile", t.Environment.Dockerfile)
	}
	row("resources", fmt.Sprintf("%d cpus, %d MB memory, %d MB storage, %d gpus", c.Environment.CPUs, c.Environment.MemoryMB, c.Environment.StorageMB, c.Environment.GPUs))
	row("internet", fmt.Sprint(c.Environment.AllowInternet))
	row("network", c.Environment.NetworkMode)
	if c.Environment.NetworkMode == tasks.NetworkAllowlist {
		hosts := strings.Join(c.Environment.AllowedHosts, ", ")
		if hosts == "" {
			hosts = "none (every request is refused)"
		}
		row("allowed hosts", hosts)
	}
	row("timeouts", fmt.Sprintf("agent %v, verifier %v, build %v", c.Agent.Timeout, c.Verifier.Timeout, c.Environment.BuildTimeout))
	row("agent user", c.Agent.User)
	row("verifier user", c.Verifier.User)
	row("verifier env", envKeys(c.Verifier.Env))
	row("solution env", envKeys(c.Solution.Env))
	for i, m := range c.Environment.MCPServers {
		row(fmt.Sprintf("mcp server %d", i), fmt.Sprintf("%s (%s) %s%s", m.Name, m.Transport, m.URL, m.Command))
	}
	if len(c.Metadata.Extra) > 0 {
		keys := make([]string, 0, len(c.Metadata.Extra))
		for k := range c.Metadata.Extra {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			row("metadata."+k, fmt.Sprint(c.Metadata.Extra[k]))
		}
	}
	row("solution", map[bool]string{true: "solution/solve.sh", false: "none (the oracle cannot run this task)"}[t.HasSolution])
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "\n%s", t.Instruction)
	return nil
}

// envKeys lists an env table's names only: values may be secrets.
func envKeys(env map[string]string) string {
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return strings.Join(keys, ", ")
}

func tasksGenerate(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("tasks generate", stderr)
	n := fs.Int("n", 0, fmt.Sprintf("how many tasks to write (1 to %d)", taskgen.MaxTasks))
	seed := fs.Uint64("seed", 1, "seed the tasks are drawn from: the same seed writes the same tasks")
	paths, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(paths) != 1 {
		fmt.Fprint(stderr, "gauntlet tasks generate: give the folder to write the tasks in\n")
		return errUsage
	}
	names, err := taskgen.Generate(paths[0], *n, *seed)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %d tasks (%s) under %s\n", len(names), strings.Join(taskgen.Kinds(), ", "), paths[0])
	return nil
}
