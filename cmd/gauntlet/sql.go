package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/env/world"
	"github.com/gauntlet-rl/gauntlet/pkg/scoring"
	"github.com/gauntlet-rl/gauntlet/pkg/trajectory"
)

// cmdSQL runs one query and prints an aligned table.
func cmdSQL(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("sql", stderr)
	var o stackFlags
	o.register(fs, partClickHouse)
	if err := parse(fs, args); err != nil {
		return err
	}
	query := strings.Join(fs.Args(), " ")
	if query == "-" || query == "" {
		b, err := io.ReadAll(os.Stdin)
		if err != nil {
			return fmt.Errorf("read query from stdin: %w", err)
		}
		query = string(b)
	}
	if strings.TrimSpace(query) == "" {
		fmt.Fprintln(stderr, `gauntlet sql: give a query: gauntlet sql "SELECT count() FROM steps"`)
		return errUsage
	}
	conn, _, err := o.connectClickHouse(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	cols, rows, err := trajectory.Query(ctx, conn, query)
	if err != nil {
		return err
	}
	printTable(stdout, cols, rows)
	fmt.Fprintf(stdout, "(%d rows)\n", len(rows))
	return nil
}

var episodeIDRe = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)

// cmdEpisodeShow shows one episode step by step.
func cmdEpisodeShow(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("episode show", stderr)
	var o stackFlags
	o.register(fs, partClickHouse)
	full := fs.Bool("full", false, "print whole observations instead of their first 160 characters")
	showPlan := fs.Bool("plan", false, "print the fault plan the episode met, re-derived from its record and checked against its digest")
	var worlds world.Config
	worlds.RegisterFlags(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := worlds.Register(); err != nil {
		return fmt.Errorf("--%w", err)
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(stderr, "usage: gauntlet episode show [flags] EPISODE_ID")
		return errUsage
	}
	id := fs.Arg(0)
	if !episodeIDRe.MatchString(id) {
		return fmt.Errorf("episode id %q: only letters, digits, '-' and '_' are allowed", id)
	}
	conn, db, err := o.connectClickHouse(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	_, eps, err := trajectory.Query(ctx, conn, fmt.Sprintf(`SELECT env, policy, profile, seed, steps, reason, success, infra_error, round(total_reward, 3), faults_fired, round(virtual_time_ns/1e6, 1)
		FROM %s.episodes FINAL WHERE episode_id = '%s'`, db, id))
	if err != nil {
		return err
	}
	_, steps, err := trajectory.Query(ctx, conn, fmt.Sprintf(`SELECT step, tool, args, toString(reward), toString(reward_names), toString(reward_values), reward_spec, reward_spec_digest,
		'', fault_kinds, fault_details, violation_reasons, observation, state_diff, reason
		FROM %s.steps FINAL WHERE episode_id = '%s' ORDER BY step`, db, id))
	if err != nil {
		return err
	}
	weights, err := episodeWeights(ctx, conn, db, steps)
	if err != nil {
		return err
	}
	if len(eps) == 0 && len(steps) == 0 {
		return fmt.Errorf("episode %s: not found in %s", id, db)
	}
	if len(eps) > 0 {
		e := eps[0]
		fmt.Fprintf(stdout, "episode %s  env %s  policy %s  profile %s  seed %s\n  %s steps, ended %s (success=%s infra_error=%s), reward %s, %s faults, %s ms virtual\n\n",
			id, e[0], e[1], e[2], e[3], e[4], e[5], e[6], e[7], e[8], e[9], e[10])
	}
	if *showPlan {
		if err := printEpisodePlan(ctx, conn, db, id, stdout); err != nil {
			return err
		}
	}
	cut := func(s string) string {
		if *full || utf8.RuneCountInString(s) <= 160 {
			return s
		}
		return string([]rune(s)[:160]) + "…"
	}
	for _, s := range steps {
		fmt.Fprintf(stdout, "step %s  %s %s\n", s[0], s[1], s[2])
		fmt.Fprintf(stdout, "  %s\n", formatReward(s[3], s[4], s[5], s[6], weights[s[7]]))
		if s[9] != "[]" {
			fmt.Fprintf(stdout, "  faults %s %s\n", s[9], s[10])
		}
		if s[11] != "[]" {
			fmt.Fprintf(stdout, "  causal %s\n", s[11])
		}
		fmt.Fprintf(stdout, "  obs    %s\n  diff   %s\n", cut(s[12]), cut(s[13]))
		if s[14] != "" {
			fmt.Fprintf(stdout, "  ended: %s\n", s[14])
		}
	}
	return nil
}

// episodeWeights returns the weights of the specs steps were scored under, by digest, from
// reward_specs; steps recorded before specs had digests were scored under default/1, whose
// weights are under the digest "".
func episodeWeights(ctx context.Context, conn driver.Conn, db string, steps [][]string) (map[string][]float64, error) {
	out := map[string][]float64{}
	var digests []string
	for _, s := range steps {
		if d := s[7]; d == "" && s[6] == scoring.DefaultVersion {
			def := scoring.SpecFor("")
			w := make([]float64, len(def.Weights))
			for i, x := range def.Weights {
				w[i] = x.Weight
			}
			out[""] = w
		} else if d != "" && !slices.Contains(digests, d) && digestRe.MatchString(d) {
			digests = append(digests, d)
		}
	}
	if len(digests) == 0 {
		return out, nil
	}
	_, rows, err := trajectory.Query(ctx, conn, fmt.Sprintf(`SELECT digest, toString(weights) FROM %s.reward_specs FINAL WHERE digest IN ('%s')`,
		db, strings.Join(digests, "','")))
	if err != nil {
		return nil, err
	}
	for _, r := range rows {
		var w []float64
		if err := json.Unmarshal([]byte(r[1]), &w); err != nil {
			return nil, fmt.Errorf("reward_specs %s: weights %s: %w", r[0], r[1], err)
		}
		out[r[0]] = w
	}
	return out, nil
}

var digestRe = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// formatReward writes a step's reward as what it is, the weighted sum of its components:
// "reward 0.243 = 1×task 0.25 + 0.2×cost -0.02 + ... (default/1)". total, names and values
// are ClickHouse's text of reward, reward_names and reward_values; weights are the spec's,
// nil when unknown (the values are then listed alone).
func formatReward(total, names, values, spec string, weights []float64) string {
	var n []string
	var v []float64
	if json.Unmarshal([]byte(strings.ReplaceAll(names, "'", `"`)), &n) != nil || json.Unmarshal([]byte(values), &v) != nil || len(n) != len(v) {
		return "reward " + total + " (" + spec + ")"
	}
	short := func(x float64) string { return strconv.FormatFloat(math.Round(x*1000)/1000, 'f', -1, 64) }
	t, _ := strconv.ParseFloat(total, 64)
	var b strings.Builder
	fmt.Fprintf(&b, "reward %s = ", short(t))
	for i := range n {
		if i > 0 {
			b.WriteString(" + ")
		}
		if len(weights) == len(n) {
			fmt.Fprintf(&b, "%s×%s %s", short(weights[i]), n[i], short(v[i]))
		} else {
			fmt.Fprintf(&b, "?×%s %s", n[i], short(v[i]))
		}
	}
	fmt.Fprintf(&b, "  (%s)", spec)
	return b.String()
}

// printTable prints rows aligned under their column names.
func printTable(w io.Writer, cols []string, rows [][]string) {
	width := make([]int, len(cols))
	for i, c := range cols {
		width[i] = utf8.RuneCountInString(c)
	}
	for _, r := range rows {
		for i, v := range r {
			if i < len(width) {
				width[i] = max(width[i], utf8.RuneCountInString(v))
			}
		}
	}
	line := func(vals []string) {
		var b strings.Builder
		for i, v := range vals {
			if i > 0 {
				b.WriteString("  ")
			}
			b.WriteString(v)
			if i < len(vals)-1 {
				b.WriteString(strings.Repeat(" ", width[i]-utf8.RuneCountInString(v)))
			}
		}
		fmt.Fprintln(w, b.String())
	}
	line(cols)
	seps := make([]string, len(cols))
	for i := range cols {
		seps[i] = strings.Repeat("-", width[i])
	}
	line(seps)
	for _, r := range rows {
		line(r)
	}
}

// exampleQueries are printed after a run: three questions an analyst asks first.
func exampleQueries(db, runID string) []string {
	return []string{
		fmt.Sprintf(`-- success rate and reward percentiles by policy and fault profile (infra errors carry no reward)
SELECT policy, profile, count() AS episodes, round(avg(success), 3) AS success_rate,
       arrayMap(x -> round(x, 2), quantiles(0.5, 0.9, 0.99)(total_reward)) AS reward_p50_p90_p99
FROM %s.episodes_scored WHERE run_id = '%s' GROUP BY policy, profile ORDER BY policy, profile`, db, runID),
		fmt.Sprintf(`-- which injected faults the agents met, and what the steps that met them earned
SELECT kind, count() AS fired, round(avg(reward), 3) AS mean_step_reward
FROM %s.steps FINAL ARRAY JOIN fault_kinds AS kind WHERE run_id = '%s'
  AND episode_id IN (SELECT episode_id FROM %s.episodes_scored WHERE run_id = '%s') GROUP BY kind ORDER BY fired DESC`, db, runID, db, runID),
		fmt.Sprintf(`-- the causal feedback agents got most often
SELECT policy, reason, count() AS times
FROM %s.steps FINAL ARRAY JOIN violation_reasons AS reason WHERE run_id = '%s'
GROUP BY policy, reason ORDER BY times DESC LIMIT 10`, db, runID),
	}
}

// printSummary prints the per-policy, per-profile table of a run and example queries.
func printSummary(ctx context.Context, conn driver.Conn, addr, db, runID string, w io.Writer) error {
	cols, rows, err := trajectory.Query(ctx, conn, fmt.Sprintf(`SELECT policy, profile, count() AS episodes,
		round(avgIf(success, infra_error = 0), 3) AS success_rate, round(avgIf(total_reward, infra_error = 0), 3) AS mean_reward,
		round(avgIf(steps, infra_error = 0), 1) AS mean_steps, sum(faults_fired) AS faults, sum(infra_error) AS infra_errors
		FROM %s.episodes FINAL WHERE run_id = '%s' GROUP BY policy, profile ORDER BY policy, profile`, db, runID))
	if err != nil {
		return err
	}
	printTable(w, cols, rows)
	client := "clickhouse-client"
	if host, port, err := net.SplitHostPort(addr); err == nil {
		client = fmt.Sprintf("clickhouse-client --host %s --port %s", host, port)
	}
	fmt.Fprintf(w, "\nTry these with gauntlet sql \"...\" (after the demo: start `gauntlet up` on the same data dir) or %s:\n", client)
	for _, q := range exampleQueries(db, runID) {
		fmt.Fprintf(w, "\n%s\n", q)
	}
	fmt.Fprintf(w, "\nThe whole compatibility report (with --format html --out report.html, one file with charts):\n\ngauntlet report %s\n", runID)
	return nil
}

// printEpisodePlan prints the whole fault plan of an ended episode (trajectory.EpisodePlan).
func printEpisodePlan(ctx context.Context, conn driver.Conn, db, id string, stdout io.Writer) error {
	row, err := trajectory.Episode(ctx, conn, db, id)
	if err != nil {
		return err
	}
	e, err := env.Lookup(row.Env)
	if err != nil {
		return fmt.Errorf("episode %s: %w", id, err)
	}
	plan, err := trajectory.EpisodePlan(ctx, conn, db, row, e.Spec().Services)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "fault plan: profile %s, plan seed %d, catalogue %s, digest %s\n", plan.Profile, plan.Seed, plan.CatalogueVersion, row.PlanDigest)
	if err := printPlan(stdout, plan); err != nil {
		return err
	}
	fmt.Fprintln(stdout)
	return nil
}
