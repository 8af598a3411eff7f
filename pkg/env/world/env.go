package world

import (
	"bytes"
	"encoding/json"
	"errors"
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
	desc := w.desc
	if desc == "" {
		desc = "World " + w.name + " (a world file)."
	}
	return env.Spec{
		Name:        w.name,
		Description: desc,
		Tools:       tools,
		Params: []env.Param{
			{Name: "deadline_ms", Type: "int", Default: strconv.FormatInt(w.deadlineMs, 10), Description: "virtual milliseconds the episode may take (100..86400000)"},
			{Name: "max_invalid", Type: "int", Default: strconv.FormatInt(w.maxInvalid, 10), Description: "invalid actions that terminate the episode (1..1000)"},
		},
		Services:        slices.Clone(w.services),
		DefaultMaxSteps: w.maxSteps,
	}
}

// NewEpisode validates cfg.Params and returns an episode ready for Reset.
func (x worldEnv) NewEpisode(cfg env.Config) (env.Episode, error) {
	w := x.w
	deadline, maxInvalid, err := parseParams(cfg.Params, w.deadlineMs, w.maxInvalid)
	if err != nil {
		return nil, fmt.Errorf("world %s: %w", w.name, err)
	}
	maxSteps := cfg.MaxSteps
	if maxSteps == 0 {
		maxSteps = w.maxSteps
	}
	return &episode{w: w, cfg: cfg, maxSteps: maxSteps, deadlineMs: deadline, maxInvalid: maxInvalid, fast: maxSteps <= w.maxSteps}, nil
}

// Oracle returns the world's plan-following agent for one episode. The plan draws no
// random numbers, so the seed is unused.
func (x oracleEnv) Oracle(uint64) env.Agent {
	if len(x.w.roles) > 0 {
		return &roleOracle{w: x.w}
	}
	return &oracle{w: x.w, p: x.w.oracle}
}

// parseParams decodes the params object strictly and reports every problem at once, each
// naming its field.
func parseParams(raw json.RawMessage, deadline, maxInvalid int64) (int64, int64, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return deadline, maxInvalid, nil
	}
	if raw[0] != '{' {
		return 0, 0, fmt.Errorf("params: want object, got %s", jsonKind(raw))
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return 0, 0, fmt.Errorf("params: malformed JSON: %w", err)
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var errs []error
	for _, k := range keys {
		var lo, hi int64
		var dst *int64
		switch k {
		case "deadline_ms":
			lo, hi, dst = 100, 86_400_000, &deadline
		case "max_invalid":
			lo, hi, dst = 1, 1000, &maxInvalid
		default:
			errs = append(errs, fmt.Errorf("params.%s: unknown parameter (known: deadline_ms, max_invalid)", clip(k)))
			continue
		}
		p := argProp{kind: kInt, min: lo, max: hi}
		v, err := p.decode(m[k])
		if err != nil {
			errs = append(errs, fmt.Errorf("params.%s: %w", k, err))
			continue
		}
		*dst = v.(int64)
	}
	return deadline, maxInvalid, errors.Join(errs...)
}
