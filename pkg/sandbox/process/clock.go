package process

import (
	"fmt"
	"path/filepath"
	"strconv"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
)

// faketimeGlob finds Debian's libfaketime (package libfaketime) for any architecture.
const faketimeGlob = "/usr/lib/*/faketime/libfaketime.so.1"

// ClockSkewEnv implements sandbox.ClockSkewer with libfaketime: sandboxes see the host's
// /usr, so LD_PRELOAD of the host's library reaches every dynamically linked program a
// command runs (sh, date, coreutils, interpreters); statically linked programs and raw
// clock syscalls see the real clock. FAKETIME sets the offset and the rate from each
// process's start; FAKETIME_DONT_FAKE_MONOTONIC keeps monotonic clocks real. Without the
// library (scripts/deps.sh installs it) it returns ErrUnavailable.
func (r *Runtime) ClockSkewEnv(offset time.Duration, rate float64) ([]string, error) {
	libs, _ := filepath.Glob(faketimeGlob)
	if len(libs) == 0 {
		return nil, fmt.Errorf("clock skew: %w: libfaketime not found (%s); install Debian's libfaketime", sandbox.ErrUnavailable, faketimeGlob)
	}
	if !(rate > 0) {
		return nil, fmt.Errorf("clock skew: %w: rate %v must be positive", sandbox.ErrInvalid, rate)
	}
	spec := strconv.FormatFloat(offset.Seconds(), 'f', 3, 64)
	if offset >= 0 {
		spec = "+" + spec
	}
	if rate != 1 {
		spec += " x" + strconv.FormatFloat(rate, 'f', -1, 64)
	}
	return []string{"LD_PRELOAD=" + libs[0], "FAKETIME=" + spec, "FAKETIME_DONT_FAKE_MONOTONIC=1"}, nil
}
