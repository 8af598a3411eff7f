package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/catalogue"
	"github.com/gauntlet-rl/gauntlet/pkg/scoring"
	"github.com/gauntlet-rl/gauntlet/pkg/trajectory"
)

// e2eSpec shapes progress, counts the episode's earlier steps and normalises each step's
// virtual time with a running z-score: every part needs the episode's state to travel from
// step to step. Its detectors mark without penalising; repeat reads each step's action,
// which the worker sends the reward service with the steps of a run naming a spec.
const e2eSpec = `name: e2e
version: "1"
components:
  - {name: task, builtin: task, weight: 1}
  - {name: cost, builtin: cost, weight: 0.2}
  - {name: progress, potential: {expr: signals.progress, gamma: 1}, weight: 0.5}
  - {name: seen, expr: "double(episode.steps) / 100.0", weight: 0}
  - {name: calls, expr: double(metering.virtual_ns) / 1e9, weight: 0.1, normalise: [{zscore: {window: 4}}]}
  - {name: idle, detector: {kind: idle, window: 5, faults: hold}, weight: 0}
  - {name: repeat, detector: {kind: repeat, window: 2, faults: hold}, weight: 0}
`

// TestRewardSpecRun submits a run naming a reward spec file, as gauntlet run does, and
// checks in ClickHouse that every step was scored under it with its episode's state: the
// spec's name/version and digest on every step and episode, the spec once in reward_specs,
// each total rebuilt in SQL to the bit, the episode so far seen by each step, and the
// shaping of every terminated episode summing to zero.
func TestRewardSpecRun(t *testing.T) {
	if testing.Short() {
		t.Skip("needs ClickHouse; run without -short")
	}
	path := filepath.Join(t.TempDir(), "e2e.yaml")
	if err := os.WriteFile(path, []byte(e2eSpec), 0o644); err != nil {
		t.Fatal(err)
	}
	o := runOpts{env: "shop", params: "{}", policies: "oracle=1,random=1", profiles: "baseline=1", rewardSpec: path,
		episodes: 60, seed: 11, maxInFlight: 60, label: t.Name()}
	req, err := o.request()
	if err != nil {
		t.Fatal(err)
	}
	if req.RewardSpec != o.spec.Digest {
		t.Fatalf("run names %q, want the file's digest %s", req.RewardSpec, o.spec.Digest)
	}
	cfg := testConfig(t)
	s := startStack(t, cfg)
	conn := connect(t, s.app.clickHouseAddr(), cfg.Database)
	if err := putRewardSpec(context.Background(), s.app.getBus(), o.spec); err != nil {
		t.Fatal(err)
	}
	runToEnd(t, s.app.getBus(), conn, cfg.Database, req)

	db, run := cfg.Database, req.RunId
	steps := queryOne(t, conn, fmt.Sprintf(`SELECT count() FROM %s.steps_final WHERE run_id = '%s'`, db, run))
	if steps == "0" {
		t.Fatal("the run recorded no steps")
	}
	checks := []struct{ what, query, want string }{
		{"steps under the spec, by name and digest",
			fmt.Sprintf(`SELECT count() FROM %s.steps_final WHERE run_id = '%s' AND reward_spec = 'e2e/1' AND reward_spec_digest = '%s'`, db, run, o.spec.Digest), steps},
		{"episodes under the spec",
			fmt.Sprintf(`SELECT count() FROM %s.episodes_final WHERE run_id = '%s' AND reward_spec_digest = '%s'`, db, run, o.spec.Digest), "60"},
		{"the spec in reward_specs",
			fmt.Sprintf(`SELECT concat(spec, ' ', toString(weights), ' ', toString(source = '')) FROM %s.reward_specs_final WHERE digest = '%s'`, db, o.spec.Digest),
			"e2e/1 [1,0.2,0.5,0,0.1,0,0] 0"},
		{"totals rebuilt in SQL that differ",
			fmt.Sprintf(`SELECT countIf(arraySum(arrayMap((v, w) -> v * w, reward_values, weights)) != reward) FROM %s.steps_final
				ANY INNER JOIN (SELECT digest AS reward_spec_digest, weights FROM %s.reward_specs_final) USING reward_spec_digest
				WHERE run_id = '%s'`, db, db, run), "0"},
		{"steps that did not see the episode so far",
			fmt.Sprintf(`SELECT countIf(reward_values[indexOf(reward_names, 'seen')] != step / 100) FROM %s.steps_final WHERE run_id = '%s'`, db, run), "0"},
		{"terminated episodes whose shaping does not sum to 0",
			fmt.Sprintf(`SELECT count() FROM (
				SELECT episode_id, sum(reward_values[indexOf(reward_names, 'progress')]) AS shaping
				FROM %s.steps_final WHERE run_id = '%s' GROUP BY episode_id HAVING abs(shaping) > 1e-9)
				WHERE episode_id IN (SELECT episode_id FROM %s.episodes_final WHERE run_id = '%s' AND terminated = 1)`, db, run, db, run), "0"},
		{"terminated episodes",
			fmt.Sprintf(`SELECT toString(count() > 10) FROM %s.episodes_final WHERE run_id = '%s' AND terminated = 1`, db, run), "1"},
		// The idle detector, in the reward service: random idles, the oracle never does.
		{"episodes flagged idle, by policy",
			fmt.Sprintf(`SELECT arrayStringConcat(groupArray(concat(policy, ' ', toString(flagged > 0))), ', ') FROM (
				SELECT policy, uniqExactIf(episode_id, reward_values[indexOf(reward_names, 'idle')] < 0) AS flagged
				FROM %s.steps_final WHERE run_id = '%s' GROUP BY policy ORDER BY policy)`, db, run),
			"oracle 0, random 1"},
		{"steps with a z-score away from 0",
			fmt.Sprintf(`SELECT toString(countIf(reward_values[indexOf(reward_names, 'calls')] != 0) > 0) FROM %s.steps_final WHERE run_id = '%s'`, db, run), "1"},
	}
	for _, c := range checks {
		if got := queryOne(t, conn, c.query); got != c.want {
			t.Errorf("%s: %s, want %s", c.what, got, c.want)
		}
	}
	// The repeat detector (window 2), in the reward service: a step is flagged exactly
	// when its recorded action is the same as the last one's that no injected fault
	// answered, in a row; a step a fault answered (the worker sent its kind) is not
	// flagged, and holds the row when it retries its action. Random repeats itself now
	// and then, the oracle (retrying through the baseline profile's faults) never.
	_, rows, err := trajectory.Query(context.Background(), conn, fmt.Sprintf(`SELECT episode_id, policy, tool, args,
		toString(reward_values[indexOf(reward_names, 'repeat')]), toString(arrayExists(k -> k IN ('`+strings.Join(answering(), "', '")+`'), fault_kinds))
		FROM %s.steps_final WHERE run_id = '%s' ORDER BY episode_id, step`, db, run))
	if err != nil {
		t.Fatal(err)
	}
	var inRow, flagged, oracleFlagged, held int
	var last []string // the row's episode, tool and args
	for _, r := range rows {
		same := last != nil && r[0] == last[0] && r[2] == last[1] && r[3] == last[2]
		want := false
		switch {
		case r[5] == "1": // answered by a fault: holds a retry's row, ends another's
			held++
			if !same {
				inRow, last = 0, nil
			}
		case same && inRow > 0:
			inRow++
			want = inRow >= 2
		default:
			inRow, last = 1, []string{r[0], r[2], r[3]}
		}
		if got := r[4] == "-1"; got != want {
			t.Errorf("episode %s, action %s %s, %d in a row (answered by a fault: %s): repeat flagged %v", r[0], r[2], r[3], inRow, r[5], got)
		}
		if r[4] == "-1" {
			flagged++
			if r[1] == "oracle" {
				oracleFlagged++
			}
		}
	}
	t.Logf("repeat: %d of %d steps flagged, %d of the oracle's; %d steps answered by a fault", flagged, len(rows), oracleFlagged, held)
	if flagged == 0 || oracleFlagged != 0 {
		t.Errorf("repeat flagged %d steps, %d of them the oracle's: want some of random's, none of the oracle's", flagged, oracleFlagged)
	}

	// reward rescore re-derives the whole run's scores from its rows, to the bit, and
	// scores it under the default spec beside them.
	cliCH := []string{"--clickhouse", s.app.clickHouseAddr(), "--database", db, "--run", run}
	var rs strings.Builder
	if err := runMain(context.Background(), append([]string{"reward", "rescore", "--spec", path}, cliCH...), &rs, &rs); err != nil {
		t.Fatalf("reward rescore under the run's spec: %v\n%s", err, rs.String())
	}
	if want := steps + " steps were recorded under this spec: " + steps + " re-derived to the bit"; !strings.Contains(rs.String(), want) {
		t.Errorf("reward rescore says\n%s\nwant %q", rs.String(), want)
	}
	rs.Reset()
	if err := runMain(context.Background(), append([]string{"reward", "rescore", "--spec", "default"}, cliCH...), &rs, &rs); err != nil {
		t.Fatalf("reward rescore under default/1: %v\n%s", err, rs.String())
	}
	t.Logf("reward rescore:\n%s", rs.String())
	rescored := []struct{ what, query, want string }{
		{"re-scored steps that differ from the recorded ones, under the run's spec",
			fmt.Sprintf(`SELECT countIf(s.reward != r.reward OR s.reward_values != r.reward_values) FROM %s.steps_final AS s
				ANY INNER JOIN (SELECT episode_id, step, reward, reward_values FROM %s.step_scores_final
					WHERE run_id = '%s' AND spec_digest = '%s') AS r USING (episode_id, step)
				WHERE run_id = '%s'`, db, db, run, o.spec.Digest, run), "0"},
		// docs/rewards.md's side by side: each spec's steps and episodes.
		{"steps and episodes per spec",
			fmt.Sprintf(`SELECT arrayStringConcat(groupArray(concat(spec, ' ', toString(n), ' ', toString(e))), ', ') FROM (
				SELECT spec, count() AS n, uniqExact(episode_id) AS e FROM %s.step_scores FINAL WHERE run_id = '%s' GROUP BY spec ORDER BY spec)`, db, run),
			"default/1 " + steps + " 60, e2e/1 " + steps + " 60"},
	}
	for _, c := range rescored {
		if got := queryOne(t, conn, c.query); got != c.want {
			t.Errorf("%s: %s, want %s", c.what, got, c.want)
		}
	}

	// reward explain re-derives a recorded episode's rewards, step by step, from its replay.
	ep := queryOne(t, conn, fmt.Sprintf(`SELECT episode_id FROM %s.episodes_final WHERE run_id = '%s' AND success = 1 AND steps > 3
		ORDER BY episode_id LIMIT 1`, db, run))
	n := queryOne(t, conn, fmt.Sprintf(`SELECT toString(steps) FROM %s.episodes_final WHERE episode_id = '%s'`, db, ep))
	cli := []string{"--clickhouse", s.app.clickHouseAddr(), "--database", db, "--data-dir", t.TempDir()}
	var out, errOut strings.Builder
	if err := runMain(context.Background(), append([]string{"reward", "explain"}, append(cli, ep)...), &out, &errOut); err != nil {
		t.Fatalf("reward explain: %v\n%s%s", err, out.String(), errOut.String())
	}
	t.Logf("reward explain %s:\n%s", ep, out.String())
	for _, want := range []string{
		"scored under e2e/1 (" + o.spec.Digest + ")",
		"re-derived rewards: " + n + " of " + n + " steps equal to the recorded ones, bit for bit",
		"potential gamma*phi(after) - phi(before), phi = signals.progress, gamma = 1",
		"expr double(metering.virtual_ns) / 1e9 | zscore window 4 → ",
		"step 2  ",
		"builtin task (progress_delta ",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("reward explain does not say %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	if err := runMain(context.Background(), append([]string{"reward", "explain", "--step", "1"}, append(cli, ep)...), &out, &errOut); err != nil {
		t.Fatalf("reward explain --step 1: %v\n%s", err, errOut.String())
	}
	if !strings.Contains(out.String(), "\nstep 1  ") || strings.Contains(out.String(), "\nstep 0  ") || strings.Contains(out.String(), "\nstep 2  ") {
		t.Errorf("reward explain --step 1 shows other steps:\n%s", out.String())
	}
	out.Reset()
	if err := runMain(context.Background(), append([]string{"episode", "show"}, append(cli[:4], ep)...), &out, &errOut); err != nil {
		t.Fatalf("episode show: %v", err)
	}
	if !strings.Contains(out.String(), " = 1×task ") || !strings.Contains(out.String(), " + 0.5×progress ") || !strings.Contains(out.String(), "(e2e/1)") {
		t.Errorf("episode show does not write rewards as weighted sums:\n%s", out.String())
	}
}

// answering lists the fault kinds that answer a call (scoring.FaultAnswers), from the
// catalogue's.
func answering() []string {
	var out []string
	for _, k := range catalogue.KindNames() {
		if scoring.FaultAnswers(k) {
			out = append(out, k)
		}
	}
	return out
}
