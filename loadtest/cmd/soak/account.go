package main

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// runLedger is what the harness knows of one run of built-in episodes it submitted: its
// id and how many episodes it asked for (indices 0..episodes-1).
type runLedger struct {
	ID       string `json:"id"`
	Episodes uint64 `json:"episodes"`
}

// runRecorded is what ClickHouse holds of one run: from episodes FINAL, the distinct
// episodes, their lowest and highest index, the steps their rows claim and how many are
// infra errors; from steps, the distinct (episode, step) pairs.
type runRecorded struct {
	ID            string
	Episodes      uint64
	MinIdx        uint64
	MaxIdx        uint64
	ClaimedSteps  uint64
	DistinctSteps uint64
	InfraErrors   uint64
}

// apiEpisode is the harness's ledger of one episode a trainer played over the env API.
type apiEpisode struct {
	ID string `json:"id"`
	// Acked counts the steps the API answered; Unacked the steps sent whose answer was
	// lost to a broken connection (the server may have played them: steps outlive their
	// call).
	Acked   uint32 `json:"acked"`
	Unacked uint32 `json:"unacked,omitempty"`
	// Big counts the acknowledged steps whose action was over the big-action size.
	Big uint32 `json:"big,omitempty"`
	// Over: the episode ended by its own rules or by Close, answered by the API.
	Over bool `json:"over,omitempty"`
	// Cut: the episode was live when the harness killed gauntlet (the API answered
	// SERVER_RESTARTED, or could not be reached until it did). Its end is not recorded, by
	// design (docs/envapi.md, After a restart).
	Cut bool `json:"cut,omitempty"`
	// Unclosed: at the end of the load its Close was not answered within the bound.
	Unclosed bool `json:"unclosed,omitempty"`
	// Forgotten: the API answered NOT_FOUND for the episode while it was live.
	Forgotten bool `json:"forgotten,omitempty"`
	// InfraSeen counts step results the API flagged as infra errors.
	InfraSeen uint32 `json:"infra_seen,omitempty"`
}

// apiRecorded is what ClickHouse holds of one env API episode.
type apiRecorded struct {
	// EpisodeRows is the number of rows in episodes FINAL (0 or 1).
	EpisodeRows uint64
	Steps       uint64 // distinct steps in steps
	InfraError  bool
	// CutArgs counts steps whose args were recorded cut, with the gauntlet_truncated mark.
	CutArgs uint64
}

// Accounting is the verdict on every episode the harness started.
type Accounting struct {
	Runs             int    `json:"runs"`
	BuiltinEpisodes  uint64 `json:"builtin_episodes"`
	BuiltinRecorded  uint64 `json:"builtin_recorded"`
	BuiltinSteps     uint64 `json:"builtin_steps"`
	APIEpisodes      int    `json:"api_episodes"`
	APIOver          int    `json:"api_over"`
	APICut           int    `json:"api_cut_by_kill"`
	APIUnclosed      int    `json:"api_unclosed"`
	APIOverRecorded  int    `json:"api_over_recorded"`
	APISteps         uint64 `json:"api_steps_acked"`
	BigActions       uint64 `json:"big_actions_acked"`
	BigRecordedCut   uint64 `json:"big_actions_recorded_cut"`
	LostEpisodes     uint64 `json:"lost_episodes"`
	LostSteps        uint64 `json:"lost_steps"`
	ExtraSteps       uint64 `json:"extra_steps"`
	InfraErrors      uint64 `json:"infra_errors"`
	FalseInfraErrors uint64 `json:"false_infra_errors"`
	// Problems names each failed check, at most a few per kind.
	Problems []string `json:"problems,omitempty"`
}

// OK reports whether nothing was lost, nothing duplicated and no infra error was false.
func (a *Accounting) OK() bool {
	return a.LostEpisodes == 0 && a.LostSteps == 0 && a.APIUnclosed == 0 && a.ExtraSteps == 0 && a.FalseInfraErrors == 0 &&
		a.BigRecordedCut == a.BigActions && len(a.Problems) == 0
}

// maxProblems bounds the problems listed per kind, so a broken run gives a readable report.
const maxProblems = 10

// account checks the harness's ledger against what ClickHouse holds.
//
// Built-in runs: each must hold every episode it asked for, exactly once (indices
// 0..n-1, one row each under FINAL), with every step its episode row claims. Episodes
// cut by a kill -9 of gauntlet are re-run by the scheduler, so a cut is never an excuse.
//
// Env API episodes the API answered as over (their end or Close acknowledged) must be in
// ClickHouse once, with every acknowledged step (and at most the unacknowledged ones on
// top), each big action recorded cut with its gauntlet_truncated mark. Episodes cut by a
// kill of gauntlet have no end row by design and are only counted.
//
// A false infra error is an episode recorded (or a step answered) as an infra error
// when its infrastructure did not fail. The soak's only failures are its own kills: a
// kill -9 of gauntlet must be answered by a retry (built-in) or SERVER_RESTARTED (API),
// a kill -9 of ClickHouse must not reach episodes at all (the store waits and retries),
// and the built-in envs run no sandboxes that could fail. So every infra error counted
// here is false.
func account(runs []runLedger, recorded map[string]runRecorded, api []apiEpisode, apiRec map[string]apiRecorded) Accounting {
	var a Accounting
	problem := func(kind *int, format string, args ...any) {
		if *kind < maxProblems {
			a.Problems = append(a.Problems, fmt.Sprintf(format, args...))
		}
		*kind++
	}
	var nLost, nSteps, nInfra, nAPI int
	a.Runs = len(runs)
	for _, r := range runs {
		a.BuiltinEpisodes += r.Episodes
		got, ok := recorded[r.ID]
		if !ok {
			a.LostEpisodes += r.Episodes
			problem(&nLost, "run %s: none of its %d episodes in ClickHouse", r.ID, r.Episodes)
			continue
		}
		a.BuiltinRecorded += got.Episodes
		a.BuiltinSteps += got.DistinctSteps
		if got.Episodes < r.Episodes {
			a.LostEpisodes += r.Episodes - got.Episodes
			problem(&nLost, "run %s: %d of %d episodes in ClickHouse", r.ID, got.Episodes, r.Episodes)
		}
		if got.Episodes > r.Episodes || (got.Episodes > 0 && (got.MinIdx != 0 || got.MaxIdx >= r.Episodes)) {
			problem(&nLost, "run %s: %d episodes with indices %d..%d, want %d with 0..%d",
				r.ID, got.Episodes, got.MinIdx, got.MaxIdx, r.Episodes, r.Episodes-1)
		}
		switch {
		case got.DistinctSteps < got.ClaimedSteps:
			a.LostSteps += got.ClaimedSteps - got.DistinctSteps
			problem(&nSteps, "run %s: %d steps in ClickHouse, its episodes claim %d", r.ID, got.DistinctSteps, got.ClaimedSteps)
		case got.DistinctSteps > got.ClaimedSteps:
			a.ExtraSteps += got.DistinctSteps - got.ClaimedSteps
			problem(&nSteps, "run %s: %d steps in ClickHouse, its episodes claim only %d", r.ID, got.DistinctSteps, got.ClaimedSteps)
		}
		if got.InfraErrors > 0 {
			a.InfraErrors += got.InfraErrors
			a.FalseInfraErrors += got.InfraErrors
			problem(&nInfra, "run %s: %d episodes recorded as infra errors", r.ID, got.InfraErrors)
		}
	}
	a.APIEpisodes = len(api)
	for _, e := range api {
		a.APISteps += uint64(e.Acked)
		if e.InfraSeen > 0 {
			a.InfraErrors++
			a.FalseInfraErrors++
			problem(&nInfra, "env API episode %s: %d steps answered as infra errors", e.ID, e.InfraSeen)
		}
		got := apiRec[e.ID]
		if e.Forgotten {
			problem(&nAPI, "env API episode %s: answered NOT_FOUND while live", e.ID)
			continue
		}
		if e.Cut {
			a.APICut++
			continue
		}
		if e.Unclosed {
			a.APIUnclosed++
			problem(&nAPI, "env API episode %s: Close not answered within %s after the load", e.ID, closeBound)
			continue
		}
		if !e.Over {
			// Neither over nor cut: the harness stopped it mid-way without a Close answer.
			problem(&nAPI, "env API episode %s: neither closed nor cut (harness bug?)", e.ID)
			continue
		}
		a.APIOver++
		a.BigActions += uint64(e.Big)
		if got.EpisodeRows == 0 {
			a.LostEpisodes++
			a.LostSteps += uint64(e.Acked)
			problem(&nLost, "env API episode %s: over after %d steps, not in ClickHouse", e.ID, e.Acked)
			continue
		}
		a.APIOverRecorded++
		a.BigRecordedCut += min(got.CutArgs, uint64(e.Big))
		if got.CutArgs != uint64(e.Big) {
			problem(&nAPI, "env API episode %s: %d big actions, %d recorded cut", e.ID, e.Big, got.CutArgs)
		}
		if got.EpisodeRows > 1 {
			problem(&nAPI, "env API episode %s: %d episode rows under FINAL", e.ID, got.EpisodeRows)
		}
		switch {
		case got.Steps < uint64(e.Acked):
			a.LostSteps += uint64(e.Acked) - got.Steps
			problem(&nSteps, "env API episode %s: %d steps acknowledged, %d in ClickHouse", e.ID, e.Acked, got.Steps)
		case got.Steps > uint64(e.Acked)+uint64(e.Unacked):
			a.ExtraSteps += got.Steps - uint64(e.Acked) - uint64(e.Unacked)
			problem(&nSteps, "env API episode %s: %d steps acknowledged (+%d unanswered), %d in ClickHouse", e.ID, e.Acked, e.Unacked, got.Steps)
		}
		if got.InfraError && e.InfraSeen == 0 {
			a.InfraErrors++
			a.FalseInfraErrors++
			problem(&nInfra, "env API episode %s: recorded as an infra error", e.ID)
		}
	}
	return a
}

// rssSample is one reading of a process's resident memory.
type rssSample struct {
	At  time.Duration `json:"at_s"` // since the soak started
	RSS uint64        `json:"rss_bytes"`
}

// Memory is the verdict on one process's memory over the soak.
type Memory struct {
	Samples          int     `json:"samples"`
	FirstHalfMedian  uint64  `json:"first_half_median_bytes"`
	LastHalfMedian   uint64  `json:"last_half_median_bytes"`
	Peak             uint64  `json:"peak_bytes"`
	Growth           float64 `json:"growth"` // last half's median over the first half's, minus 1
	SlopeMBPerHour   float64 `json:"slope_mb_per_hour"`
	Flat             bool    `json:"flat"`
	FlatnessMeasured bool    `json:"flatness_measured"`
}

// memoryVerdict compares the medians of the first and the last half of the samples (by
// time) taken after warmup (the climb from an empty stack to its working set is not a
// leak): memory is flat when the last half's median is at most tolerance above the first
// half's. Medians, not means or the least-squares slope, decide, because each kill -9
// restarts the process at its start-up footprint: the slope is reported, but a sawtooth
// would make it say whatever the phase of the last kill says. Fewer than 4 samples measure
// nothing.
func memoryVerdict(all []rssSample, warmup time.Duration, tolerance float64) Memory {
	var m Memory
	var samples []rssSample
	for _, s := range all {
		m.Peak = max(m.Peak, s.RSS)
		if s.At >= warmup {
			samples = append(samples, s)
		}
	}
	m.Samples = len(samples)
	if len(samples) == 0 {
		return m
	}
	m.SlopeMBPerHour = slopeMBPerHour(samples)
	if len(samples) < 4 {
		return m
	}
	mid := samples[0].At + (samples[len(samples)-1].At-samples[0].At)/2
	var first, last []uint64
	for _, s := range samples {
		if s.At <= mid {
			first = append(first, s.RSS)
		} else {
			last = append(last, s.RSS)
		}
	}
	if len(first) == 0 || len(last) == 0 {
		return m
	}
	m.FirstHalfMedian, m.LastHalfMedian = median(first), median(last)
	m.Growth = float64(m.LastHalfMedian)/float64(m.FirstHalfMedian) - 1
	m.Flat = m.Growth <= tolerance
	m.FlatnessMeasured = true
	return m
}

// median is the middle value (the lower of the two middle ones for an even count).
func median(v []uint64) uint64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[(len(s)-1)/2]
}

// slopeMBPerHour is the least-squares slope of RSS over time.
func slopeMBPerHour(samples []rssSample) float64 {
	if len(samples) < 2 {
		return 0
	}
	var sx, sy, sxx, sxy float64
	n := float64(len(samples))
	for _, s := range samples {
		x, y := s.At.Hours(), float64(s.RSS)/(1<<20)
		sx += x
		sy += y
		sxx += x * x
		sxy += x * y
	}
	d := n*sxx - sx*sx
	if d == 0 || math.IsNaN(d) {
		return 0
	}
	return (n*sxy - sx*sy) / d
}

// pacer keeps big actions at their share of every action played: a trainer sends a big
// action when fewer than share of the actions so far were big, and another built-in run
// is submitted only while the big actions keep up (with one run's worth of slack), so the
// stack runs as fast as it can with the mix the soak asks for. A share of 0 sends no big
// actions and never holds runs back.
type pacer struct {
	share float64
}

// sendBig reports whether the next trainer action should be big, given the big actions
// and all actions (built-in and API) so far: when one more big action keeps them at most
// share of all.
func (p pacer) sendBig(big, total uint64) bool {
	return p.share > 0 && float64(big+1) <= p.share*float64(total+1)
}

// submitRun reports whether another built-in run may start, given the big actions so far
// and the actions committed: those played plus the expected steps of the runs in flight.
// Counting runs in flight at their size gives one run's worth of slack and no more.
func (p pacer) submitRun(big, committed uint64) bool {
	return p.share <= 0 || float64(big) >= p.share*float64(committed)
}
