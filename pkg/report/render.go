package report

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/trajectory"
)

// Formats of Write.
const (
	FormatTable = "table"
	FormatJSON  = "json"
	FormatHTML  = "html"
)

// Write renders r in format (FormatTable, FormatJSON or FormatHTML) to w.
func Write(w io.Writer, r *Report, format string) error {
	switch format {
	case FormatTable:
		return writeTable(w, r)
	case FormatJSON:
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(r)
	case FormatHTML:
		return writeHTML(w, r)
	}
	return fmt.Errorf("report format %q: want table, json or html", format)
}

// pct formats a rate as a percentage with its interval: "81.0 % [77.2, 84.3]".
func pct(r Rate) string {
	if r.Trials == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f %% [%.1f, %.1f]", 100*r.Rate, 100*r.Low, 100*r.High)
}

func num(f float64) string { return fmt.Sprintf("%.3f", f) }

func quant(q Quantiles) string {
	return fmt.Sprintf("%s / %s / %s", num(q.P50), num(q.P90), num(q.P99))
}

// section is one titled table of the report: what the terminal and the HTML both show.
type section struct {
	title string
	note  string
	head  []string
	rows  [][]string
}

// sections lays the report out once for every format that prints tables.
func sections(r *Report) []section {
	var out []section
	out = append(out, section{
		title: "Overview",
		note:  "Success rates exclude infra errors; intervals are Wilson's at 95 %. Percentiles are exact.",
		head:  []string{"episodes", "infra errors", "success", "reward mean", "reward p50 / p90 / p99", "steps p50 / p90 / p99"},
		rows: [][]string{{fmt.Sprint(r.Episodes), fmt.Sprint(r.InfraErrors), pct(r.Success), num(r.RewardMean),
			quant(r.Reward), quant(r.Steps)}},
	})
	if len(r.ByStage) > 0 {
		s := section{title: "By stage", head: []string{"stage", "episodes", "success", "reward mean"}}
		for _, g := range r.ByStage {
			s.rows = append(s.rows, []string{g.Key, fmt.Sprint(g.Episodes), pct(g.Success), num(g.RewardMean)})
		}
		out = append(out, s)
	}
	if len(r.Stages) > 0 {
		s := section{title: "Stage transitions", head: []string{"stage", "outcome", "metric", "window value", "threshold", "episodes", "infra errors", "batches", "closed at"}}
		for _, st := range r.Stages {
			s.rows = append(s.rows, []string{fmt.Sprintf("%d %s", st.Stage, st.StageName), st.Outcome, st.Metric,
				num(st.WindowValue), num(st.Threshold), fmt.Sprint(st.Episodes), stageInfra(st), fmt.Sprint(st.Batches), st.ClosedAt.UTC().Format(time.DateTime)})
		}
		out = append(out, s)
	}
	s := section{title: "By run", head: []string{"run", "label", "seed", "policies", "profiles", "episodes", "success", "reward mean", "reward p50 / p90 / p99"}}
	for _, g := range r.ByRun {
		label, seed, pol, prof := "", "", "", ""
		if g.Run != nil {
			label, seed, pol, prof = g.Run.Label, fmt.Sprint(g.Run.Seed), runPolicies(g.Run), g.Run.ProfileMix
		}
		s.rows = append(s.rows, []string{g.Key, label, seed, pol, prof, fmt.Sprint(g.Episodes), pct(g.Success), num(g.RewardMean), quant(g.Reward)})
	}
	out = append(out, s)
	s = section{title: "By policy", head: []string{"policy", "episodes", "success", "reward mean"}}
	for _, g := range r.ByPolicy {
		s.rows = append(s.rows, []string{g.Key, fmt.Sprint(g.Episodes), pct(g.Success), num(g.RewardMean)})
	}
	out = append(out, s)
	s = section{
		title: "Under faults",
		note: "met: episodes that met the kind at least once; first fault: each faulted episode counted once, " +
			"under the kind of its first fault. No fault: episodes no fault touched.",
		head: []string{"fault kind", "met: episodes", "met: success", "met: reward mean", "first fault: episodes", "first fault: success", "first fault: reward mean"},
	}
	s.rows = append(s.rows, []string{"(no fault)", fmt.Sprint(r.Unfaulted.Trials), pct(r.Unfaulted), num(r.UnfaultedRewardMean), "", "", ""})
	for _, f := range r.Faults {
		s.rows = append(s.rows, []string{f.Kind, fmt.Sprint(f.Met.Trials), pct(f.Met), num(f.MetRewardMean),
			fmt.Sprint(f.First.Trials), pct(f.First), num(f.FirstRewardMean)})
	}
	out = append(out, s)
	for _, t := range []struct {
		title, comp string
		lines       []Trigger
	}{{"Safety events", "safety mean", r.Safety}, {"Causal rules broken", "causal mean", r.Violations}} {
		s = section{title: t.title, note: fmt.Sprintf("What the steps they happened in scored; the mean step reward of the whole run is %s.", num(r.Cost.StepRewardMean)),
			head: []string{"name", "times", "episodes", t.comp, "step reward mean"}}
		for _, l := range t.lines {
			s.rows = append(s.rows, []string{l.Name, fmt.Sprint(l.Times), fmt.Sprint(l.Episodes), num(l.ComponentMean), num(l.StepRewardMean)})
		}
		if len(t.lines) == 0 {
			s.rows = append(s.rows, []string{"(none)", "0", "0", "", ""})
		}
		out = append(out, s)
	}
	s = section{
		title: "Resource limits",
		note: "Limits the sandboxes hit, apart from safety events (honest programs hit them too): episodes that hit each at least once, " +
			"and those that ended on a step that hit it. Episodes cut by their own step or time limit are under Stuck.",
		head: []string{"limit", "times", "episodes", "success", "reward mean", "ended on it", "step reward mean"},
	}
	for _, l := range r.Limits {
		s.rows = append(s.rows, []string{l.Kind, fmt.Sprint(l.Times), fmt.Sprint(l.Met.Trials), pct(l.Met), num(l.RewardMean),
			fmt.Sprint(l.Ended), num(l.StepRewardMean)})
	}
	if len(r.Limits) == 0 {
		s.rows = append(s.rows, []string{"(none)", "0", "0", "", "", "0", ""})
	}
	out = append(out, s)
	c := r.Cost
	out = append(out, section{
		title: "Cost and metering",
		head:  []string{"steps", "spend", "tool calls", "errors", "invalid actions", "bytes in", "bytes out", "cpu", "peak memory", "wall time", "virtual time"},
		rows: [][]string{{fmt.Sprint(c.Steps), fmt.Sprintf("%.2f", c.Spend), fmt.Sprint(c.ToolCalls), fmt.Sprint(c.Errors), fmt.Sprint(c.InvalidActions),
			fmt.Sprint(c.BytesIn), fmt.Sprint(c.BytesOut), time.Duration(c.CPUNs).String(), fmt.Sprint(c.PeakMemoryBytes),
			time.Duration(c.WallNs).String(), time.Duration(c.VirtualNs).String()}},
	})
	dur := func(q Quantiles) string {
		return fmt.Sprintf("%v / %v / %v", time.Duration(q.P50), time.Duration(q.P90), time.Duration(q.P99))
	}
	lt := r.Latency
	out = append(out, section{
		title: "Step latency",
		note:  "Where a step's time goes: the env's call, the policy choosing the action (for the env API, the trainer's turn), the scoring.",
		head:  []string{"env p50 / p90 / p99", "policy p50 / p90 / p99", "reward p50 / p90 / p99", "step p50 / p90 / p99"},
		rows:  [][]string{{dur(lt.Env), dur(lt.Policy), dur(lt.Reward), dur(lt.Step)}},
	})
	s = section{
		title: "Stuck and looping",
		note: "Stuck: ran out of steps or time without succeeding. Looping: one action (same tool, same arguments) " +
			"taken at least 5 times and in at least half the episode's steps.",
		head: []string{"what", "episodes", "success"},
	}
	reasons := make([]string, 0, len(r.StuckBy))
	for k := range r.StuckBy {
		reasons = append(reasons, k)
	}
	sort.Strings(reasons)
	s.rows = append(s.rows, []string{"stuck", fmt.Sprint(r.Stuck), ""})
	for _, k := range reasons {
		s.rows = append(s.rows, []string{"  stuck: " + k, fmt.Sprint(r.StuckBy[k]), ""})
	}
	s.rows = append(s.rows, []string{"looping", fmt.Sprint(r.Looping.Trials), pct(r.Looping)})
	for _, l := range r.LoopingTop {
		s.rows = append(s.rows, []string{fmt.Sprintf("  %s: %s ×%d of %d steps", l.EpisodeID, l.Tool, l.Repeats, l.Steps), "", ""})
	}
	out = append(out, s)
	return out
}

func writeTable(w io.Writer, r *Report) error {
	fmt.Fprintf(w, "Compatibility report: %s\n(database %s, %s)\n", r.Title, r.Database, r.GeneratedAt.Format(time.RFC3339))
	for _, s := range sections(r) {
		fmt.Fprintf(w, "\n%s\n", s.title)
		if s.note != "" {
			fmt.Fprintf(w, "  %s\n", s.note)
		}
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  "+strings.Join(s.head, "\t"))
		for _, row := range s.rows {
			fmt.Fprintln(tw, "  "+strings.Join(row, "\t"))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return nil
}

// stageInfra is a closed stage's infra errors, by kind when it recorded them:
// "12 (model_endpoint 10, sandbox 2)".
func stageInfra(st trajectory.StageRow) string {
	if st.InfraErrors == 0 || len(st.InfraKinds) == 0 {
		return fmt.Sprint(st.InfraErrors)
	}
	parts := make([]string, len(st.InfraKinds))
	for i, k := range st.InfraKinds {
		var n uint64
		if i < len(st.InfraCounts) {
			n = st.InfraCounts[i]
		}
		parts[i] = fmt.Sprintf("%s %d", k, n)
	}
	return fmt.Sprintf("%d (%s)", st.InfraErrors, strings.Join(parts, ", "))
}

// runPolicies is a run's policy mix with its http policy's choice of token ids and
// logprobs when the run made one (a run that left it to the workers says nothing).
func runPolicies(r *trajectory.RunRow) string {
	if r.PolicyLogprobs == "" {
		return r.PolicyMix
	}
	return r.PolicyMix + " (logprobs " + r.PolicyLogprobs + ")"
}
