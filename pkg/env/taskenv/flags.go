package taskenv

import (
	"errors"
	"flag"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"

	"github.com/gauntlet-rl/gauntlet/pkg/tasks"
)

// Config is the datasets a process's episodes of the tasks env may play, by name. An
// episode names its dataset by one of these names, never by a path: whoever can start an
// episode (a trainer over the env API) can make the process read only what its operator
// configured.
type Config struct {
	// Datasets maps a name to a dataset folder, task folder or manifest.
	Datasets DatasetsFlag
}

// RegisterFlags declares --tasks.datasets.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.Var(&c.Datasets, "tasks.datasets", "task datasets episodes of the tasks env may play: NAME=DIR (a dataset folder, task folder or manifest), comma-separated or repeated")
}

// Validate reads every dataset strictly: a bad entry or an invalid task is reported, with
// every other problem, before the process starts.
func (c Config) Validate() error {
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(c.Datasets)) {
		if _, err := tasks.LoadDataset(c.Datasets[name]); err != nil {
			errs = append(errs, fmt.Errorf("tasks.datasets: %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// DatasetsFlag is NAME=DIR entries, as a flag.Value.
type DatasetsFlag map[string]string

// String lists the entries, sorted.
func (d DatasetsFlag) String() string {
	var out []string
	for k, v := range d {
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return strings.Join(out, ",")
}

// Set adds NAME=DIR entries (comma-separated). A name is letters, digits, '.', '_' or
// '-'; each name once; the folder is made absolute.
func (d *DatasetsFlag) Set(v string) error {
	if *d == nil {
		*d = DatasetsFlag{}
	}
	for _, e := range strings.Split(v, ",") {
		if e = strings.TrimSpace(e); e == "" {
			continue
		}
		name, dir, ok := strings.Cut(e, "=")
		if !ok || !validName(name) || dir == "" {
			return fmt.Errorf("%q: want NAME=DIR, NAME of letters, digits, '.', '_' or '-'", e)
		}
		if _, dup := (*d)[name]; dup {
			return fmt.Errorf("%q: dataset %s is named twice", e, name)
		}
		abs, err := filepath.Abs(dir)
		if err != nil {
			return fmt.Errorf("%q: %w", e, err)
		}
		(*d)[name] = abs
	}
	return nil
}

func validName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return s != "." && s != ".."
}
