package plans

import (
	"fmt"

	"gopkg.in/yaml.v3"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/catalogue"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// SandboxService is the service name of envs whose agents act in a real sandbox (the
// workspace tools of package tools, e.g. the codefix env). Only such envs apply storage
// and resource faults: a user-defined profile holding them is refused for other envs.
const SandboxService = "sandbox"

// boundaryKind reports whether k is a kind only a sandboxed env applies, at its
// sandbox's boundaries: storage faults on the file tools, resource faults
// through cgroup knobs, DNS faults at the sandbox's name server and connection faults at
// its gateway (package svcnet).
func boundaryKind(k catalogue.KindInfo) bool {
	return k.Layer == catalogue.LayerStorage || k.Layer == catalogue.LayerResource || IsDNSKind(k.Name) || IsConnKind(k.Name)
}

// IsConnKind reports whether kind is a connection fault a sandbox's gateway applies as
// a connection or request opens (reset, at once or after N bytes or ms; bandwidth;
// timeout) or, packet_loss, as its bytes pass (a stream's lost segments each stall it
// one RTO; a request loses itself once): a sim env's calls have no connection to meet it, so it travels in a plan's
// boundary_spec, and the gateway's relays (HTTP, TLS, plain TCP to allowed hosts, and the
// declared services) meet it.
func IsConnKind(kind string) bool {
	return kind == catalogue.KindReset || kind == catalogue.KindBandwidth || kind == catalogue.KindTimeout || kind == catalogue.KindPacketLoss
}

// notBoundary is the error of a kind a boundary_spec cannot hold.
const notBoundary = "is not a storage, resource or DNS fault, nor a connection fault (reset, bandwidth, timeout, packet_loss)"

// IsDNSKind reports whether kind is a DNS fault (dns_nxdomain, dns_servfail,
// dns_timeout): it acts on name lookups only.
func IsDNSKind(kind string) bool {
	return kind == catalogue.KindDNSNXDomain || kind == catalogue.KindDNSServFail || kind == catalogue.KindDNSTimeout
}

// specOf turns a compiled rule back into the spec entry it came from (its parameters at
// their compiled values, defaults included).
func specOf(r catalogue.Rule) FaultSpec {
	p := r.Probability
	f := FaultSpec{ID: r.ID, Kind: r.Kind.Name, Probability: &p, Match: r.Match, Params: map[string]any{}}
	for _, prm := range r.Kind.Params[1:] {
		if prm.Text {
			if r.HasParam(prm.Name) {
				f.Params[prm.Name] = r.Text(prm.Name)
			}
		} else if r.HasParam(prm.Name) {
			f.Params[prm.Name] = r.Num(prm.Name)
		}
	}
	if len(f.Params) == 0 {
		f.Params = nil
	}
	return f
}

// BoundarySpec encodes rules as the YAML spec a plan carries in boundary_spec (named
// name). It returns "" for no rules.
func BoundarySpec(name string, rules []catalogue.Rule) (string, error) {
	if len(rules) == 0 {
		return "", nil
	}
	s := Spec{Name: name, Faults: make([]FaultSpec, len(rules))}
	for i, r := range rules {
		s.Faults[i] = specOf(r)
	}
	return encodeBoundarySpec(&s)
}

// encodeBoundarySpec checks s and encodes it as a boundary_spec.
func encodeBoundarySpec(s *Spec) (string, error) {
	if _, err := s.Compile(); err != nil {
		return "", fmt.Errorf("boundary spec: %w", err)
	}
	for i, f := range s.Faults {
		if k, _ := catalogue.LookupKind(f.Kind); !boundaryKind(k) {
			return "", fmt.Errorf("boundary spec: faults[%d].kind: %s %s", i, f.Kind, notBoundary)
		}
	}
	b, err := yaml.Marshal(s)
	if err != nil {
		return "", fmt.Errorf("boundary spec: %w", err)
	}
	return string(b), nil
}

// BoundaryRules compiles a plan's boundary_spec: the storage, resource, DNS and
// connection faults a sandboxed env applies at its sandbox's boundaries (none for an empty spec). Give the
// rules to a Decider with the plan's seed (NewDecider(plan.Seed, rules)) for per-event
// faults, and to ResourcesFor for the ambient ones.
func BoundaryRules(plan *gauntletv1.FaultPlan) ([]catalogue.Rule, error) {
	text := plan.GetBoundarySpec()
	if text == "" {
		return nil, nil
	}
	_, rules, err := ParseSpec([]byte(text))
	if err != nil {
		return nil, fmt.Errorf("boundary_spec: %w", err)
	}
	for i, r := range rules {
		if !boundaryKind(r.Kind) {
			return nil, fmt.Errorf("boundary_spec: faults[%d].kind: %s %s", i, r.Kind.Name, notBoundary)
		}
	}
	return rules, nil
}
