package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/env/world"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/catalogue"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/fromlog"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/inject"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
	"github.com/gauntlet-rl/gauntlet/pkg/rng"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
	"github.com/gauntlet-rl/gauntlet/services/faults"
)

const faultsUsage = `Usage:
  gauntlet faults ls                              every fault kind with its parameters
  gauntlet faults plan --env E --seed S --profile P [--index N] [--drift D] [--calls N]
                                                  the plan an episode meets (P: a built-in
                                                  profile, or a YAML profile file; without
                                                  --env a file's faults meet generic calls)
  gauntlet faults validate [--env E] FILE...      check YAML fault profiles (with --env: that
                                                  the env can run them, as a run checks)
  gauntlet faults from-log [-o FILE] [--name N] FILE...
                                                  derive a profile from error logs
  gauntlet faults drift show|history|set [D]      the global drift in NATS KV (set '' clears)
`

// cmdFaults is `gauntlet faults`.
func cmdFaults(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, faultsUsage)
		return errUsage
	}
	switch args[0] {
	case "ls":
		return faultsLs(stdout)
	case "plan":
		return faultsPlan(args[1:], stdout, stderr)
	case "validate":
		return faultsValidate(args[1:], stdout, stderr)
	case "from-log":
		return faultsFromLog(args[1:], stdout, stderr)
	case "drift":
		return faultsDrift(ctx, args[1:], stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, faultsUsage)
		return nil
	}
	fmt.Fprintf(stderr, "gauntlet faults: unknown subcommand %q\n\n%s", args[0], faultsUsage)
	return errUsage
}

func faultsLs(stdout io.Writer) error {
	tw := tabwriter.NewWriter(stdout, 2, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "KIND\tLAYER\tPASS\tPARAMETERS\tWHAT IT DOES")
	for _, k := range catalogue.Kinds() {
		var ps []string
		for _, p := range k.Params {
			ps = append(ps, describeParam(p))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", k.Name, k.Layer, k.Pass, strings.Join(ps, " "), k.Doc)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "\nBuilt-in profiles: %s (default mix baseline=60,stress=25,edge=15).\n", strings.Join(plans.Profiles(), ", "))
	fmt.Fprintln(stdout, "\nDrift selectors: <service|*>.<fault>.<param>, e.g. *.latency.mean_ms (docs/faults.md). The faults of")
	fmt.Fprintln(stdout, "the built-in plans, by the names selectors use; a user-defined profile's faults go by their ids:")
	tw = tabwriter.NewWriter(stdout, 2, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "FAULT\tKIND\tPARAMETERS")
	for _, f := range plans.DriftFaults() {
		names := make([]string, len(f.Params))
		for i, p := range f.Params {
			names[i] = p.Name
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", f.Name, f.Kind, strings.Join(names, " "))
	}
	return tw.Flush()
}

func describeParam(p catalogue.Param) string {
	switch {
	case len(p.Choices) > 0:
		return p.Name + "=" + strings.Join(p.Choices, "|")
	case p.Text:
		return p.Name + "=<" + p.Unit + ">"
	case p.MaxOpen:
		return fmt.Sprintf("%s=[%g,%g)%s", p.Name, p.Min, p.Max, unitSuffix(p))
	}
	return fmt.Sprintf("%s=[%g,%g]%s", p.Name, p.Min, p.Max, unitSuffix(p))
}

func unitSuffix(p catalogue.Param) string {
	if p.Unit == "probability" || p.Unit == "fraction" || p.Unit == "status" {
		return ""
	}
	return p.Unit
}

func faultsPlan(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("faults plan", stderr)
	envName := fs.String("env", "shop", "env whose services the plan targets")
	seed := fs.Uint64("seed", 1, "episode seed")
	profile := fs.String("profile", "", "built-in profile (baseline, stress, edge) or a YAML profile file; empty: drawn from the default mix like the faults service")
	index := fs.Uint64("index", 0, "episode index within its run, for drift")
	driftText := fs.String("drift", "", "drift schedules, as for `gauntlet run --drift`")
	calls := fs.Int("calls", 0, "also simulate this many calls round-robin over the services and list the faults that fire")
	var worlds world.Config
	worlds.RegisterFlags(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := worlds.Register(); err != nil {
		return fmt.Errorf("--%w", err)
	}
	envSet := false
	fs.Visit(func(f *flag.Flag) { envSet = envSet || f.Name == "env" })
	e, err := env.Lookup(*envName)
	if err != nil {
		return fmt.Errorf("--env: %w", err)
	}
	services := e.Spec().Services
	yamlProfile := strings.HasSuffix(*profile, ".yaml") || strings.HasSuffix(*profile, ".yml")
	if yamlProfile && !envSet {
		if *driftText != "" {
			return errors.New("--drift: give --env: drift applies to the plan an env derives from the profile")
		}
		return planSpec(*profile, *seed, services, *calls, stdout)
	}
	var plan *gauntletv1.FaultPlan
	var custom plans.CustomProfiles
	if yamlProfile {
		// The plan the env's run would play: the run's own check first, every problem at once.
		var name string
		if name, custom, err = checkProfileFile(*profile, services); err != nil {
			return err
		}
		if plan, err = custom.Plan(rng.Derive(*seed, "faults"), name, services); err != nil {
			return fmt.Errorf("--profile: %w", err)
		}
	} else {
		name := *profile
		if name == "" {
			if name, err = plans.ChooseProfile(rng.Derive(*seed, "profile"), nil); err != nil {
				return err
			}
		}
		if plan, err = plans.Derive(rng.Derive(*seed, "faults"), name, services); err != nil {
			return fmt.Errorf("--profile: %w", err)
		}
	}
	drift, err := plans.ParseDriftFor(*driftText, time.Now(), custom)
	if err != nil {
		return fmt.Errorf("--drift: %w", err)
	}
	if err := plans.ApplyDrift(plan, plans.DriftValues(drift, plans.DriftPosition{Index: *index, At: time.Now()}, plans.DriftSourceRun)); err != nil {
		return fmt.Errorf("--drift: %w", err)
	}
	fmt.Fprintf(stdout, "env %s, episode seed %d, profile %s, plan seed %d, catalogue %s\n", *envName, *seed, plan.Profile, plan.Seed, plan.CatalogueVersion)
	if err := printPlan(stdout, plan); err != nil {
		return err
	}
	if *calls > 0 {
		in, err := inject.NewInjector(plan)
		if err != nil {
			return err
		}
		for i := range *calls {
			svc := services[i%len(services)]
			for _, f := range in.Call(svc, svc+".call", 0).Fired {
				fmt.Fprintf(stdout, "call %d %s: %s %s\n", i, svc, f.FaultId, f.Detail)
			}
		}
	}
	return nil
}

// printPlan prints a plan's rules as a table, then its drift values and boundary spec.
func printPlan(stdout io.Writer, plan *gauntletv1.FaultPlan) error {
	tw := tabwriter.NewWriter(stdout, 2, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "RULE\tTARGET\tPROBABILITY\tEFFECT")
	for _, r := range plan.Rules {
		fmt.Fprintf(tw, "%s\t%s\t%g\t%s\n", r.Id, r.Target, r.Probability, effect(r))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, v := range plan.DriftValues {
		fmt.Fprintf(stdout, "drift %s = %g (%s)\n", v.Selector, v.Value, v.Source)
	}
	if plan.BoundarySpec != "" {
		fmt.Fprintf(stdout, "sandbox boundary faults:\n%s", plan.BoundarySpec)
	}
	return nil
}

func effect(r *gauntletv1.FaultRule) string {
	switch s := r.Spec.(type) {
	case *gauntletv1.FaultRule_HttpError:
		return fmt.Sprintf("http_error status=%d retry_after_ms=%d", s.HttpError.Status, s.HttpError.RetryAfterMs)
	case *gauntletv1.FaultRule_Latency:
		return fmt.Sprintf("latency mean_ms=%g jitter_ms=%g", s.Latency.MeanMs, s.Latency.JitterMs)
	case *gauntletv1.FaultRule_Truncate:
		return fmt.Sprintf("truncate keep_fraction=%g", s.Truncate.KeepFraction)
	}
	return "?"
}

func planSpec(path string, seed uint64, services []string, calls int, stdout io.Writer) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("--profile: %w", err)
	}
	spec, rules, err := plans.ParseSpec(data)
	if err != nil {
		return fmt.Errorf("%s:\n  %s", path, strings.ReplaceAll(err.Error(), "\n", "\n  "))
	}
	fmt.Fprintf(stdout, "profile %s (%s), episode seed %d\n", spec.Name, path, seed)
	tw := tabwriter.NewWriter(stdout, 2, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "RULE\tKIND\tPASS\tPROBABILITY\tPARAMETERS")
	for _, r := range rules {
		var ps []string
		for _, p := range r.Kind.Params[1:] {
			if p.Text {
				ps = append(ps, p.Name+"="+r.Text(p.Name))
			} else {
				ps = append(ps, p.Name+"="+strconv.FormatFloat(r.Num(p.Name), 'g', -1, 64))
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%g\t%s\n", r.ID, r.Kind.Name, r.Kind.Pass, r.Probability, strings.Join(ps, " "))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if calls > 0 {
		d := inject.NewDecider(rng.Derive(seed, "faults"), rules)
		for i := range calls {
			svc := services[i%len(services)]
			dec := d.Decide(svc, catalogue.Event{Layer: catalogue.LayerService, Op: catalogue.OpRequest, Service: svc, Host: svc, Path: "/", Method: "GET"})
			for _, f := range dec.Fired {
				fmt.Fprintf(stdout, "call %d %s: %s %s %s\n", i, svc, f.RuleID, f.Kind, f.Detail)
			}
		}
	}
	return nil
}

// checkProfileFile reads a YAML profile and makes the check a run makes of it for an env
// with services (plans.CheckCustomProfiles): the profile's name and the compiled profile.
func checkProfileFile(path string, services []string) (string, plans.CustomProfiles, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", nil, fmt.Errorf("--profile: %w", err)
	}
	spec, _, err := plans.ParseSpec(data)
	if err != nil {
		return "", nil, fmt.Errorf("%s:\n  %s", path, strings.ReplaceAll(err.Error(), "\n", "\n  "))
	}
	custom, err := plans.CheckCustomProfiles([]*gauntletv1.CustomProfile{{Name: spec.Name, SpecYaml: string(data)}}, services)
	if err != nil {
		return "", nil, fmt.Errorf("%s:\n  %s", path, strings.ReplaceAll(err.Error(), "\n", "\n  "))
	}
	return spec.Name, custom, nil
}

func faultsValidate(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("faults validate", stderr)
	envName := fs.String("env", "", "also check that this env can run the profiles, as a run on it does")
	var worlds world.Config
	worlds.RegisterFlags(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := worlds.Register(); err != nil {
		return fmt.Errorf("--%w", err)
	}
	if fs.NArg() == 0 {
		fmt.Fprint(stderr, "gauntlet faults validate: give one or more YAML profile files\n")
		return errUsage
	}
	var services []string
	if *envName != "" {
		e, err := env.Lookup(*envName)
		if err != nil {
			return fmt.Errorf("--env: %w", err)
		}
		services = e.Spec().Services
	}
	bad := 0
	for _, path := range fs.Args() {
		data, err := os.ReadFile(path)
		if err == nil {
			var spec *plans.Spec
			var rules []catalogue.Rule
			if spec, rules, err = plans.ParseSpec(data); err == nil && services != nil {
				_, err = plans.CheckCustomProfiles([]*gauntletv1.CustomProfile{{Name: spec.Name, SpecYaml: string(data)}}, services)
			}
			if err == nil {
				fmt.Fprintf(stdout, "ok  %s: profile %s, %d faults\n", path, spec.Name, len(rules))
				continue
			}
		}
		bad++
		fmt.Fprintf(stdout, "BAD %s:\n  %s\n", path, strings.ReplaceAll(err.Error(), "\n", "\n  "))
	}
	if bad > 0 {
		return fmt.Errorf("%d of %d profiles invalid", bad, fs.NArg())
	}
	return nil
}

func faultsFromLog(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("faults from-log", stderr)
	out := fs.String("o", "", "write the profile here (default: stdout)")
	name := fs.String("name", "from-log", "name of the profile")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		fmt.Fprint(stderr, "gauntlet faults from-log: give one or more log files\n")
		return errUsage
	}
	var inputs []fromlog.Input
	for _, path := range fs.Args() {
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		inputs = append(inputs, fromlog.Input{Name: filepath.Base(path), Data: data})
	}
	res, err := fromlog.Analyze(inputs)
	if err != nil {
		return err
	}
	w := stdout
	if *out != "" {
		f, err := os.Create(*out)
		if err != nil {
			return err
		}
		defer f.Close()
		w = f
	}
	if err := res.WriteProfile(w, *name); err != nil {
		return err
	}
	if *out != "" {
		fmt.Fprintf(stdout, "%s: %d fault kinds from %d requests, %d entries unmapped\n", *out, len(res.Findings), res.Requests, len(res.Unmapped))
	}
	return nil
}

func faultsDrift(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("faults drift", stderr)
	var sf stackFlags
	sf.register(fs, partNATS)
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() == 0 || (fs.Arg(0) == "set" && fs.NArg() != 2) || (fs.Arg(0) != "set" && fs.NArg() != 1) {
		fmt.Fprint(stderr, "gauntlet faults drift: show | history | set 'SELECTOR=SHAPE(AT:VALUE,...);...'\n")
		return errUsage
	}
	var set *gauntletv1.DriftSet
	switch fs.Arg(0) {
	case "show", "history":
	case "set":
		drift, err := plans.ParseDrift(fs.Arg(1), time.Now())
		if err != nil {
			return fmt.Errorf("drift: %w", err)
		}
		user := os.Getenv("USER")
		set = &gauntletv1.DriftSet{Drift: drift, SetBy: "gauntlet faults drift set (" + user + ")"}
	default:
		return fmt.Errorf("faults drift: unknown action %q (show, history, set)", fs.Arg(0))
	}
	b, err := sf.connectBus("gauntlet-faults", stderr)
	if err != nil {
		return err
	}
	defer b.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	switch fs.Arg(0) {
	case "set":
		rev, err := faults.SetGlobalDrift(ctx, b.JS, set)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "global drift revision %d: %s\n", rev, plans.FormatDrift(set.Drift))
	case "show":
		cur, rev, err := faults.GlobalDrift(ctx, b.JS)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "revision %d: %s\n", rev, plans.FormatDrift(cur.Drift))
	case "history":
		hist, err := faults.DriftHistory(ctx, b.JS)
		if err != nil {
			return err
		}
		for _, h := range hist {
			fmt.Fprintf(stdout, "revision %d at %s by %s: %s\n", h.Revision, time.Unix(0, h.Set.SetAtUnixNano).UTC().Format(time.RFC3339), h.Set.SetBy, plans.FormatDrift(h.Set.Drift))
		}
	}
	return nil
}
