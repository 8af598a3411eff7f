package inject

import (
	"github.com/gauntlet-rl/gauntlet/pkg/faults/catalogue"
)

// ResourcesFor decides, for one episode, which of rules' resource faults are in force:
// each fires with its probability, drawn by (seed, rule id, "episode", 0) like any other
// fault, and its kind says what it asks of the sandbox (KindInfo.ApplyAmbient). Several
// of one kind combine to the strictest (lowest CPU, lowest limit, fastest leak) or add up
// (clock offsets and drifts).
func ResourcesFor(seed uint64, rules []catalogue.Rule) catalogue.Resources {
	var r catalogue.Resources
	for _, rule := range AmbientRules(rules) {
		if !fireDraw(seed, rule.ID+"\x00episode", 0, rule.Probability) {
			continue
		}
		var detail string
		r, detail = rule.Kind.ApplyAmbient(r, &rule)
		r.Fired = append(r.Fired, catalogue.Fired{RuleID: rule.ID, Kind: rule.Kind.Name, Detail: detail})
	}
	return r
}
