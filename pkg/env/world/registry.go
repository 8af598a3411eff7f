package world

import (
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
)

//go:embed builtin/*.yaml
var builtinFS embed.FS

// ErrNameTaken is returned when a user world's name is already an env's.
var ErrNameTaken = errors.New("world name already registered")

// Builtin returns the built-in worlds, loaded from the files embedded in the binary. They
// are checked by the package's tests, so an error here is a defect of the build.
func Builtin() ([]*World, error) {
	names, err := fs.Glob(builtinFS, "builtin/*.yaml")
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	var ws []*World
	var errs []error
	for _, n := range names {
		data, err := builtinFS.ReadFile(n)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		w, err := Load(path.Base(n), data)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		ws = append(ws, w)
	}
	return ws, errors.Join(errs...)
}

func init() {
	ws, err := Builtin()
	if err != nil {
		panic(fmt.Sprintf("built-in worlds: %v", err)) // a defect of the build, caught by tests
	}
	for _, w := range ws {
		env.Register(w.Env())
	}
}

// LoadFile loads one world file.
func LoadFile(file string) (*World, error) {
	fi, err := os.Stat(file)
	if err != nil {
		return nil, fmt.Errorf("load world: %w", err)
	}
	if fi.Size() > MaxFileBytes {
		return nil, fmt.Errorf("load world %s: %d bytes, over the limit of %d: %w", file, fi.Size(), MaxFileBytes, ErrInvalid)
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("load world: %w", err)
	}
	return Load(file, data)
}

// LoadDir loads every *.yaml and *.yml file of dir (not its subdirectories), in name
// order, reporting every invalid file and every name used twice.
func LoadDir(dir string) ([]*World, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("load worlds: %w", err)
	}
	var ws []*World
	var errs []error
	seen := map[string]string{}
	for _, e := range entries {
		n := e.Name()
		if e.IsDir() || !(strings.HasSuffix(n, ".yaml") || strings.HasSuffix(n, ".yml")) {
			continue
		}
		file := filepath.Join(dir, n)
		w, err := LoadFile(file)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if prev, dup := seen[w.name]; dup {
			errs = append(errs, fmt.Errorf("%s: world %q is also declared by %s: %w", file, w.name, prev, ErrNameTaken))
			continue
		}
		seen[w.name] = file
		ws = append(ws, w)
	}
	return ws, errors.Join(errs...)
}

var (
	dirMu   sync.Mutex
	dirDone = map[string]string{} // world name → digest, registered from directories
)

// RegisterDir loads dir's worlds and registers each as an env, refusing (before
// registering any) an invalid file or a name an env already has. Registering the same
// directory again in one process (several modules share it) is a no-op for worlds it
// registered before with the same content; a changed one is refused.
func RegisterDir(dir string) ([]*World, error) {
	ws, err := LoadDir(dir)
	dirMu.Lock()
	defer dirMu.Unlock()
	if err := errors.Join(err, checkNamesLocked(ws)); err != nil {
		return nil, err
	}
	for _, w := range ws {
		if _, ok := dirDone[w.name]; !ok {
			env.Register(w.Env())
			dirDone[w.name] = w.digest
		}
	}
	return ws, nil
}

// checkNames reports the worlds whose names another env has.
func checkNames(ws []*World) error {
	dirMu.Lock()
	defer dirMu.Unlock()
	return checkNamesLocked(ws)
}

func checkNamesLocked(ws []*World) error {
	var errs []error
	names := env.Names()
	for _, w := range ws {
		if d, ok := dirDone[w.name]; ok {
			if d != w.digest {
				errs = append(errs, fmt.Errorf("%s: world %q changed since this process registered it: %w", w.file, w.name, ErrNameTaken))
			}
			continue
		}
		if slices.Contains(names, w.name) {
			errs = append(errs, fmt.Errorf("%s: world %q: an env of that name exists: %w", w.file, w.name, ErrNameTaken))
		}
	}
	return errors.Join(errs...)
}
