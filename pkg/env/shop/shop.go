package shop

import (
	"encoding/json"
	"fmt"
	"slices"
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
	return env.Spec{
		Name: Name,
		Description: "Simulated e-commerce world on a virtual clock: buy QTY units of a product " +
			"matching a description, have them shipped, and spend at most the budget. Stock, " +
			"balance, and payment before shipping are enforced as causal rules.",
		Tools:           tools,
		Params:          paramDefs.Spec(),
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

// paramDefs are the params a request may set.
var paramDefs = env.IntParams[params]{
	{Name: "products", Default: 12, Min: 2, Max: 200, Description: "number of products in the catalog",
		Set: func(p *params, v int64) { p.products = int(v) }},
	{Name: "qty_max", Default: 3, Min: 1, Max: 100, Description: "largest quantity a task asks for",
		Set: func(p *params, v int64) { p.qtyMax = int(v) }},
	{Name: "deadline_ms", Default: 30000, Min: 100, Max: 86_400_000, Description: "virtual milliseconds the episode may take",
		Set: func(p *params, v int64) { p.deadline = time.Duration(v) * time.Millisecond }},
	{Name: "max_invalid", Default: 5, Min: 1, Max: 1000, Description: "invalid actions that terminate the episode",
		Set: func(p *params, v int64) { p.maxInvalid = int(v) }},
}

// parseParams decodes the params object strictly (env.IntParams.Decode) and reports every
// problem at once, each naming its field.
func parseParams(raw json.RawMessage) (params, error) {
	return paramDefs.Decode(raw, parseInt)
}
