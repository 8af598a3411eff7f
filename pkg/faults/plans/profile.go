package plans

import (
	"errors"
	"fmt"
	"math/bits"
	"strings"

	"github.com/gauntlet-rl/gauntlet/pkg/rng"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// Profile names.
const (
	// ProfileBaseline is average production load: every service a little slow, rarely
	// failing.
	ProfileBaseline = "baseline"
	// ProfileStress is the baseline with one fault family amplified on one or two services.
	ProfileStress = "stress"
	// ProfileEdge is the baseline plus three or more rare faults at once.
	ProfileEdge = "edge"
)

// ErrUnknownProfile is wrapped by every error about a profile name outside the catalogue.
var ErrUnknownProfile = errors.New("unknown profile")

// profiles is the catalogue's profile list, sorted.
var profiles = []string{ProfileBaseline, ProfileEdge, ProfileStress}

// Profiles returns the names of the catalogue's profiles, sorted.
func Profiles() []string {
	return append([]string(nil), profiles...)
}

// DefaultMix returns the mix used when a run names none: baseline 60, stress 25, edge 15.
// The caller owns the returned slice.
func DefaultMix() []*gauntletv1.Share {
	return []*gauntletv1.Share{
		{Name: ProfileBaseline, Weight: 60},
		{Name: ProfileStress, Weight: 25},
		{Name: ProfileEdge, Weight: 15},
	}
}

// ValidateMix reports every problem of a profile mix at once, each naming its field:
// missing entries, unknown or duplicate names, and a total weight of zero. An empty mix is
// valid: it stands for DefaultMix. Names in custom (a run's user-defined profiles) are
// known beside the built-in ones.
func ValidateMix(mix []*gauntletv1.Share, custom ...string) error {
	var errs []error
	var total uint64
	for i, s := range mix {
		if s == nil {
			errs = append(errs, fmt.Errorf("profiles[%d]: missing share", i))
			continue
		}
		total += uint64(s.Weight)
		if !isProfile(s.Name) && !containsString(custom, s.Name) {
			errs = append(errs, fmt.Errorf("profiles[%d].name: %w", i, unknownProfile(s.Name, custom...)))
			continue
		}
		// Mixes hold a handful of entries: a quadratic scan beats allocating a set.
		for j, prev := range mix[:i] {
			if prev != nil && prev.Name == s.Name {
				errs = append(errs, fmt.Errorf("profiles[%d].name: duplicate profile %q (first at profiles[%d])", i, s.Name, j))
				break
			}
		}
	}
	if len(mix) > 0 && total == 0 {
		errs = append(errs, errors.New("profiles: total weight is 0; give at least one profile a positive weight"))
	}
	return errors.Join(errs...)
}

// ChooseProfile draws an episode's profile from mix, with probability proportional to each
// entry's weight; an empty mix means DefaultMix. The choice is keyed by (seed, "profile"),
// so the same seed and mix always choose the same profile. custom names the run's
// user-defined profiles, which the mix may name.
func ChooseProfile(seed uint64, mix []*gauntletv1.Share, custom ...string) (string, error) {
	if len(mix) == 0 {
		mix = DefaultMix()
	}
	if err := ValidateMix(mix, custom...); err != nil {
		return "", fmt.Errorf("choose profile: %w", err)
	}
	var total uint64
	for _, s := range mix {
		total += uint64(s.Weight)
	}
	// The high word of x*total is uniform on [0,total) up to a bias of total/2^64.
	pick, _ := bits.Mul64(rng.Derive(seed, "profile"), total)
	for _, s := range mix {
		if pick < uint64(s.Weight) {
			return s.Name, nil
		}
		pick -= uint64(s.Weight)
	}
	// Unreachable: pick < total. Kept so a future bug shows as an error, not a panic.
	return "", fmt.Errorf("choose profile: weight walk overran total %d", total)
}

func isProfile(name string) bool {
	for _, p := range profiles {
		if p == name {
			return true
		}
	}
	return false
}

func unknownProfile(name string, custom ...string) error {
	known := strings.Join(profiles, ", ")
	if len(custom) > 0 {
		known += "; the run's own: " + strings.Join(custom, ", ")
	}
	return fmt.Errorf("%w %q (known: %s)", ErrUnknownProfile, name, known)
}
