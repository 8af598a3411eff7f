package plans

import (
	"fmt"
	"math/rand/v2"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/catalogue"
	"github.com/gauntlet-rl/gauntlet/pkg/rng"
)

// BoundaryCatalogueVersion identifies the built-in boundary faults below; the
// boundary_spec of every built-in plan of a sandboxed env names it in its description.
// It is apart from CatalogueVersion so that adding these faults left the plans of envs
// without a sandbox (shop) byte for byte as they were. Bump it whenever a boundary fault,
// a range or an id changes.
const BoundaryCatalogueVersion = "2026.11.1-b1"

// boundaryFamily groups the boundary faults a stress plan amplifies together.
type boundaryFamily int

const (
	bfStorageLatency boundaryFamily = iota // io_latency, iops_cap
	bfStorageErrors                        // disk_full, too_many_open_files, short_write
	bfResources                            // cpu_throttle, memory_leak
	numBoundaryFamilies
)

// specFunc draws a boundary fault's probability and parameters from its own generator;
// the plan sets its id and kind.
type specFunc func(g *rand.Rand) (prob float64, params map[string]any)

// boundaryFault is one built-in storage or resource fault of a sandboxed env's plans,
// instantiated as rule "sandbox.<name>" in the plan's boundary_spec. Like the catalogue's:
// a baseline fault is in every plan, a stress plan may swap its numbers for the
// amplified ones (or add a stress-only fault of the amplified family), an edge fault
// appears only in the edge plans that pick it.
type boundaryFault struct {
	name     string
	kind     string
	family   boundaryFamily
	baseline specFunc // nil: not in baseline plans
	stress   specFunc // nil: never amplified
	edge     specFunc // nil: never an edge fault
}

// boundaryCatalogue: rare mild IO latency at baseline (1-500 ms); under
// stress one family amplified (slow storage, failing storage, or a starved sandbox);
// at the edge one to three rare severe faults (a full disk, a filesystem gone read-only,
// no inodes, a memory leak). Names never collide with the catalogue's, so no rule shares
// another's random stream.
var boundaryCatalogue = []boundaryFault{
	{name: "io_latency", kind: catalogue.KindIOLatency, family: bfStorageLatency,
		baseline: ioLatency(span{0.02, 0.05, pct001}, span{1, 10, 1}, span{1, 5, 1}),
		stress:   ioLatency(span{0.30, 0.60, pct001}, span{50, 300, 5}, span{20, 100, 5})},
	{name: "iops_cap", kind: catalogue.KindIOPSCap, family: bfStorageLatency,
		stress: params1(always, "iops", span{20, 100, 5})},
	{name: "disk_full", kind: catalogue.KindDiskFull, family: bfStorageErrors,
		stress: params0(span{0.05, 0.15, pct001}),
		edge:   params0(span{0.01, 0.05, pct001})},
	{name: "too_many_open_files", kind: catalogue.KindTooManyFiles, family: bfStorageErrors,
		stress: params0(span{0.02, 0.08, pct001})},
	{name: "short_write", kind: catalogue.KindShortWrite, family: bfStorageErrors,
		stress: params1(span{0.02, 0.08, pct001}, "keep_fraction", span{0.3, 0.8, 0.05})},
	{name: "read_only", kind: catalogue.KindReadOnly, family: bfStorageErrors,
		edge: params0(span{0.01, 0.03, pct001})},
	{name: "inode_exhaustion", kind: catalogue.KindInodes, family: bfStorageErrors,
		edge: params0(span{0.01, 0.05, pct001})},
	{name: "cpu_throttle", kind: catalogue.KindCPUThrottle, family: bfResources,
		stress: params1(always, "cpu_fraction", span{0.2, 0.5, 0.05})},
	// Under stress a leak from a limit above a small env's own (codefix: 128 MiB), which it
	// crosses after a few minutes of the episode's virtual time; at the edge, in a quarter
	// to half of the episodes that pick it, faster and from a lower limit.
	{name: "memory_leak", kind: catalogue.KindMemoryLeak, family: bfResources,
		stress: leak(always, span{160, 256, 16}, span{8, 24, 1}),
		edge:   leak(span{0.25, 0.5, 0.05}, span{64, 128, 16}, span{24, 64, 1})},
}

func ioLatency(prob, meanMs, jitterMs span) specFunc {
	return func(g *rand.Rand) (float64, map[string]any) {
		p := prob.draw(g)
		return p, map[string]any{"mean_ms": meanMs.draw(g), "jitter_ms": jitterMs.draw(g)}
	}
}

func params0(prob span) specFunc {
	return func(g *rand.Rand) (float64, map[string]any) { return prob.draw(g), nil }
}

func params1(prob span, name string, v span) specFunc {
	return func(g *rand.Rand) (float64, map[string]any) {
		p := prob.draw(g)
		return p, map[string]any{name: v.draw(g)}
	}
}

func leak(prob, limitMB, mbPerMin span) specFunc {
	return func(g *rand.Rand) (float64, map[string]any) {
		p := prob.draw(g)
		return p, map[string]any{"limit_mb": limitMB.draw(g), "mb_per_min": mbPerMin.draw(g)}
	}
}

// boundaryChoiceRand is the generator of a layer's structural choices of boundary
// faults: keyed apart from choiceRand's "choice", so the sim rules' choices (which family
// a stress plan amplifies, which edge faults it picks) are the same with or without a
// sandbox. "boundary" has no dot, so it never collides with a rule id.
func boundaryChoiceRand(layerSeed uint64) *rand.Rand {
	return rng.New(layerSeed, "boundary", 0)
}

// planBoundary returns the boundary_spec of a built-in plan of a sandboxed env: the
// storage and resource faults of profile, each rule's numbers drawn from the generator
// ruleRand gives for (layer seed, rule id), like the sim rules'.
func planBoundary(profile string, baseSeed, stressSeed, edgeSeed uint64, ruleRand func(uint64, string) *rand.Rand) (string, error) {
	amplified := boundaryFamily(-1)
	var edgePicked map[string]bool
	switch profile {
	case ProfileStress:
		amplified = boundaryFamily(boundaryChoiceRand(stressSeed).IntN(int(numBoundaryFamilies)))
	case ProfileEdge:
		var names []string
		for _, f := range boundaryCatalogue {
			if f.edge != nil {
				names = append(names, f.name)
			}
		}
		g := boundaryChoiceRand(edgeSeed)
		k := 1 + g.IntN(3)
		edgePicked = map[string]bool{}
		for _, i := range g.Perm(len(names))[:k] {
			edgePicked[names[i]] = true
		}
	}
	s := Spec{Name: SandboxService + "-" + profile,
		Description: "built-in " + profile + " faults of a sandboxed env, boundary catalogue " + BoundaryCatalogueVersion}
	for _, f := range boundaryCatalogue {
		id := SandboxService + "." + f.name
		var p float64
		var params map[string]any
		switch {
		case f.stress != nil && f.family == amplified:
			p, params = f.stress(ruleRand(stressSeed, id))
		case f.edge != nil && edgePicked[f.name]:
			p, params = f.edge(ruleRand(edgeSeed, id))
		case f.baseline != nil:
			p, params = f.baseline(ruleRand(baseSeed, id))
		default:
			continue
		}
		s.Faults = append(s.Faults, FaultSpec{ID: id, Kind: f.kind, Probability: &p, Params: params})
	}
	text, err := encodeBoundarySpec(&s)
	if err != nil {
		return "", fmt.Errorf("plan: %s boundary faults: %w", profile, err)
	}
	return text, nil
}
