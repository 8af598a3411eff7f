// Package runs owns what a run (a campaign of episodes) is: how one is validated, how
// its episodes are derived from it, and the share lists ("random=1,oracle=3") people write.
// The CLI validates with it before submitting and the scheduler validates again on receipt,
// so a bad run is refused with the same message wherever it comes from.
//
// Episode derivation is a pure function of (run, index): every process that derives
// episode 17 of a run gets the same id, seed and policy, which is what makes re-assignment
// after a crash idempotent.
package runs

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/url"
	"os"
	"os/user"
	"regexp"
	"strconv"
	"strings"
	"unicode"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
	"github.com/gauntlet-rl/gauntlet/pkg/policy"
	"github.com/gauntlet-rl/gauntlet/pkg/rng"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// Limits on a run.
const (
	MaxEpisodes        = 1_000_000_000
	MaxStepsLimit      = 100_000
	DefaultMaxInFlight = 2000 // the per-task cap on sandboxes in flight (docs/curriculum.md, max_in_flight)
)

// NewID returns a fresh run id ("r" and 12 hex digits).
func NewID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "r" + hex.EncodeToString(b[:])
}

// Submitter names whoever submits a run from this process, for the runs table:
// "user@host", each part "unknown" when the system cannot tell.
func Submitter() string {
	name := "unknown"
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	return name + "@" + host
}

// ParseShares parses "a=3,b=1" (or "a,b": weight 1 each) into shares, naming the bad
// element on error.
func ParseShares(field, s string) ([]*gauntletv1.Share, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out []*gauntletv1.Share
	for i, part := range strings.Split(s, ",") {
		name, weight, hasWeight := strings.Cut(strings.TrimSpace(part), "=")
		if name == "" {
			return nil, fmt.Errorf("%s[%d]: empty name in %q", field, i, s)
		}
		w := uint64(1)
		if hasWeight {
			var err error
			w, err = strconv.ParseUint(weight, 10, 32)
			if err != nil {
				return nil, fmt.Errorf("%s[%d]: weight %q of %s is not a whole number", field, i, weight, name)
			}
		}
		out = append(out, &gauntletv1.Share{Name: name, Weight: uint32(w)})
	}
	return out, nil
}

// FormatShares is the inverse of ParseShares.
func FormatShares(shares []*gauntletv1.Share) string {
	parts := make([]string, len(shares))
	for i, s := range shares {
		parts[i] = fmt.Sprintf("%s=%d", s.Name, s.Weight)
	}
	return strings.Join(parts, ",")
}

// Validate reports every problem of a run request at once, each naming its field.
func Validate(r *gauntletv1.RunRequested) error {
	var errs []error
	add := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if err := bus.ValidToken("run_id", r.GetRunId()); err != nil {
		errs = append(errs, err)
	}
	e, err := env.Lookup(r.GetEnv())
	if err != nil {
		add("env: %w", err)
	}
	if r.GetParamsJson() != "" && !json.Valid([]byte(r.GetParamsJson())) {
		add("params: not valid JSON: %q", r.GetParamsJson())
	} else if e != nil {
		// The env validates its own parameters; an episode built here is thrown away.
		if _, err := e.NewEpisode(env.Config{Seed: 1, Params: json.RawMessage(r.GetParamsJson())}); err != nil {
			add("params: %w", err)
		}
	}
	if len(r.GetPolicies()) == 0 {
		add("policies: at least one policy is needed (known: %s)", strings.Join(policy.Names(), ", "))
	}
	var total uint64
	seen := map[string]bool{}
	for i, p := range r.GetPolicies() {
		if _, err := policy.Lookup(p.Name); err != nil {
			add("policies[%d]: %w", i, err)
		}
		if seen[p.Name] {
			add("policies[%d]: %s listed twice", i, p.Name)
		}
		seen[p.Name] = true
		total += uint64(p.Weight)
	}
	if len(r.GetPolicies()) > 0 && total == 0 {
		add("policies: weights add up to zero")
	}
	// A policy that asks a model endpoint cannot play without one: refused here, not
	// recorded later as failed episodes.
	endpointed := ""
	for _, p := range r.GetPolicies() {
		if pol, err := policy.Lookup(p.Name); err == nil {
			if _, ok := pol.(policy.Endpointed); ok && endpointed == "" {
				endpointed = p.Name
			}
		}
	}
	switch url := r.GetPolicyEndpoint().GetUrl(); {
	case endpointed != "" && url == "":
		add("policy_endpoint.url: policy %s needs its model endpoint (gauntlet run --policy.http.url URL)", endpointed)
	case url != "" && !strings.HasPrefix(url, "http://") && !strings.HasPrefix(url, "https://"):
		add("policy_endpoint.url: %q is not an http(s) URL", url)
	case r.GetPolicyEndpoint() != nil && endpointed == "":
		add("policy_endpoint: no policy of the run asks a model endpoint")
	}
	for _, p := range endpointProblems(r.GetPolicyEndpoint()) {
		add("%s", p)
	}
	// A profile must fit the env (its kinds, its services, a sandbox for storage and
	// resource faults): the check `faults validate --env` and `faults plan --env` make,
	// every problem at once.
	var custom plans.CustomProfiles
	if e != nil {
		custom, err = plans.CheckCustomProfiles(r.GetCustomProfiles(), e.Spec().Services)
	} else {
		custom, err = plans.CompileCustomProfiles(r.GetCustomProfiles())
	}
	customNames := custom.Names()
	if err != nil {
		errs = append(errs, err)
		customNames = nil // the mix may still name them: refused above, not unknown
		for _, cp := range r.GetCustomProfiles() {
			customNames = append(customNames, cp.GetName())
		}
	}
	if len(r.GetProfiles()) > 0 {
		if err := plans.ValidateMix(r.GetProfiles(), customNames...); err != nil {
			errs = append(errs, err)
		}
	}
	if err := plans.ValidateDriftFor(r.GetDrift(), custom); err != nil {
		errs = append(errs, err)
	}
	if n := r.GetEpisodes(); n == 0 || n > MaxEpisodes {
		add("episodes: %d is outside [1, %d]", n, MaxEpisodes)
	}
	if r.GetMaxInFlight() == 0 {
		add("max_in_flight: must be at least 1")
	}
	if r.GetMaxSteps() > MaxStepsLimit {
		add("max_steps: %d is more than %d", r.GetMaxSteps(), MaxStepsLimit)
	}
	if d := r.GetRewardSpec(); d != "" && !IsSpecDigest(d) {
		add("reward_spec: %q is not a spec digest (sha256: and 64 hex digits; gauntlet run --reward-spec FILE puts the file and names it)", d)
	}
	return errors.Join(errs...)
}

// digestRE matches a reward spec's digest (pkg/scoring.Spec.Digest).
var digestRE = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// IsSpecDigest reports whether d has the form of a reward spec's digest
// (pkg/scoring.Spec.Digest): sha256: and 64 lowercase hex digits.
func IsSpecDigest(d string) bool { return digestRE.MatchString(d) }

// EpisodeID is the id of episode index of a run.
func EpisodeID(runID string, index uint64) string {
	return fmt.Sprintf("%s-%07d", runID, index)
}

// Episode derives episode index of a run. The run must be valid.
func Episode(r *gauntletv1.RunRequested, index uint64) *gauntletv1.EpisodeRequested {
	return &gauntletv1.EpisodeRequested{
		EpisodeId:           EpisodeID(r.RunId, index),
		RunId:               r.RunId,
		Index:               index,
		Env:                 r.Env,
		ParamsJson:          r.ParamsJson,
		Seed:                rng.DeriveN(r.Seed, "episode", index),
		Policy:              choose(r.Policies, rng.DeriveN(r.Seed, "policy-choice", index)),
		MaxSteps:            r.MaxSteps,
		RequestedAtUnixNano: r.RequestedAtUnixNano,
		RewardSpec:          r.RewardSpec,
		PolicyEndpoint:      r.PolicyEndpoint, // shared: messages are read only once built
	}
}

// choose picks a share by weight with a uniform 64-bit draw.
func choose(shares []*gauntletv1.Share, draw uint64) string {
	var total uint64
	for _, s := range shares {
		total += uint64(s.Weight)
	}
	if total == 0 {
		return ""
	}
	x := uint64(float64(draw>>11) / (1 << 53) * float64(total))
	x = min(x, total-1)
	for _, s := range shares {
		if x < uint64(s.Weight) {
			return s.Name
		}
		x -= uint64(s.Weight)
	}
	return shares[len(shares)-1].Name
}

// SuccessRate is ended successes over ended episodes that are not infra errors (NaN-free:
// 0 when none ended).
func SuccessRate(p *gauntletv1.RunProgress) float64 {
	n := scored(p)
	if n == 0 {
		return 0
	}
	return float64(p.GetSucceeded()) / float64(n)
}

// MeanReward is the mean episode reward of a run so far, over the episodes that did not
// end as infra errors (they carry no reward).
func MeanReward(p *gauntletv1.RunProgress) float64 {
	n := scored(p)
	if n == 0 || math.IsNaN(p.GetRewardSum()) {
		return 0
	}
	return p.GetRewardSum() / float64(n)
}

// scored is how many of a run's ended episodes are not infra errors.
func scored(p *gauntletv1.RunProgress) uint64 {
	if p.GetInfraErrors() >= p.GetEnded() {
		return 0
	}
	return p.GetEnded() - p.GetInfraErrors()
}

// maxModelBytes bounds a policy endpoint's model name.
const maxModelBytes = 256

// secretQuery matches the query parameters that carry keys in some APIs' URLs.
var secretQuery = regexp.MustCompile(`(?i)(key|token|secret|password|signature|sig)$`)

// endpointProblems are what is wrong with a run's model endpoint beyond its presence
// and scheme, each naming its field. The endpoint is recorded with the run (its events,
// the runs table, a curriculum's Temporal history), so no part of it may carry a secret:
// a key goes in a credential file the run names.
func endpointProblems(ep *gauntletv1.PolicyEndpoint) []string {
	if ep == nil {
		return nil
	}
	var out []string
	if raw := ep.GetUrl(); strings.HasPrefix(raw, "http://") || strings.HasPrefix(raw, "https://") {
		u, err := url.Parse(raw)
		switch {
		case err != nil:
			out = append(out, fmt.Sprintf("policy_endpoint.url: %q does not parse: %v", raw, err))
		case u.Host == "":
			out = append(out, fmt.Sprintf("policy_endpoint.url: %q names no host", raw))
		case u.User != nil:
			out = append(out, "policy_endpoint.url: carries a user and password; name a credential instead (policy_endpoint.credential)")
		case u.Fragment != "":
			out = append(out, fmt.Sprintf("policy_endpoint.url: %q has a fragment (#...)", raw))
		}
		if err == nil {
			for k := range u.Query() {
				if secretQuery.MatchString(k) {
					out = append(out, fmt.Sprintf("policy_endpoint.url: its query parameter %q may carry a key; name a credential instead (policy_endpoint.credential)", k))
				}
			}
		}
	}
	if m := ep.GetModel(); len(m) > maxModelBytes {
		out = append(out, fmt.Sprintf("policy_endpoint.model: %d bytes is longer than %d", len(m), maxModelBytes))
	} else if strings.ContainsFunc(m, unicode.IsControl) {
		out = append(out, fmt.Sprintf("policy_endpoint.model: %q has control characters", m))
	}
	if c := ep.GetCredential(); c != "" {
		if err := policy.CheckCredentialName(c); err != nil {
			out = append(out, "policy_endpoint.credential: "+err.Error())
		}
	}
	if l := ep.GetLogprobs(); l < gauntletv1.Logprobs_LOGPROBS_UNSPECIFIED || l > gauntletv1.Logprobs_LOGPROBS_OFF {
		out = append(out, fmt.Sprintf("policy_endpoint.logprobs: %d is none of unspecified, on, off", l))
	}
	return out
}
