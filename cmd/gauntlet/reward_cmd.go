package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"

	"github.com/gauntlet-rl/gauntlet/pkg/play"
	"github.com/gauntlet-rl/gauntlet/pkg/scoring"
	"github.com/gauntlet-rl/gauntlet/pkg/trajectory"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

const rewardUsage = `usage: gauntlet reward explain [flags] EPISODE_ID [--step N]
       gauntlet reward rescore [flags] --run RUN_ID --spec FILE
       gauntlet reward fingerprints [--nats URL] [--json] [--forget ID]

explain replays a recorded episode (its env, seed, fault plan and actions, as episode
snapshot does) and scores each step again under the reward spec it was recorded with
(docs/rewards.md): per component, its raw value and the rule that produced it, each
normalisation stage, its weight and its contribution to the step's reward, and whether
the re-derived reward equals the recorded one to the bit.

rescore scores every recorded step of a run again under another spec (a file, or
"default" for the built-in default/1), from the steps table, into step_scores keyed by
the spec's digest, and records the spec in reward_specs, so the run's totals under both
compare side by side in SQL (docs/rewards.md). Running it again skips what is done:
after a crash or ^C it finishes the run. Steps recorded under the same spec must score as
recorded, to the bit, or it fails.

fingerprints lists the threat fingerprints every player flags (a command some sandbox saw
attack, normalised; docs/rewards.md), oldest first; --forget ID removes one, a false
positive judged by an operator, and every player stops flagging it within milliseconds.
`

// cmdReward routes `gauntlet reward explain|rescore|fingerprints`.
func cmdReward(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "explain" {
		return cmdRewardExplain(ctx, args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "rescore" {
		return cmdRewardRescore(ctx, args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "fingerprints" {
		return cmdRewardFingerprints(ctx, args[1:], stdout, stderr)
	}
	fmt.Fprint(stderr, rewardUsage)
	return errUsage
}

func cmdRewardExplain(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("reward explain", stderr)
	var o replayOpts
	o.stack.register(fs, partClickHouse)
	only := fs.Int("step", -1, "explain only this step (0-based; default: every step)")
	o.registerSandbox(fs)
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		fmt.Fprint(stderr, rewardUsage)
		return errUsage
	}
	id := pos[0]
	if !episodeIDRe.MatchString(id) {
		return fmt.Errorf("episode id %q: only letters, digits, '-' and '_' are allowed", id)
	}
	// Every step replays from its recording: an MCP env's server answers from the
	// recorded diffs (mcpenv.Cassette), not live.
	o.cassette = true
	rec, err := o.load(ctx, id)
	if err != nil {
		return err
	}
	defer rec.close()
	if *only >= len(rec.steps) {
		return fmt.Errorf("--step %d: episode %s has %d steps (0 to %d)", *only, id, len(rec.steps), len(rec.steps)-1)
	}
	spec := rec.spec
	// Every step is replayed, also for --step: a stateful spec's values depend on the
	// steps before.
	o.step = len(rec.steps)
	sc := &explainScorer{spec: spec}
	r, err := o.rebuildScored(ctx, rec, sc)
	if err != nil {
		return err
	}
	defer r.sess.Close()

	fmt.Fprintf(stdout, "episode %s (env %s, seed %d): %d steps scored under %s (%s)\n", id, rec.row.Env, rec.row.Seed, len(rec.steps), spec.Version, spec.Digest)
	if r.differ >= 0 {
		fmt.Fprintf(stdout, "WARNING: step %d observed something else than recorded (a command whose output is not deterministic?): what follows may not be what was scored\n", r.differ)
	}
	same := 0
	for i, ex := range sc.steps {
		recorded := rec.steps[i].Reward
		if math.Float64bits(recorded) == math.Float64bits(sc.totals[i]) {
			same++
		}
		if *only >= 0 && i != *only {
			continue
		}
		st := rec.steps[i]
		fmt.Fprintf(stdout, "\nstep %d  %s %s\n", i, st.Tool, cut(st.Args, 100))
		verdict := "= recorded"
		if math.Float64bits(recorded) != math.Float64bits(sc.totals[i]) {
			verdict = "recorded " + num(recorded) + ": DIFFERS"
		}
		fmt.Fprintf(stdout, "  reward %s (%s) = sum of weight × value\n", num(sc.totals[i]), verdict)
		rows := make([][]string, len(ex))
		for j, e := range ex {
			how := e.Rule
			if e.Inputs != "" {
				how += " (" + e.Inputs + ")"
			}
			for _, s := range e.Stages {
				how += " | " + s.Rule + " → " + num(s.Value)
			}
			if e.Bounded {
				how += " | bounded to [-1, 1]"
			}
			if e.Err != nil {
				how += " (evaluation failed: " + e.Err.Error() + "; scored 0)"
			}
			rows[j] = []string{e.Name, num(e.Raw), num(e.Value), num(e.Weight), num(e.Contribution), how}
		}
		printTable(stdout, []string{"component", "raw", "value", "weight", "contribution", "rule"}, rows)
	}
	fmt.Fprintf(stdout, "\nre-derived rewards: %d of %d steps equal to the recorded ones, bit for bit\n", same, len(sc.steps))
	if same != len(sc.steps) {
		return errors.New("re-derived rewards differ from the recorded ones (see DIFFERS above)")
	}
	return nil
}

func cmdRewardRescore(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("reward rescore", stderr)
	var stack stackFlags
	stack.register(fs, partClickHouse)
	run := fs.String("run", "", "the run whose recorded steps to score (required)")
	file := fs.String("spec", "", `the reward spec file to score them under, or "default" for the built-in default/1 (required)`)
	batch := fs.Int("batch", 200, "episodes scored and written at a time: what a crash can lose")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 || *run == "" || *file == "" {
		fmt.Fprint(stderr, rewardUsage)
		return errUsage
	}
	if !episodeIDRe.MatchString(*run) {
		return fmt.Errorf("--run %q: only letters, digits, '-' and '_' are allowed", *run)
	}
	if *batch < 1 {
		return fmt.Errorf("--batch %d: must be at least 1", *batch)
	}
	spec := scoring.SpecFor("")
	if *file != "default" {
		if spec, err = scoring.LoadFile(*file); err != nil {
			return err
		}
	}
	conn, db, err := stack.connectClickHouse(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	res, err := trajectory.Rescore(ctx, conn, db, *run, spec, trajectory.RescoreOptions{Episodes: *batch})
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "run %s re-scored under %s (%s): %d episodes, %d steps scored; %d episodes were done already\n",
		*run, spec.Version, spec.Digest, res.Scored, res.Steps, res.Done)
	if res.Compared > 0 {
		fmt.Fprintf(stdout, "%d steps were recorded under this spec: %d re-derived to the bit\n", res.Compared, res.Compared-res.Differ)
	}
	fmt.Fprintf(stdout, "compare: SELECT spec_digest, sum(reward) FROM %s.step_scores FINAL WHERE run_id = '%s' GROUP BY spec_digest\n", db, *run)
	if res.Differ > 0 {
		return fmt.Errorf("%d of %d steps recorded under %s score otherwise than recorded (the first: %s): scoring is not what it was when they were recorded",
			res.Differ, res.Compared, spec.Version, res.FirstDiffer)
	}
	return nil
}

// num writes a value as short as it reads exactly.
func num(x float64) string { return strconv.FormatFloat(x, 'g', -1, 64) }

// explainScorer scores replayed steps with scoring.Explain, keeping each step's
// explanation; it carries the episode's state itself, as the worker does.
type explainScorer struct {
	spec   scoring.Spec
	state  gauntletv1.RewardState
	steps  [][]scoring.Explained
	totals []float64
}

// Score implements play.StepScorer.
func (e *explainScorer) Score(_ context.Context, st *gauntletv1.StepTaken, _ *play.EpisodeScoring, _ chan play.ScoreResult) (*gauntletv1.StepScored, error) {
	ex, total := scoring.Explain(e.spec, &e.state, st)
	e.steps, e.totals = append(e.steps, ex), append(e.totals, total)
	sc := &gauntletv1.StepScored{EpisodeId: st.GetEpisodeId(), Step: st.GetStep(), SpecVersion: e.spec.Version, SpecDigest: e.spec.Digest, Total: total}
	for _, x := range ex {
		sc.Components = append(sc.Components, &gauntletv1.RewardComponent{Name: x.Name, Value: x.Value, Weight: x.Weight})
	}
	return sc, nil
}
