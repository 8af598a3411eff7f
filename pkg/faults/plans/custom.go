package plans

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/catalogue"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// simKinds are the fault kinds a sim env applies on virtual time.
var simKinds = []string{catalogue.KindHTTPError, catalogue.KindLatency, catalogue.KindTruncate}

// CustomProfiles are a run's user-defined profiles, compiled, by name.
type CustomProfiles map[string][]catalogue.Rule

// Names returns the profile names, sorted.
func (c CustomProfiles) Names() []string {
	out := make([]string, 0, len(c))
	for n := range c {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// CompileCustomProfiles parses and checks a run's user-defined profiles for a sim env:
// each must be a valid spec (SLA included) whose name matches, not a built-in or duplicate
// name, holding only faults the sim applies (http_error, latency, truncate) targeted by
// services or tools, or storage, resource, DNS and connection faults (reset, bandwidth,
// timeout), which sandboxed envs apply at their sandbox's boundaries (Plan puts them in the plan's boundary_spec). Errors name the profile ("custom_profiles[1]: faults[0].kind: ...").
// What depends on the env (its services, its sandbox) is CheckCustomProfiles'.
func CompileCustomProfiles(cps []*gauntletv1.CustomProfile) (CustomProfiles, error) {
	out, errs := compileCustomProfiles(cps)
	for _, name := range out.Names() {
		for _, err := range fitErrors(out[name], nil) {
			errs = append(errs, fmt.Errorf("%s (%s): %w", where(cps, name), name, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return out, nil
}

// CheckCustomProfiles compiles a run's user-defined profiles and checks that each can run
// in an env with these services, reporting every problem of every profile at once: what
// CompileCustomProfiles refuses and what Plan refuses for the env, each once. It is the
// one check a run's submission (runs.Validate), `gauntlet faults validate --env` and
// `gauntlet faults plan --env` make, so a profile that passes one passes all three.
func CheckCustomProfiles(cps []*gauntletv1.CustomProfile, services []string) (CustomProfiles, error) {
	out, errs := compileCustomProfiles(cps)
	for _, name := range out.Names() {
		if _, err := out.Plan(1, name, services); err != nil {
			errs = append(errs, fmt.Errorf("custom_profiles (%s): %w", name, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return out, nil
}

// compileCustomProfiles parses the profiles and checks their names: the profiles that
// parsed, and the problems of the others.
func compileCustomProfiles(cps []*gauntletv1.CustomProfile) (CustomProfiles, []error) {
	out := CustomProfiles{}
	var errs []error
	for i, cp := range cps {
		where := fmt.Sprintf("custom_profiles[%d]", i)
		if cp == nil {
			errs = append(errs, fmt.Errorf("%s: missing profile", where))
			continue
		}
		spec, rules, err := ParseSpec([]byte(cp.SpecYaml))
		if err != nil {
			errs = append(errs, fmt.Errorf("%s (%s): %w", where, cp.Name, err))
			continue
		}
		if spec.Name != cp.Name {
			errs = append(errs, fmt.Errorf("%s.name: %q differs from the spec's name %q", where, cp.Name, spec.Name))
			continue
		}
		if _, dup := out[cp.Name]; dup {
			errs = append(errs, fmt.Errorf("%s.name: duplicate profile %q", where, cp.Name))
			continue
		}
		out[cp.Name] = rules
	}
	return out, errs
}

// where names the profile in a run's list ("custom_profiles[1]").
func where(cps []*gauntletv1.CustomProfile, name string) string {
	for i, cp := range cps {
		if cp != nil && cp.Name == name {
			return fmt.Sprintf("custom_profiles[%d]", i)
		}
	}
	return "custom_profiles"
}

// fitErrors is every reason rules cannot run in an env with services: kinds no env
// applies, targets a sim's calls lack and, when services is not nil, storage, resource
// and DNS faults in an env without a sandbox and services the env does not have. Each
// problem names the fault, by index for the spec's own, by id for the env's.
func fitErrors(rules []catalogue.Rule, services []string) []error {
	var errs []error
	for j, r := range rules {
		if boundaryKind(r.Kind) {
			switch {
			case services == nil || slices.Contains(services, SandboxService):
			case IsConnKind(r.Kind.Name):
				// A sim env's calls have no connection: say what it applies instead.
				errs = append(errs, fmt.Errorf("faults[%d].kind: %s cannot apply in a sim env, which applies %s (a connection fault applies only in envs whose agents act in a real sandbox, service %q)", j, r.Kind.Name, strings.Join(simKinds, ", "), SandboxService))
			default:
				errs = append(errs, fmt.Errorf("fault %s: %s applies only in envs whose agents act in a real sandbox (service %q); this env has %s", r.ID, r.Kind.Name, SandboxService, strings.Join(services, ", ")))
			}
			continue
		}
		if !slices.Contains(simKinds, r.Kind.Name) {
			errs = append(errs, fmt.Errorf("faults[%d].kind: %s cannot apply in a sim env, which applies %s", j, r.Kind.Name, strings.Join(simKinds, ", ")))
		}
		if m := r.Match; len(m.Hosts)+len(m.Paths)+len(m.Methods)+len(m.Ops) > 0 {
			errs = append(errs, fmt.Errorf("faults[%d].match: a sim env's calls have no host, path, method or op; target services or tools", j))
		}
		if services != nil && len(r.Match.Tools) == 0 {
			for _, s := range r.Match.Services {
				if !slices.Contains(services, s) {
					errs = append(errs, fmt.Errorf("fault %s: unknown service %q (the env has %s)", r.ID, s, strings.Join(services, ", ")))
				}
			}
		}
	}
	return errs
}

// Plan derives the plan of a user-defined profile for an env simulating services: each
// fault becomes one rule per service it targets ("<service>.<fault id>"), or per tool
// ("<tool>.<fault id>") when it names tools. The numbers are the profile's; the seed keys
// the draws as for built-in plans. Services named by the profile must exist in the env;
// every reason the profile cannot run in it is reported at once.
// Storage, resource, DNS and connection faults go, unchanged, to the plan's boundary_spec, for envs with
// service SandboxService only.
func (c CustomProfiles) Plan(seed uint64, name string, services []string) (*gauntletv1.FaultPlan, error) {
	rules, ok := c[name]
	if !ok {
		return nil, fmt.Errorf("plan: profile: %w", unknownProfile(name, c.Names()...))
	}
	svcs, err := sortedServices(services)
	if err != nil {
		return nil, fmt.Errorf("plan: %w", err)
	}
	if svcs == nil {
		svcs = []string{} // an env, even without services: fitErrors checks against it
	}
	switch errs := fitErrors(rules, svcs); {
	case len(errs) == 1:
		return nil, fmt.Errorf("plan: profile %s: %w", name, errs[0])
	case len(errs) > 1:
		return nil, fmt.Errorf("plan: profile %s: %d problems in this env:\n%w", name, len(errs), errors.Join(errs...))
	}
	plan := &gauntletv1.FaultPlan{Profile: name, Seed: seed, CatalogueVersion: CatalogueVersion}
	var boundary []catalogue.Rule
	for _, r := range rules {
		if boundaryKind(r.Kind) {
			boundary = append(boundary, r)
			continue
		}
		targets := r.Match.Tools
		if len(targets) == 0 {
			targets = r.Match.Services
		}
		if len(targets) == 0 {
			targets = svcs
		}
		for _, t := range targets {
			pr := &gauntletv1.FaultRule{Id: t + "." + r.ID, Target: t, Probability: r.Probability}
			switch r.Kind.Name {
			case catalogue.KindHTTPError:
				pr.Spec = &gauntletv1.FaultRule_HttpError{HttpError: &gauntletv1.HTTPErrorFault{
					Status: uint32(r.Num("status")), RetryAfterMs: uint32(r.Num("retry_after_ms"))}}
			case catalogue.KindLatency:
				pr.Spec = &gauntletv1.FaultRule_Latency{Latency: &gauntletv1.LatencyFault{MeanMs: r.Num("mean_ms"), JitterMs: r.Num("jitter_ms")}}
			case catalogue.KindTruncate:
				pr.Spec = &gauntletv1.FaultRule_Truncate{Truncate: &gauntletv1.TruncateFault{KeepFraction: r.Num("keep_fraction")}}
			default:
				return nil, fmt.Errorf("plan: profile %s: fault %s: kind %s cannot apply in a sim env", name, r.ID, r.Kind.Name)
			}
			plan.Rules = append(plan.Rules, pr)
		}
	}
	if plan.BoundarySpec, err = BoundarySpec(name, boundary); err != nil {
		return nil, fmt.Errorf("plan: profile %s: %w", name, err)
	}
	if err := Validate(plan); err != nil {
		return nil, fmt.Errorf("plan: profile %s: %w", name, err)
	}
	return plan, nil
}
