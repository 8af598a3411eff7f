package runtimes

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/gauntlet-rl/gauntlet/pkg/childproc"
	"github.com/gauntlet-rl/gauntlet/pkg/registry"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
)

// Registration is one runtime's row: the name --sandbox.runtime selects it by, how to
// open it and what it requires of a Config. Each runtime registers its row from its own
// file of this package (process.go, containerd.go) in an init function, in the manner of
// containerd's builtin plug-ins, so adding a runtime is one new file and no switch.
type Registration struct {
	// Name is the value of Config.Runtime (and --sandbox.runtime) that selects the
	// runtime.
	Name string
	// Open builds the runtime over stateDir (cleaned, never empty), with what it
	// started for it. On error it has stopped whatever it started.
	Open func(ctx context.Context, c Config, stateDir string, log *slog.Logger) (Opened, error)
	// Validate reports what c gets wrong for this runtime, beyond what every runtime
	// requires (a state directory); nil when it has nothing to check.
	Validate func(c Config) []error
}

// Opened is what a row's Open returns.
type Opened struct {
	// Runtime is the runtime opened.
	Runtime sandbox.Runtime
	// Stop stops what Open started for the runtime (a private daemon); it runs after the
	// runtime's Close. Nil when Open started nothing.
	Stop func() error
	// Supervisor, not yet running, restarts a private daemon Open started when it dies
	// and tells whether it serves (Sandboxes.Ready asks it); a long-lived owner runs it
	// until it stops the runtime. Nil when Open started nothing.
	Supervisor *childproc.Supervisor
}

// registered holds the rows by name; Config.Validate reports an unknown name itself,
// listing the known ones.
var registered = registry.New[Registration]("sandbox runtime", errors.New("unknown sandbox runtime"))

// Register adds a runtime's row. It panics on an empty or duplicate name or a row without
// Open: rows are registered by init functions, so either is a programming error that
// shows at start-up.
func Register(r Registration) {
	if r.Name == "" || r.Open == nil {
		panic("sandbox runtime: a row without a name or Open")
	}
	registered.Register(r.Name, r)
}

// Names lists the registered runtimes, sorted.
func Names() []string { return registered.Names() }

// unknownRuntime is Validate's error for a name no row has.
func unknownRuntime(name string) error {
	return fmt.Errorf("sandbox.runtime: %q is not one of %s (or empty for none)", name, strings.Join(Names(), ", "))
}
