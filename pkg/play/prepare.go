package play

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/inject"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
	"github.com/gauntlet-rl/gauntlet/pkg/policy"
	"github.com/gauntlet-rl/gauntlet/pkg/rng"
	"github.com/gauntlet-rl/gauntlet/pkg/threats"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// Deps is what building an episode needs from the process that plays it. Every runner (the
// worker, the env API, durable episodes, the CLI, the load-test harness) passes its own, so
// an env that needs a sandbox or a plan that names a template works wherever it is played.
// The zero value finds registered envs, expands built-in plans only and runs no sandbox.
type Deps struct {
	// Envs finds an env by name; nil is the registry (env.Lookup).
	Envs func(name string) (env.Env, error)
	// Sandboxes lends real sandboxes to envs that need them (codefix); nil when the
	// process runs no sandbox runtime, where such envs' episodes fail with
	// env.ErrNoSandbox at Reset.
	Sandboxes env.Sandboxes
	// Templates expands compact plans, finding the templates that plans of user-defined
	// profiles name (a *templates.Client over the KV bucket); nil expands built-in and
	// whole plans only.
	Templates PlanExpander
	// Policies are the policies agents come from, with the process's configuration (the
	// "http" policy's endpoint); nil is the registered policies alone.
	Policies *policy.Set
	// Datasets are the task datasets the process may play, by name (env.Config.Datasets);
	// nil when it was started without any.
	Datasets map[string]string
	// Threats are the threat fingerprints every process playing episodes shares (a
	// started *threats.Watcher): a step whose action matches one is flagged with a
	// safety event, and a step whose sandbox recorded an attack is fingerprinted for the
	// others. nil plays without them (the CLI's replays, whose steps must be what was
	// recorded).
	Threats *threats.Watcher
}

// PlanExpander is plans.Expand with the template a compact plan names found somewhere
// (templates.Client.Expand).
type PlanExpander interface {
	Expand(ctx context.Context, p *gauntletv1.FaultPlan, services []string) (*gauntletv1.FaultPlan, error)
}

// Prepare builds the episode req asks for under plan, expanding a compact plan first and
// sealing it (plans.Seal: plan, kept compact for the record, gets the digest of the plan
// played). Its errors are the request's fault: an unknown env, bad params, a bad plan, a
// template not found.
func (d Deps) Prepare(ctx context.Context, req *gauntletv1.EpisodeRequested, plan *gauntletv1.FaultPlan) (env.Env, env.Episode, error) {
	e, err := d.lookup(req.Env)
	if err != nil {
		return nil, nil, err
	}
	var full *gauntletv1.FaultPlan
	if d.Templates != nil {
		full, err = d.Templates.Expand(ctx, plan, servicesOf(req.Env, e))
	} else {
		full, err = plans.Expand(plan, servicesOf(req.Env, e), nil)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("fault plan: %w", err)
	}
	plans.Seal(plan, full) // the end records the digest of the plan played
	inj, err := inject.NewInjector(full)
	if err != nil {
		return nil, nil, fmt.Errorf("fault plan: %w", err)
	}
	ep, err := e.NewEpisode(env.Config{Seed: req.Seed, Params: json.RawMessage(req.ParamsJson), MaxSteps: req.MaxSteps, Faults: inj, Sandboxes: d.Sandboxes, Datasets: d.Datasets})
	if err != nil {
		return nil, nil, err
	}
	return e, ep, nil
}

// Check validates what req asks for (its env and its params) without planning faults or
// taking a sandbox: the env builds an episode, which is closed at once. Callers that must
// refuse a bad request before reserving anything for it (the env API's Reset) use it.
func (d Deps) Check(req *gauntletv1.EpisodeRequested) (env.Env, error) {
	e, err := d.lookup(req.Env)
	if err != nil {
		return nil, err
	}
	ep, err := e.NewEpisode(env.Config{Seed: req.Seed, Params: json.RawMessage(req.ParamsJson), MaxSteps: req.MaxSteps, Datasets: d.Datasets})
	if err != nil {
		return e, fmt.Errorf("params_json: %w", err)
	}
	return e, env.Close(ep)
}

func (d Deps) lookup(name string) (env.Env, error) {
	lookup := d.Envs
	if lookup == nil {
		lookup = env.Lookup
	}
	e, err := lookup(name)
	if err != nil {
		return nil, fmt.Errorf("env: %w", err)
	}
	return e, nil
}

// envServices holds each registered env's services (env name → []string), read from its
// Spec once: a Spec builds every tool's schema and description, and building one per
// episode showed in a worker's allocations (docs/benchmarks.md, Costs the code cites,
// Episode runner). A registered env's spec does not change.
var envServices sync.Map

// servicesOf returns the services of e, registered as name.
func servicesOf(name string, e env.Env) []string {
	if v, ok := envServices.Load(name); ok {
		return v.([]string)
	}
	svcs := e.Spec().Services
	envServices.Store(name, svcs)
	return svcs
}

// NewAgent returns the agent of the policy req names (from d.Policies) for an episode of
// e, seeded from the episode's seed as every runner seeds it, so a policy plays the same
// episode the same way wherever it runs; a policy that asks a model endpoint asks the
// run's (EpisodeRequested.policy_endpoint). Its errors are the request's fault.
func (d Deps) NewAgent(e env.Env, req *gauntletv1.EpisodeRequested) (env.Agent, error) {
	p, err := d.Policies.Lookup(req.Policy)
	if err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	if ep := req.GetPolicyEndpoint(); ep.GetUrl() != "" {
		if e, ok := p.(policy.Endpointed); ok {
			if p, err = e.WithEndpoint(policy.Endpoint{URL: ep.GetUrl(), Model: ep.GetModel(), Credential: ep.GetCredential(), Logprobs: policy.LogprobsOf(ep.GetLogprobs())}); err != nil {
				return nil, fmt.Errorf("policy %s: %w", req.Policy, err)
			}
		}
	}
	agent, err := p.NewAgent(e, rng.Derive(req.Seed, "policy"))
	if err != nil {
		return nil, fmt.Errorf("policy %s: %w", req.Policy, err)
	}
	return agent, nil
}
