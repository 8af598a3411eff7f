package world

import (
	"fmt"
	"slices"
	"strconv"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
)

// worldEnv is a World as an env.Env.
type worldEnv struct{ w *World }

// oracleEnv is a World with an oracle plan: an env.Oracle too.
type oracleEnv struct{ worldEnv }

// Env returns the world as an env: an env.Oracle too when the file declares a plan.
func (w *World) Env() env.Env {
	if w.HasOracle() {
		return oracleEnv{worldEnv{w}}
	}
	return worldEnv{w}
}

// Of returns the world behind an env made by Env, and whether e is one.
func Of(e env.Env) (*World, bool) {
	switch x := e.(type) {
	case worldEnv:
		return x.w, true
	case oracleEnv:
		return x.w, true
	}
	return nil, false
}

// Spec describes the world's tools, params and services. Each call returns a fresh copy.
func (x worldEnv) Spec() env.Spec {
	w := x.w
	tools := make([]env.Tool, len(w.tools))
	for i, t := range w.tools {
		tools[i] = env.Tool{Name: t.name, Service: t.service, Description: t.desc, Schema: slices.Clone(t.args.schema)}
	}
	if len(w.roles) > 0 {
		// Each role's tools, named "role:tool": what the role's agent may call.
		tools = tools[:0]
		for _, r := range w.roles {
			for _, t := range r.tools {
				tools = append(tools, env.Tool{Name: r.name + ":" + t.name, Service: t.service,
					Description: "(" + r.name + ") " + t.desc, Schema: slices.Clone(t.args.schema)})
			}
		}
	}
	params := make([]env.Param, 0, len(w.params)+2)
	for i := range w.params {
		name, typ, def, pdesc := w.params[i].specParam()
		params = append(params, env.Param{Name: name, Type: typ, Default: def, Description: pdesc})
	}
	params = append(params,
		env.Param{Name: "deadline_ms", Type: "int", Default: strconv.FormatInt(w.deadlineMs, 10), Description: "virtual milliseconds the episode may take (100..86400000)"},
		env.Param{Name: "max_invalid", Type: "int", Default: strconv.FormatInt(w.maxInvalid, 10), Description: "invalid actions that terminate the episode (1..1000)"})
	desc := w.desc
	if desc == "" {
		desc = "World " + w.name + " (a world file)."
	}
	return env.Spec{
		Name:            w.name,
		Description:     desc,
		Tools:           tools,
		Params:          params,
		Services:        slices.Clone(w.services),
		DefaultMaxSteps: w.maxSteps,
	}
}

// NewEpisode validates cfg.Params and returns an episode ready for Reset.
func (x worldEnv) NewEpisode(cfg env.Config) (env.Episode, error) {
	w := x.w
	p, err := w.parseParams(cfg.Params)
	if err != nil {
		return nil, fmt.Errorf("world %s: %w", w.name, err)
	}
	maxSteps := cfg.MaxSteps
	if maxSteps == 0 {
		maxSteps = w.maxSteps
	}
	return &episode{w: w, cfg: cfg, maxSteps: maxSteps, deadlineMs: p.deadline, maxInvalid: p.maxInvalid, params: p.vals, fast: maxSteps <= w.maxSteps}, nil
}

// Oracle returns the world's plan-following agent for one episode. The plan draws no
// random numbers, so the seed is unused.
func (x oracleEnv) Oracle(uint64) env.Agent {
	if len(x.w.roles) > 0 {
		return &roleOracle{w: x.w}
	}
	return &oracle{w: x.w, p: x.w.oracle}
}
