package plans

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/gauntlet-rl/gauntlet/pkg/rng"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// Derive derives the fault plan of an episode with the given seed and profile whose env
// simulates services (e.g. shop's "catalog", "inventory", "payment", "shipping").
//
// Every service gets the baseline rules "<service>.http_429", ".http_503", ".latency" and
// ".truncate". A stress plan amplifies one fault family (errors, latency or truncation,
// chosen from the seed) on one or two services; an edge plan adds three to five rare faults
// (auth errors, 500s, latency spikes, severe truncation) spread over the services. Rules are
// ordered by service name, then catalogue order. The plan depends on the set of services,
// not on their order, and passes Validate.
//
// An env whose agents act in a real sandbox (service SandboxService) also gets storage
// and resource faults in the plan's boundary_spec (see boundaryCatalogue): rare
// mild IO latency at baseline, one boundary family amplified under stress (slow storage,
// failing storage or a starved sandbox), one to three rare severe faults at the edge
// (disk full, read-only filesystem, inode exhaustion, memory leak). Their numbers are
// keyed like the rules' and their choices by a stream of their own, so the rules of
// every plan, and the whole plan of an env without a sandbox, are the same as without
// them.
func Derive(seed uint64, profile string, services []string) (*gauntletv1.FaultPlan, error) {
	if !isProfile(profile) {
		return nil, fmt.Errorf("plan: profile: %w", unknownProfile(profile))
	}
	svcs, err := sortedServices(services)
	if err != nil {
		return nil, fmt.Errorf("plan: %w", err)
	}

	// A rule's numbers come from a generator keyed by (seed, "plan", layer, rule id), so
	// they never depend on which other rules or services exist.
	baseSeed := rng.Derive(seed, "plan", ProfileBaseline)
	stressSeed := rng.Derive(seed, "plan", ProfileStress)
	edgeSeed := rng.Derive(seed, "plan", ProfileEdge)

	var st stressChoice
	var edge []bool
	switch profile {
	case ProfileStress:
		st = chooseStress(stressSeed, len(svcs))
	case ProfileEdge:
		edge = chooseEdge(edgeSeed, len(svcs))
	}

	plan := &gauntletv1.FaultPlan{Profile: profile, Seed: seed, CatalogueVersion: CatalogueVersion,
		Rules: make([]*gauntletv1.FaultRule, 0, len(svcs)*len(simFaults))}
	// One generator, reseeded per rule to exactly the stream rng.New would give it.
	pcg := &rand.PCG{}
	g := rand.New(pcg)
	ruleRand := func(layerSeed uint64, id string) *rand.Rand {
		rng.Reseed(pcg, layerSeed, id, 0)
		return g
	}
	for si, svc := range svcs {
		ids := ruleIDsOf(svc)
		for fi, f := range simFaults {
			id := ids[fi]
			var r *gauntletv1.FaultRule
			switch {
			case f.edge != nil:
				if edge == nil || !edge[si*len(simFaults)+fi] {
					continue
				}
				r = f.edge(ruleRand(edgeSeed, id))
			case f.stress != nil && st.amplifies(si, f.family):
				r = f.stress(ruleRand(stressSeed, id))
			default:
				r = f.baseline(ruleRand(baseSeed, id))
			}
			r.Id, r.Target = id, svc
			plan.Rules = append(plan.Rules, r)
		}
	}
	if slices.Contains(svcs, SandboxService) {
		if plan.BoundarySpec, err = planBoundary(profile, baseSeed, stressSeed, edgeSeed, ruleRand); err != nil {
			return nil, err
		}
	}
	return plan, nil
}

// ruleIDs holds, per service, the ids of its catalogue rules ("<service>.<fault>", in
// catalogue order), built once per service: concatenating them for every plan was about a
// third of Plan's time. Services come from env specs, a handful; past maxCachedServices
// the ids are built per call.
var (
	ruleIDs      sync.Map // service → []string
	ruleIDsCount atomic.Int32
)

const maxCachedServices = 256

func ruleIDsOf(svc string) []string {
	if v, ok := ruleIDs.Load(svc); ok {
		return v.([]string)
	}
	ids := make([]string, len(simFaults))
	for i, f := range simFaults {
		ids[i] = svc + "." + f.name
	}
	if ruleIDsCount.Load() < maxCachedServices {
		if _, loaded := ruleIDs.LoadOrStore(svc, ids); !loaded {
			ruleIDsCount.Add(1)
		}
	}
	return ids
}

// choiceRand is the generator of a layer's structural choices. "choice" has no dot, so it
// never collides with a rule id.
func choiceRand(layerSeed uint64) *rand.Rand {
	return rng.New(layerSeed, "choice", 0)
}

// stressChoice is what a stress plan amplifies: one family on a set of services.
type stressChoice struct {
	family   family
	services []bool // indexed like the sorted services; nil outside stress plans
}

func (c stressChoice) amplifies(service int, f family) bool {
	return c.services != nil && c.services[service] && c.family == f
}

// chooseStress picks the family to amplify and one or two of n services to amplify it on.
func chooseStress(layerSeed uint64, n int) stressChoice {
	g := choiceRand(layerSeed)
	c := stressChoice{family: family(g.IntN(int(numFamilies))), services: make([]bool, n)}
	k := min(1+g.IntN(2), n)
	for _, i := range g.Perm(n)[:k] {
		c.services[i] = true
	}
	return c
}

// chooseEdge picks three to five distinct (service, edge fault) pairs out of n services,
// returned as a set indexed by service*len(simFaults) + fault.
func chooseEdge(layerSeed uint64, n int) []bool {
	var pairs []int
	for si := 0; si < n; si++ {
		for fi, f := range simFaults {
			if f.edge != nil {
				pairs = append(pairs, si*len(simFaults)+fi)
			}
		}
	}
	g := choiceRand(layerSeed)
	k := min(3+g.IntN(3), len(pairs))
	picked := make([]bool, n*len(simFaults))
	for _, i := range g.Perm(len(pairs))[:k] {
		picked[pairs[i]] = true
	}
	return picked
}

// sortedServices checks the service list and returns a sorted copy, so plans depend on the
// set of services and not on the order an env declares them in.
func sortedServices(services []string) ([]string, error) {
	if len(services) == 0 {
		return nil, errors.New("services: must name at least one service")
	}
	var errs []error
	first := make(map[string]int, len(services))
	for i, s := range services {
		switch {
		case s == "":
			errs = append(errs, fmt.Errorf("services[%d]: must not be empty", i))
		case strings.Contains(s, "*"):
			errs = append(errs, fmt.Errorf("services[%d]: %q must not contain \"*\", the target wildcard", i, s))
		default:
			if j, dup := first[s]; dup {
				errs = append(errs, fmt.Errorf("services[%d]: duplicate service %q (first at services[%d])", i, s, j))
			} else {
				first[s] = i
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	out := slices.Clone(services)
	slices.Sort(out)
	return out, nil
}
