package mcpenv

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
)

// ErrNoOraclePlan is returned by the oracle's Act when the declaration has no oracle plan.
var ErrNoOraclePlan = errors.New("mcp: the declaration has no oracle plan")

// Oracle plays the declaration's oracle plan: each action in turn, "{seed}" in its
// arguments replaced by the episode's seed (read from the first observation: the seed
// the policy hands Oracle is its own, not the episode's), repeating an action whose call failed (an injected fault, a tool
// error, a truncated answer) until it goes through, and the last one while the episode
// goes on.
func (x *mcpEnv) Oracle(uint64) env.Agent { return &oracle{d: x.d} }

type oracle struct {
	d    *Decl
	seed string
	next int
	last int
}

func (o *oracle) Act(t env.Turn) (env.Action, error) {
	if len(o.d.Oracle) == 0 {
		return env.Action{}, fmt.Errorf("%w (%s)", ErrNoOraclePlan, o.d.Name)
	}
	if t.Step == 0 {
		o.readSeed(t.Observation)
	} else if failed(t.Observation) {
		o.next = o.last
	}
	i := min(o.next, len(o.d.Oracle)-1)
	o.last, o.next = i, i+1
	a := o.d.Oracle[i]
	args, err := json.Marshal(replaceSeed(a.Args, o.seed))
	if err != nil {
		return env.Action{}, fmt.Errorf("mcp %s: oracle[%d].args: %w", o.d.Name, i, err)
	}
	return env.Action{Tool: a.Tool, Args: args}, nil
}

// readSeed takes the episode's seed from its first observation.
func (o *oracle) readSeed(first []byte) {
	var r struct {
		Seed uint64 `json:"seed"`
	}
	_ = json.Unmarshal(first, &r) // the env's own first observation
	o.seed = strconv.FormatUint(r.Seed, 10)
}

// Follow takes over an episode at a step: the plan goes on after the action played.
func (o *oracle) Follow(t env.Turn, played env.Action) {
	if t.Step == 0 {
		o.readSeed(t.Observation)
	}
	for i, a := range o.d.Oracle {
		if a.Tool == played.Tool && i >= o.next {
			o.last, o.next = i, i+1
			return
		}
	}
}

// failed reports whether an observation is of a call that did not go through.
func failed(obs []byte) bool {
	var o struct {
		OK        *bool `json:"ok"`
		IsError   bool  `json:"is_error"`
		Truncated bool  `json:"truncated"`
	}
	_ = json.Unmarshal(obs, &o)
	return (o.OK != nil && !*o.OK) || o.IsError || o.Truncated
}

func replaceSeed(v any, seed string) any {
	switch x := v.(type) {
	case string:
		return strings.ReplaceAll(x, "{seed}", seed)
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = replaceSeed(e, seed)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = replaceSeed(e, seed)
		}
		return out
	}
	return v
}

var _ env.Follower = (*oracle)(nil)
