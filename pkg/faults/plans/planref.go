package plans

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"

	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// Plans by reference.
//
// A plan is a pure function of its inputs: the profile, the plan seed, the env's services,
// the catalogue version and the drift values in force. A built-in profile's rules follow
// from the seed by code (Plan); a user-defined profile's rules are the profile's own and
// do not depend on the seed, so every episode of a profile shares them: its template.
// Carrying and recording the ~23 rules of every episode cost more than everything else
// fault injection does (docs/benchmarks.md, "Fault cost in the pipeline"), so plans travel
// and are recorded compact: inputs, the template's id for a user-defined profile, and,
// once the plan has been played, the digest of the whole plan (Seal). Expand derives the
// rules wherever they are needed (the worker, the env API, a replay) and checks a recorded
// digest, so a catalogue or profile that changed under a recorded plan is an error, never
// a silent difference.

// Digest returns the digest of a plan: SHA-256 over the deterministic protobuf encoding of
// every field but digest, compact and template, its first 16 bytes as 32 hex digits. Two plans have the same
// digest exactly when they carry the same faults with the same numbers.
func Digest(p *gauntletv1.FaultPlan) (string, error) {
	// Only the fields that say what the plan does; TestDigestCoversEveryField keeps
	// this list and the message in step.
	view := &gauntletv1.FaultPlan{
		Profile: p.GetProfile(), Seed: p.GetSeed(), Rules: p.GetRules(),
		CatalogueVersion: p.GetCatalogueVersion(), DriftValues: p.GetDriftValues(),
		BoundarySpec: p.GetBoundarySpec(),
	}
	// The generated encoder (gauntletv1.Marshal) writes fields in number order with no
	// maps involved, the same bytes as protobuf-go's deterministic mode
	// (TestCodecMatchesProtobufGo), without reflection.
	b, err := gauntletv1.Marshal(view)
	if err != nil {
		return "", fmt.Errorf("digest of plan: %w", err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:16]), nil
}

// NewTemplate returns the template of a user-defined profile's plan, as CustomProfiles.Plan
// derives it and before drift, and the template's id (its Digest). The template keeps the
// profile, the catalogue version, the rules and the boundary spec; its seed is zero.
func NewTemplate(p *gauntletv1.FaultPlan) (*gauntletv1.FaultPlan, string, error) {
	if p.GetCompact() {
		return nil, "", errors.New("template: the plan is compact; a template needs its rules")
	}
	if len(p.GetDriftValues()) > 0 {
		return nil, "", errors.New("template: the plan has drift applied; take the template before ApplyDrift")
	}
	t := &gauntletv1.FaultPlan{Profile: p.GetProfile(), CatalogueVersion: p.GetCatalogueVersion(),
		Rules: p.GetRules(), BoundarySpec: p.GetBoundarySpec()}
	id, err := Digest(t)
	if err != nil {
		return nil, "", err
	}
	return t, id, nil
}

// Compact returns the reference form of full, a plan as Plan or CustomProfiles.Plan derives
// it with drift applied: its inputs, its digest and the id of its template (empty for a
// built-in profile; NewTemplate's id for a user-defined one). A built-in profile's plan
// must have been made by this binary's catalogue, as Expand re-derives it from code.
func Compact(full *gauntletv1.FaultPlan, template string) (*gauntletv1.FaultPlan, error) {
	if full.GetCompact() {
		return full, nil
	}
	if template == "" && !isProfile(full.GetProfile()) {
		return nil, fmt.Errorf("compact plan: profile %q is not built-in, so its plan needs a template", full.GetProfile())
	}
	d := full.GetDigest()
	if d == "" {
		var err error
		if d, err = Digest(full); err != nil {
			return nil, err
		}
	}
	return &gauntletv1.FaultPlan{
		Profile: full.GetProfile(), Seed: full.GetSeed(), CatalogueVersion: full.GetCatalogueVersion(),
		DriftValues: full.GetDriftValues(), Digest: d, Compact: true, Template: template,
	}, nil
}

// Expand returns the whole plan of p, its Digest set. A plan that is not compact is
// returned as it is. A compact one is re-derived (derive); when p has a digest (a recorded
// plan), the result's must be the same, so a catalogue or profile that changed under a
// recorded plan is an error, never a silent difference. A compact plan as the faults
// service hands it out has none yet: whoever plays it records the digest of the plan it
// expanded (Seal), once, instead of the faults service deriving every plan twice.
//
// The returned plan may share its rules with template when no drift applies: treat it as
// read-only (NewInjector and the envs do).
func Expand(p *gauntletv1.FaultPlan, services []string, template *gauntletv1.FaultPlan) (*gauntletv1.FaultPlan, error) {
	if !p.GetCompact() {
		return p, nil
	}
	full, err := derive(p, services, template)
	if err != nil {
		return nil, err
	}
	d, err := Digest(full)
	if err != nil {
		return nil, err
	}
	if want := p.GetDigest(); want != "" && d != want {
		return nil, fmt.Errorf("expand plan: digest: re-derived %s, the plan says %s (profile %q, seed %d: did the catalogue or the profile change?)", d, want, p.GetProfile(), p.GetSeed())
	}
	full.Digest = d
	return full, nil
}

// Seal records on p, a compact plan that has no digest yet, the digest of full, the plan
// Expand made of it, and the drift values as applied, so the record of the episode checks
// a later re-derivation. A plan
// that is not compact, or already has a digest, is left as it is.
func Seal(p, full *gauntletv1.FaultPlan) {
	if p.GetCompact() && p.GetDigest() == "" {
		p.Digest = full.GetDigest()
		p.DriftValues = full.GetDriftValues() // as applied: whole numbers rounded
	}
}

// derive makes the whole plan from a compact plan's inputs (its digest is not used): a
// built-in profile's rules from the seed and services (the env's, as the faults service
// used them), a user-defined profile's from template, which must be the template p names
// (nil when it names none); then p's drift values are applied. The result's drift values
// are the ones applied (whole numbers rounded), its digest unset.
func derive(p *gauntletv1.FaultPlan, services []string, template *gauntletv1.FaultPlan) (*gauntletv1.FaultPlan, error) {
	if v := p.GetCatalogueVersion(); v != CatalogueVersion {
		return nil, fmt.Errorf("expand plan: catalogue_version: plan made by catalogue %q, this binary has %q", v, CatalogueVersion)
	}
	drift := p.GetDriftValues()
	var full *gauntletv1.FaultPlan
	switch {
	case p.GetTemplate() == "":
		if !isProfile(p.GetProfile()) {
			return nil, fmt.Errorf("expand plan: template: profile %q is not built-in and the plan names no template", p.GetProfile())
		}
		var err error
		if full, err = Derive(p.GetSeed(), p.GetProfile(), services); err != nil {
			return nil, fmt.Errorf("expand plan: %w", err)
		}
	case template == nil:
		return nil, fmt.Errorf("expand plan: template: plan names template %s, none given", p.GetTemplate())
	case template.GetProfile() != p.GetProfile():
		return nil, fmt.Errorf("expand plan: template: %s is of profile %q, the plan's is %q", p.GetTemplate(), template.GetProfile(), p.GetProfile())
	default:
		rules := template.GetRules()
		if len(drift) > 0 { // ApplyDrift rewrites rules: never the shared template's
			rules = make([]*gauntletv1.FaultRule, len(template.GetRules()))
			for i, r := range template.GetRules() {
				rules[i] = proto.CloneOf(r)
			}
		}
		full = &gauntletv1.FaultPlan{Profile: p.GetProfile(), Seed: p.GetSeed(),
			CatalogueVersion: template.GetCatalogueVersion(), Rules: rules, BoundarySpec: template.GetBoundarySpec()}
	}
	if len(drift) > 0 {
		if err := ApplyDrift(full, drift); err != nil {
			return nil, fmt.Errorf("expand plan: %w", err)
		}
	}
	return full, nil
}
