package shop

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
)

// Name is the name the shop env registers under.
const Name = "shop"

// DefaultMaxSteps truncates a shop episode when its Config does not set MaxSteps.
const DefaultMaxSteps = 30

// MaxWaitMs bounds one wait action, in virtual milliseconds.
const MaxWaitMs = 10000

func init() { env.Register(New()) }

// New returns the shop env. The value is stateless; it is the same env the package
// registers under Name.
func New() env.Env { return shopEnv{} }

type shopEnv struct{}

// Spec describes the shop's tools, params and services. Each call returns a fresh copy the
// caller may modify.
func (shopEnv) Spec() env.Spec {
	tools := make([]env.Tool, len(toolDefs))
	for i, t := range toolDefs {
		tools[i] = env.Tool{
			Name:        t.name,
			Service:     t.service,
			Description: t.desc,
			Schema:      slices.Clone(t.schema),
		}
	}
	ps := make([]env.Param, len(paramDefs))
	for i, p := range paramDefs {
		ps[i] = env.Param{
			Name:        p.name,
			Type:        "int",
			Default:     strconv.FormatInt(p.def, 10),
			Description: fmt.Sprintf("%s (%d..%d)", p.desc, p.min, p.max),
		}
	}
	return env.Spec{
		Name: Name,
		Description: "Simulated e-commerce world on a virtual clock: buy QTY units of a product " +
			"matching a description, have them shipped, and spend at most the budget. Stock, " +
			"balance, and payment before shipping are enforced as causal rules.",
		Tools:           tools,
		Params:          ps,
		Services:        slices.Clone(serviceNames[:]),
		DefaultMaxSteps: DefaultMaxSteps,
	}
}

// NewEpisode validates cfg.Params and returns an episode ready for Reset.
func (shopEnv) NewEpisode(cfg env.Config) (env.Episode, error) {
	p, err := parseParams(cfg.Params)
	if err != nil {
		return nil, fmt.Errorf("shop: %w", err)
	}
	maxSteps := cfg.MaxSteps
	if maxSteps == 0 {
		maxSteps = DefaultMaxSteps
	}
	return &episode{cfg: cfg, p: p, maxSteps: maxSteps}, nil
}

// Oracle returns the shop's scripted good agent for one episode. The script draws no
// random numbers, so the seed is unused.
func (shopEnv) Oracle(uint64) env.Agent { return &oracle{} }

// params are the shop's validated parameters.
type params struct {
	products   int
	qtyMax     int
	deadline   time.Duration
	maxInvalid int
}

type paramDef struct {
	name          string
	def, min, max int64
	desc          string
	set           func(p *params, v int64)
}

var paramDefs = []paramDef{
	{"products", 12, 2, 200, "number of products in the catalog",
		func(p *params, v int64) { p.products = int(v) }},
	{"qty_max", 3, 1, 100, "largest quantity a task asks for",
		func(p *params, v int64) { p.qtyMax = int(v) }},
	{"deadline_ms", 30000, 100, 86_400_000, "virtual milliseconds the episode may take",
		func(p *params, v int64) { p.deadline = time.Duration(v) * time.Millisecond }},
	{"max_invalid", 5, 1, 1000, "invalid actions that terminate the episode",
		func(p *params, v int64) { p.maxInvalid = int(v) }},
}

// parseParams decodes the params object strictly (env.DecodeParams) and reports every
// problem at once, each naming its field.
func parseParams(raw json.RawMessage) (params, error) {
	var p params
	for _, d := range paramDefs {
		d.set(&p, d.def)
	}
	err := env.DecodeParams(raw, func(k string, v json.RawMessage) error {
		i := slices.IndexFunc(paramDefs, func(d paramDef) bool { return d.name == k })
		if i < 0 {
			return env.ErrUnknownParam
		}
		d := paramDefs[i]
		n, err := parseInt(v, d.min, d.max)
		if err != nil {
			return err
		}
		d.set(&p, n)
		return nil
	}, paramNames)
	return p, err
}

// paramNames lists the params a request may set.
func paramNames() []string {
	names := make([]string, len(paramDefs))
	for i, d := range paramDefs {
		names[i] = d.name
	}
	return names
}
