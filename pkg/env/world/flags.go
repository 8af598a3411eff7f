package world

import (
	"errors"
	"flag"
	"fmt"
)

// Config is where a process finds its user worlds. Every process that plays, schedules
// or checks episodes of a user world needs the same directory (in `gauntlet up`, one
// process does all of that).
type Config struct {
	// Dir holds world files (*.yaml, *.yml); empty: the built-in worlds only.
	Dir string
}

// RegisterFlags declares --env.worlds on fs.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Dir, "env.worlds", "", "directory of world files (*.yaml) registered as envs next to the built-in ones (docs/worlds.md); every process that runs, schedules or plays their episodes needs it")
}

// Validate loads the directory's worlds and reports every invalid file and every name
// already taken by another env, without registering anything.
func (c *Config) Validate() error {
	if c.Dir == "" {
		return nil
	}
	ws, err := LoadDir(c.Dir) // the valid worlds, and every problem of the others
	if err := errors.Join(err, checkNames(ws)); err != nil {
		return fmt.Errorf("env.worlds: %w", err)
	}
	return nil
}

// Register registers the directory's worlds as envs (see RegisterDir).
func (c *Config) Register() error {
	if c.Dir == "" {
		return nil
	}
	if _, err := RegisterDir(c.Dir); err != nil {
		return fmt.Errorf("env.worlds: %w", err)
	}
	return nil
}
