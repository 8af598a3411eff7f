package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// summary is what the demo's closing line says about its run.
type summary struct {
	Episodes uint64 `json:"episodes"`
	Steps    uint64 `json:"steps"`
	// RunSeconds is from submitting the run until the scheduler saw every episode end.
	RunSeconds float64 `json:"run_seconds"`
	// PersistedSeconds is from submitting the run until ClickHouse held every episode
	// and every step of it.
	PersistedSeconds float64 `json:"persisted_seconds"`
}

// summaryLine matches the line runAndReport (cmd/gauntlet/run.go) prints once the run
// is in ClickHouse:
//
//	100000 episodes, 1012345 steps in 61.2s (1634 episodes/s, 16541 steps/s); all in ClickHouse after 62.0s
var summaryLine = regexp.MustCompile(`(\d+) episodes, (\d+) steps in ([0-9.]+)s \([0-9.]+ episodes/s, [0-9.]+ steps/s\); all in ClickHouse after ([0-9.]+)s`)

// errNoSummary means the demo's output has no summary line: the run did not finish.
var errNoSummary = errors.New("no summary line (\"N episodes, S steps in Xs (...); all in ClickHouse after Ys\") in the demo's output")

// parseSummary finds the demo's summary line in its standard output; the last one wins.
func parseSummary(out []byte) (summary, error) {
	all := summaryLine.FindAllSubmatch(out, -1)
	if len(all) == 0 {
		return summary{}, errNoSummary
	}
	m := all[len(all)-1]
	var s summary
	var err error
	if s.Episodes, err = strconv.ParseUint(string(m[1]), 10, 64); err != nil {
		return summary{}, fmt.Errorf("summary line: episodes: %w", err)
	}
	if s.Steps, err = strconv.ParseUint(string(m[2]), 10, 64); err != nil {
		return summary{}, fmt.Errorf("summary line: steps: %w", err)
	}
	if s.RunSeconds, err = strconv.ParseFloat(string(m[3]), 64); err != nil {
		return summary{}, fmt.Errorf("summary line: run seconds: %w", err)
	}
	if s.PersistedSeconds, err = strconv.ParseFloat(string(m[4]), 64); err != nil {
		return summary{}, fmt.Errorf("summary line: persisted seconds: %w", err)
	}
	if s.PersistedSeconds <= 0 {
		return summary{}, fmt.Errorf("summary line: persisted after %vs is not a duration", s.PersistedSeconds)
	}
	return s, nil
}

// PersistedStepsPerSec is the pipeline's end-to-end rate: steps in ClickHouse per second
// of the run.
func (s summary) PersistedStepsPerSec() float64 { return float64(s.Steps) / s.PersistedSeconds }

// parseStatusKB returns a "Key:   123 kB" field of /proc/<pid>/status, in kB.
func parseStatusKB(status []byte, key string) (int64, error) {
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || name != key {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("/proc status: %s: unexpected value %q", key, rest)
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc status: %s: %w", key, err)
		}
		return n, nil
	}
	return 0, fmt.Errorf("/proc status: no %s line", key)
}

// loadAvg is /proc/loadavg's three averages.
type loadAvg struct {
	One     float64 `json:"1m"`
	Five    float64 `json:"5m"`
	Fifteen float64 `json:"15m"`
}

func (l loadAvg) String() string { return fmt.Sprintf("%.2f %.2f %.2f", l.One, l.Five, l.Fifteen) }

// parseLoadAvg parses the content of /proc/loadavg ("0.52 0.58 0.59 1/467 12345").
func parseLoadAvg(b []byte) (loadAvg, error) {
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return loadAvg{}, fmt.Errorf("/proc/loadavg: %q has fewer than 3 fields", b)
	}
	var l loadAvg
	for i, p := range []*float64{&l.One, &l.Five, &l.Fifteen} {
		v, err := strconv.ParseFloat(f[i], 64)
		if err != nil {
			return loadAvg{}, fmt.Errorf("/proc/loadavg: field %d: %w", i+1, err)
		}
		*p = v
	}
	return l, nil
}

// parseProcStatTicks returns utime+stime (clock ticks) from /proc/<pid>/stat. The
// command name (field 2) may hold spaces and parentheses, so fields are counted after
// the last ')'.
func parseProcStatTicks(b []byte) (uint64, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("/proc stat: no ')' after the command name")
	}
	f := strings.Fields(string(b[i+1:]))
	// After ')': state(3) ppid(4) ... utime is field 14, stime field 15 (1-based).
	const utime, stime = 14 - 3, 15 - 3
	if len(f) <= stime {
		return 0, fmt.Errorf("/proc stat: %d fields after the command name, want more than %d", len(f), stime)
	}
	u, err := strconv.ParseUint(f[utime], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("/proc stat: utime: %w", err)
	}
	s, err := strconv.ParseUint(f[stime], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("/proc stat: stime: %w", err)
	}
	return u + s, nil
}

// cpuTicks is the machine's aggregate CPU time from /proc/stat's "cpu" line.
type cpuTicks struct{ Busy, Idle uint64 }

// parseCPUTicks parses /proc/stat's aggregate line: busy is user+nice+system+irq+softirq+
// steal, idle is idle+iowait (guest time is already inside user).
func parseCPUTicks(b []byte) (cpuTicks, error) {
	line, _, _ := bytes.Cut(b, []byte{'\n'})
	f := strings.Fields(string(line))
	if len(f) < 9 || f[0] != "cpu" {
		return cpuTicks{}, fmt.Errorf("/proc/stat: unexpected first line %q", line)
	}
	var v [8]uint64
	for i := range v {
		n, err := strconv.ParseUint(f[i+1], 10, 64)
		if err != nil {
			return cpuTicks{}, fmt.Errorf("/proc/stat: field %d: %w", i+1, err)
		}
		v[i] = n
	}
	// user nice system idle iowait irq softirq steal
	return cpuTicks{Busy: v[0] + v[1] + v[2] + v[5] + v[6] + v[7], Idle: v[3] + v[4]}, nil
}

// median of xs (the mean of the middle two for an even count); 0 for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// rssSample is one reading of the child's (and ClickHouse's) resident memory.
type rssSample struct {
	Seconds float64 `json:"t_s"`
	RSSKB   int64   `json:"rss_kb"`
	// CHRSSKB is the ClickHouse server's resident memory at the same moment (0 if unread).
	CHRSSKB int64 `json:"clickhouse_rss_kb,omitempty"`
}

// rssAt returns, for each fraction of the series' time span (0 < f <= 1), the last
// sample taken at or before f of the span. An empty series gives zeros.
func rssAt(series []rssSample, fractions []float64) []rssSample {
	out := make([]rssSample, len(fractions))
	if len(series) == 0 {
		return out
	}
	end := series[len(series)-1].Seconds
	for i, f := range fractions {
		at := f * end
		j := sort.Search(len(series), func(k int) bool { return series[k].Seconds > at+1e-9 })
		if j == 0 {
			j = 1
		}
		out[i] = series[j-1]
	}
	return out
}

// peakRSS returns the largest RSSKB of the series.
func peakRSS(series []rssSample) int64 {
	var p int64
	for _, s := range series {
		p = max(p, s.RSSKB)
	}
	return p
}
