package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/env/mcpenv"
	"github.com/gauntlet-rl/gauntlet/pkg/env/taskenv"
	"github.com/gauntlet-rl/gauntlet/pkg/env/world"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
	"github.com/gauntlet-rl/gauntlet/pkg/policy"
	"github.com/gauntlet-rl/gauntlet/pkg/rewardspecs"
	"github.com/gauntlet-rl/gauntlet/pkg/runs"
	"github.com/gauntlet-rl/gauntlet/pkg/scoring"
	"github.com/gauntlet-rl/gauntlet/pkg/trajectory"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// runOpts are the flags that describe a run.
type runOpts struct {
	env, params, policies, profiles, label string
	drift, profileFiles, rewardSpec        string
	// endpoint and model are the run's model endpoint, for a policy that asks one (the
	// http policy): run declares them (registerEndpoint), demo takes its serving config's.
	endpoint, model, credential string
	// logprobs is --policy.http.logprobs: nil when not given (the workers' own applies).
	logprobs              optBool
	episodes, seed        uint64
	maxInFlight, maxSteps uint
	// worlds are user worlds the run's env may be one of: the run is checked here, so
	// this process must know them as the serving ones do. run declares its flag; demo
	// shares its serving config's.
	worlds world.Config
	// mcp are user MCP envs (--env.mcp), known here for the same reason.
	mcp mcpenv.Config
	// tasks are --tasks and its filters: a run of the tasks env over a selection.
	tasks taskOpts

	// spec is --reward-spec parsed by request; it must be in the stack's bucket before
	// the run is submitted (putRewardSpec).
	spec *scoring.Spec
}

func (o *runOpts) register(fs *flag.FlagSet, episodes uint64) {
	fs.StringVar(&o.env, "env", "", "env to run (default shop, or tasks with --tasks)")
	fs.StringVar(&o.params, "params", "{}", "env parameters as a JSON object")
	fs.StringVar(&o.policies, "policies", "random=1,oracle=1", "policies and weights")
	fs.StringVar(&o.profiles, "profiles", "baseline=60,stress=25,edge=15", "fault profiles and weights")
	fs.Uint64Var(&o.episodes, "episodes", episodes, "episodes to run")
	fs.Uint64Var(&o.seed, "seed", 1, "run seed: the same seed gives the same episodes")
	fs.UintVar(&o.maxInFlight, "max-in-flight", runs.DefaultMaxInFlight, "episodes of this run in flight at once")
	fs.UintVar(&o.maxSteps, "max-steps", 0, "step limit per episode (0: the env's default)")
	fs.StringVar(&o.label, "label", "", "free-form label kept with the run")
	fs.StringVar(&o.profileFiles, "profile-files", "", "comma-separated YAML fault profiles that --profiles may name by their names (docs/faults.md)")
	fs.StringVar(&o.rewardSpec, "reward-spec", "", "YAML reward spec file the run's steps are scored under (docs/rewards.md; default: the built-in default/1)")
	fs.StringVar(&o.drift, "drift", "", "fault parameters on a schedule, e.g. '*.latency.mean_ms=linear(0:20,999:500)' (docs/faults.md)")
	o.tasks.register(fs)
}

// registerEndpoint declares the flags of the run's model endpoint.
func (o *runOpts) registerEndpoint(fs *flag.FlagSet) {
	fs.StringVar(&o.endpoint, "policy.http.url", "", "the run's model endpoint, for the http policy: an OpenAI-compatible API base, e.g. http://127.0.0.1:8000/v1 (required with --policies http=N)")
	fs.StringVar(&o.model, "policy.http.model", "", "model name the http policy sends to the run's endpoint (default: the workers' --policy.http.model)")
	fs.Var(&o.logprobs, "policy.http.logprobs", "whether the http policy asks the run's endpoint for token ids and logprobs and records them with each step (trainer_steps); true or false (default: the workers' --policy.http.logprobs)")
	fs.StringVar(&o.credential, "policy.http.credential", "", "name of the credential whose key the workers send to the run's endpoint: a file of their --policy.http.credentials-dir (default: their --policy.http.api-key); the name, never the key, is recorded with the run")
}

// request builds and validates the run request, naming the bad flag; it keeps the parsed
// --reward-spec in o.spec.
func (o *runOpts) request() (*gauntletv1.RunRequested, error) {
	var errs []error
	if err := o.worlds.Register(); err != nil {
		errs = append(errs, fmt.Errorf("--%w", err))
	}
	if err := o.mcp.Register(); err != nil {
		errs = append(errs, fmt.Errorf("--%w", err))
	}
	o.spec = nil
	if o.rewardSpec != "" {
		sp, err := scoring.LoadFile(o.rewardSpec)
		if err != nil {
			errs = append(errs, fmt.Errorf("--reward-spec: %w", err))
		} else {
			o.spec = &sp
		}
	}
	pol, err := runs.ParseShares("--policies", o.policies)
	if err != nil {
		errs = append(errs, err)
	}
	prof, err := runs.ParseShares("--profiles", o.profiles)
	if err != nil {
		errs = append(errs, err)
	}
	var custom []*gauntletv1.CustomProfile
	for _, path := range strings.Split(o.profileFiles, ",") {
		if path = strings.TrimSpace(path); path == "" {
			continue
		}
		data, err := os.ReadFile(path)
		if err != nil {
			errs = append(errs, fmt.Errorf("--profile-files: %w", err))
			continue
		}
		spec, _, err := plans.ParseSpec(data)
		if err != nil {
			errs = append(errs, fmt.Errorf("--profile-files: %s: %w", path, err))
			continue
		}
		custom = append(custom, &gauntletv1.CustomProfile{Name: spec.Name, SpecYaml: string(data)})
	}
	// The run's drift may name its profiles' faults; a profile that does not compile is
	// refused above, and its faults are then unknown here too.
	compiled, _ := plans.CompileCustomProfiles(custom)
	drift, err := plans.ParseDriftFor(o.drift, time.Now(), compiled)
	if err != nil {
		errs = append(errs, fmt.Errorf("--drift: %w", err))
	}
	params := o.params
	if !json.Valid([]byte(o.params)) {
		errs = append(errs, fmt.Errorf("--params: not valid JSON: %q", o.params))
	} else if params, err = o.tasks.params(o.params); err != nil {
		errs = append(errs, err)
	}
	if o.tasks.dataset != "" {
		switch o.env {
		case "":
			o.env = taskenv.Name
		case taskenv.Name:
		default:
			errs = append(errs, fmt.Errorf("--env %s: --tasks runs the %s env", o.env, taskenv.Name))
		}
	}
	if o.env == "" {
		o.env = "shop"
	}
	if o.maxInFlight > 1<<31 || o.maxSteps > 1<<31 {
		errs = append(errs, errors.New("--max-in-flight and --max-steps must fit in 32 bits"))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	req := &gauntletv1.RunRequested{
		RunId: runs.NewID(), Env: o.env, ParamsJson: params, Policies: pol, Profiles: prof,
		Episodes: o.episodes, Seed: o.seed, MaxInFlight: uint32(o.maxInFlight), MaxSteps: uint32(o.maxSteps),
		RequestedAtUnixNano: time.Now().UnixNano(), Label: o.label, Drift: drift,
		CustomProfiles: custom,
		Origin: &gauntletv1.RunOrigin{
			SubmittedBy: runs.Submitter(), GauntletVersion: version, ProfileFiles: profileFileList(o.profileFiles),
			DriftText: o.drift, RewardSpec: scoring.SpecFor(o.env).Version,
		},
	}
	if o.spec != nil {
		req.RewardSpec, req.Origin.RewardSpec = o.spec.Digest, o.spec.Version
	}
	if o.endpoint != "" || o.model != "" || o.credential != "" || o.logprobs.v != nil {
		req.PolicyEndpoint = &gauntletv1.PolicyEndpoint{Url: o.endpoint, Model: o.model, Credential: o.credential,
			Logprobs: policy.LogprobsProto(o.logprobs.v)}
	}
	if err := runs.Validate(req); err != nil {
		return nil, fmt.Errorf("invalid run:\n  %s", strings.ReplaceAll(err.Error(), "\n", "\n  "))
	}
	return req, nil
}

// putRewardSpec puts the run's reward spec, if any, in the stack's bucket, where the
// reward service and the store read it by the digest the run names.
func putRewardSpec(ctx context.Context, b *bus.Bus, spec *scoring.Spec) error {
	if spec == nil {
		return nil
	}
	if err := rewardspecs.NewClient(b.JS).Put(ctx, *spec); err != nil {
		return fmt.Errorf("--reward-spec: %w", err)
	}
	return nil
}

// profileFileList is --profile-files as a list, as given.
func profileFileList(s string) []string {
	var out []string
	for _, path := range strings.Split(s, ",") {
		if path = strings.TrimSpace(path); path != "" {
			out = append(out, path)
		}
	}
	return out
}

// cmdRun submits a run to a running stack and follows it to the end.
func cmdRun(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("run", stderr)
	var o runOpts
	o.register(fs, 1000)
	o.registerEndpoint(fs)
	o.worlds.RegisterFlags(fs)
	o.mcp.RegisterFlags(fs)
	var sf stackFlags
	sf.register(fs, partNATS|partClickHouse)
	wait := fs.Bool("wait", true, "follow the run to the end and print a summary")
	if err := parse(fs, args); err != nil {
		return err
	}
	o.tasks.datasets = sf.datasets
	req, err := o.request()
	if err != nil {
		return err
	}
	if sel := o.tasks.selection; sel != nil {
		if *wait {
			fmt.Fprintln(stdout, sel)
		} else {
			fmt.Fprintln(stderr, sel)
		}
	}
	b, err := sf.connectBus("gauntlet-run", stderr)
	if err != nil {
		return err
	}
	defer b.Close()
	if err := putRewardSpec(ctx, b, o.spec); err != nil {
		return err
	}
	if !*wait {
		if err := b.PublishCommand(ctx, bus.SubjectRun, req.RunId+"/run", req); err != nil {
			return err
		}
		fmt.Fprintln(stdout, req.RunId)
		return nil
	}
	chAddr, db := sf.clickHouseIfKnown()
	return runAndReport(ctx, b, chAddr, db, req, stdout, stderr)
}

// runAndReport submits, follows, waits for ClickHouse to hold every episode, and prints the
// summary and example queries.
func runAndReport(ctx context.Context, b *bus.Bus, chAddr, db string, req *gauntletv1.RunRequested, stdout, stderr io.Writer) error {
	fmt.Fprintf(stdout, "run %s: %d episodes of %s, policies %s, profiles %s\n", req.RunId, req.Episodes, req.Env,
		runs.FormatShares(req.Policies), runs.FormatShares(req.Profiles))
	t0 := time.Now()
	final, err := follow(ctx, b, req, stderr)
	if err != nil {
		return err
	}
	if final.Error != "" {
		return fmt.Errorf("run %s refused by the scheduler: %s", req.RunId, final.Error)
	}
	elapsed := time.Since(t0)
	if chAddr == "" {
		return nil
	}
	conn, err := trajectory.Connect(ctx, chAddr, db)
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := waitPersisted(ctx, b, conn, db, req.RunId, req.Episodes, final.Steps, stderr); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "\n%d episodes, %d steps in %.1fs (%.0f episodes/s, %.0f steps/s); all in ClickHouse after %.1fs\n\n",
		final.Ended, final.Steps, elapsed.Seconds(), float64(final.Ended)/elapsed.Seconds(), float64(final.Steps)/elapsed.Seconds(),
		time.Since(t0).Seconds())
	return printSummary(ctx, conn, chAddr, db, req.RunId, stdout)
}

// follow submits the run and renders its progress until it is done.
func follow(ctx context.Context, b *bus.Bus, req *gauntletv1.RunRequested, stderr io.Writer) (*gauntletv1.RunProgress, error) {
	ch := make(chan *nats.Msg, 64)
	sub, err := b.NC.ChanSubscribe(bus.SubjectProgress(req.RunId), ch)
	if err != nil {
		return nil, fmt.Errorf("subscribe to progress: %w", err)
	}
	defer sub.Unsubscribe()
	if err := b.PublishCommand(ctx, bus.SubjectRun, req.RunId+"/run", req); err != nil {
		return nil, err
	}
	kv, err := b.JS.KeyValue(ctx, bus.BucketRuns)
	if err != nil {
		return nil, fmt.Errorf("open run state: %w", err)
	}
	bar := newProgressBar(stderr)
	poll := time.NewTicker(2 * time.Second)
	defer poll.Stop()
	for {
		var p *gauntletv1.RunProgress
		select {
		case <-ctx.Done():
			bar.finish()
			return nil, fmt.Errorf("stopped following run %s (it goes on in the stack): %w", req.RunId, ctx.Err())
		case m := <-ch:
			p = &gauntletv1.RunProgress{}
			if err := proto.Unmarshal(m.Data, p); err != nil {
				continue
			}
		case <-poll.C:
			// Progress is published on core NATS, which may drop under load; the KV
			// state is authoritative.
			p = progressFromKV(ctx, kv, req.RunId)
			if p == nil {
				continue
			}
		}
		bar.update(p)
		if p.Done {
			bar.finish()
			return p, nil
		}
	}
}

// waitPersisted waits until ClickHouse holds every episode and step of the run. Counting
// a run there reads all its keys (a tenth of a second and more of ClickHouse's CPU for a
// run of 100,000 episodes), so while the store says it has not yet written the last event
// the stream held when the run was done (its StoreProgress, one KV read), it waits on that
// instead: the counts are read once the store has caught up, and decide. A count every
// few seconds all the same guards against a fact gone stale. b may be nil (then only
// ClickHouse is polled), as on a stack whose store never published.
func waitPersisted(ctx context.Context, b *bus.Bus, conn driver.Conn, db, runID string, episodes, steps uint64, stderr io.Writer) error {
	deadline := time.Now().Add(5 * time.Minute)
	var kv jetstream.KeyValue
	var last uint64
	if b != nil {
		var err error
		if last, err = b.EventsLastSeq(ctx); err == nil {
			kv, _ = b.StoreBucket(ctx)
		}
	}
	var counted time.Time
	for {
		wait := 25 * time.Millisecond
		if !storeBehind(ctx, kv, last) || time.Since(counted) > 5*time.Second {
			counted = time.Now()
			eps, st, err := trajectory.RunCounts(ctx, conn, db, runID)
			if err == nil && eps >= episodes && st >= steps {
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("ClickHouse holds %d/%d episodes and %d/%d steps of %s after 5 minutes (last error: %v)", eps, episodes, st, steps, runID, err)
			}
			wait = 250 * time.Millisecond
		} else if time.Now().After(deadline) {
			eps, st, err := trajectory.RunCounts(ctx, conn, db, runID)
			return fmt.Errorf("the store still had events to write after 5 minutes; ClickHouse holds %d/%d episodes and %d/%d steps of %s (error: %v)", eps, episodes, st, steps, runID, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}

// storeBehind reports whether the store has published that it has not yet written every
// event up to stream sequence last. No store bucket, no fact published yet or an error
// reading it is "not behind", so ClickHouse is asked.
func storeBehind(ctx context.Context, kv jetstream.KeyValue, last uint64) bool {
	if kv == nil {
		return false
	}
	p, err := bus.GetStoreProgress(ctx, kv)
	return err == nil && p != nil && p.GetWrittenSeq() < last
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// optBool is a boolean flag that knows whether it was given: -x, -x=true, -x=false.
type optBool struct{ v *bool }

func (b *optBool) String() string {
	if b == nil || b.v == nil {
		return ""
	}
	return strconv.FormatBool(*b.v)
}

func (b *optBool) Set(s string) error {
	v, err := strconv.ParseBool(s)
	if err != nil {
		return err
	}
	b.v = &v
	return nil
}

// IsBoolFlag lets the flag be given without a value.
func (b *optBool) IsBoolFlag() bool { return true }
