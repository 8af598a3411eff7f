// Package fromlog turns real error logs into a gauntlet fault profile: nginx access
// and error logs, JSON logs, Go, Java and Python stack traces, and free-text lines such as
// "PaymentService timeout after 30s". It reports the fault kinds it found, their estimated
// rates and burstiness, and the entries it could not map.
//
// Entries: a log line opens an entry when it starts with a timestamp, an IP address (an
// access log), '{' (a JSON log) or "panic:". Other lines continue the entry before it as
// long as they have the shape of its continuation: a Java trace goes on with indented
// lines, "at ", "Caused by:", "... N more" and exception class names; a Python traceback
// ("Traceback (most recent call last):") with indented lines up to its exception line, and
// chained tracebacks. A line of another shape opens an entry of its own (a traceback
// printed without a timestamp after a Java trace is not part of it); an entry of no known
// shape (a Go panic, free text) takes every line up to the next start.
//
// Rates are estimated over the requests a finding's rule applies to: the request records
// (access-log lines and JSON entries with a status) of the services it was seen on, when the
// logs show requests of each of them; otherwise of every request, or per entry when no
// request was logged. A JSON entry's request belongs to the service that logged it, not
// to the upstream it names. Burstiness is the mean length of runs of consecutive entries of the same fault
// within a file (1: isolated events).
package fromlog

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/catalogue"
)

// Input is one log file.
type Input struct {
	Name string
	Data []byte
}

// Finding is one fault kind (and status, for HTTP errors) found in the logs.
type Finding struct {
	Kind   string
	Status int // http_error only
	// Count is how many entries showed it; Rate is Count per request of the rule's scope
	// (see the package doc): Over requests, or entries when Over counts entries.
	Count int
	Rate  float64
	Over  int
	// OverWhat says what Over counts: "requests to payment", "requests", "entries".
	OverWhat string
	// BurstLen is the mean run length of consecutive occurrences.
	BurstLen float64
	// Services it was seen on (sorted), when the logs named one.
	Services []string
	// Params are the parameters estimated from the evidence (retry_after_ms, hold_ms,
	// mean_ms, jitter_ms, offset_ms).
	Params map[string]float64
	// Examples are up to three "file:line" sources.
	Examples []string
	// AlsoMatched counts, per kind, the entries of this finding whose text another kind's
	// pattern matched too (the lower rank named the entry): evidence the profile does not
	// carry, reported rather than lost.
	AlsoMatched map[string]int
}

// ID is the fault id the profile gives the finding.
func (f Finding) ID() string {
	if f.Kind == catalogue.KindHTTPError {
		return "http-" + strconv.Itoa(f.Status)
	}
	return strings.ReplaceAll(f.Kind, "_", "-")
}

// Unmapped is an entry that looked like a problem but matched no fault.
type Unmapped struct {
	Source string // file:line
	Text   string // first line, trimmed to 160 bytes
}

// Result is what Analyze found.
type Result struct {
	Inputs   []string
	Lines    int
	Entries  int
	Requests int
	Findings []Finding
	Unmapped []Unmapped
}

type entry struct {
	file  string
	line  int
	lines []string
	shape shape
	// open: a Python traceback still awaiting its exception line; chained: the last line
	// announced a chained traceback.
	open, chained bool
}

// shape is the kind of multi-line entry, which decides what may continue it.
type shape int

const (
	shapeNone shape = iota
	shapeJava
	shapePython
)

// newEntry opens an entry at a line, with the shape the line gives it.
func newEntry(file string, n int, line string) entry {
	e := entry{file: file, line: n, lines: []string{line}}
	if tracebackRE.MatchString(line) {
		e.shape, e.open = shapePython, true
	} else if javaExcRE.MatchString(line) {
		e.shape = shapeJava
	}
	return e
}

// continues reports whether line (which opens no entry by itself) continues e, and
// updates e's shape state when it does.
func (e *entry) continues(line string) bool {
	blank := strings.TrimSpace(line) == ""
	switch e.shape {
	case shapeJava:
		return blank || javaContRE.MatchString(line) || javaExcRE.MatchString(line)
	case shapePython:
		switch {
		case tracebackRE.MatchString(line):
			if !e.open && !e.chained {
				return false // a traceback of its own
			}
			e.open, e.chained = true, false
		case blank:
		case e.open:
			if line[0] != ' ' && line[0] != '\t' {
				e.open = false // the exception line ends the traceback
			}
		case pyChainRE.MatchString(line):
			e.chained = true
		default:
			return false
		}
		return true
	}
	// An entry of no known shape yet: a header line takes what follows it, and the first
	// trace line sets the shape.
	switch {
	case tracebackRE.MatchString(line):
		e.shape, e.open = shapePython, true
	case javaExcRE.MatchString(line) || strings.HasPrefix(line, "Caused by: ") || strings.HasPrefix(strings.TrimLeft(line, " \t"), "at "):
		e.shape = shapeJava
	}
	return true
}

func (e entry) text() string { return strings.Join(e.lines, "\n") }

var (
	// The shapes of multi-line entries' continuations.
	tracebackRE = regexp.MustCompile(`^Traceback \(most recent call last\):`)
	pyChainRE   = regexp.MustCompile(`^(During handling of the above exception, another exception occurred:|The above exception was the direct cause of the following exception:)`)
	javaContRE  = regexp.MustCompile(`^(\s|at |Caused by: |Suppressed: |\.\.\. \d+ )`)
	javaExcRE   = regexp.MustCompile(`^(?:[a-z_$][\w$]*\.)+[A-Z][\w$]*(?:Exception|Error|Throwable)\b`)
	// retryAfterRE finds a Retry-After an access-log line carries in an extra field
	// (retry_after="3", retry-after: 3, retry_after_ms=3000).
	retryAfterRE = regexp.MustCompile(`(?i)\bretry[-_]?after(_ms|_s|_sec|_seconds)?"?[=:]\s*"?(\d+(?:\.\d+)?)`)
	startRE      = regexp.MustCompile(`^(\[?\d{4}[-/]\d{2}[-/]\d{2}|\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3} |[0-9a-fA-F:]+:[0-9a-fA-F:]* - |\{|panic: )`)
	accessRE     = regexp.MustCompile(`^(\S+) \S+ \S+ \[[^\]]+\] "(\S+) (\S+)[^"]*" (\d{3}) (?:\d+|-)(.*)$`)
	rtRE         = regexp.MustCompile(`(?:^| )(?:rt|request_time)=([0-9.]+)`)
	apiSvcRE     = regexp.MustCompile(`^/api/v\d+/([a-z]+)`)
	svcRE        = regexp.MustCompile(`\b([A-Z][a-z]+)Service\b`)
	hostRE       = regexp.MustCompile(`\b([a-z][a-z0-9-]*)\.internal\b`)
	severeRE     = regexp.MustCompile(`(?i)\b(error|crit|fatal|panic|exception|fail(ed|ure)?|warn(ing)?)\b|Traceback`)
)

// patterns are the catalogue's log patterns (catalogue.KindInfo.FromLog) in rank order:
// the first that matches an entry names its kind.
var patterns = func() []catalogue.KindInfo {
	var out []catalogue.KindInfo
	for _, k := range catalogue.Kinds() {
		if k.FromLog != nil {
			out = append(out, k)
		}
	}
	slices.SortStableFunc(out, func(a, b catalogue.KindInfo) int { return a.FromLog.Rank - b.FromLog.Rank })
	return out
}()

// Analyze reads every input and returns what it found.
func Analyze(inputs []Input) (*Result, error) {
	res := &Result{}
	acc := map[string]*acc{}
	var entries []entry
	for _, in := range inputs {
		res.Inputs = append(res.Inputs, in.Name)
		es, n, err := split(in)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", in.Name, err)
		}
		res.Lines += n
		entries = append(entries, es...)
	}
	res.Entries = len(entries)
	var okLatency []float64
	prev := map[string]string{} // file -> key of the previous entry's finding
	served := map[string]int{}  // service -> request records of its own
	for _, e := range entries {
		key, req, reqService := classify(e, acc, &okLatency)
		if req {
			res.Requests++
			if reqService != "" {
				served[reqService]++
			}
		}
		if key == "" {
			if first := e.lines[0]; severeRE.MatchString(e.text()) && !isBenign(e) {
				res.Unmapped = append(res.Unmapped, Unmapped{Source: fmt.Sprintf("%s:%d", e.file, e.line), Text: clip(first, 160)})
			}
		} else if prev[e.file] != key {
			acc[key].runs++
		}
		prev[e.file] = key
	}
	denom, over := res.Requests, "requests"
	if denom == 0 {
		denom, over = res.Entries, "entries"
	}
	for _, a := range acc {
		f := a.f
		f.Services = sortedKeys(a.services)
		f.Over, f.OverWhat = denom, over
		// The rule matches only these services: its rate is over their requests, when the
		// logs show requests of every one of them.
		if n := scopeRequests(f.Services, served); n > 0 {
			f.Over, f.OverWhat = n, "requests to "+strings.Join(f.Services, ", ")
		}
		f.Rate = math.Min(1, round4(float64(f.Count)/float64(max(1, f.Over))))
		f.BurstLen = round2(float64(f.Count) / float64(max(1, a.runs)))
		f.Params = a.params()
		res.Findings = append(res.Findings, f)
	}
	// Latency of successful requests, when the logs carry it, is the baseline latency.
	if len(okLatency) > 1 {
		m, sd := meanSD(okLatency)
		res.Findings = append(res.Findings, Finding{Kind: catalogue.KindLatency, Count: len(okLatency), Rate: 1, BurstLen: 0,
			Params: map[string]float64{"mean_ms": round1(m), "jitter_ms": round1(sd)}, Examples: []string{"successful requests"}})
	}
	order := map[string]int{}
	for i, k := range catalogue.KindNames() {
		order[k] = i
	}
	sort.Slice(res.Findings, func(i, j int) bool {
		a, b := res.Findings[i], res.Findings[j]
		if a.Kind != b.Kind {
			return order[a.Kind] < order[b.Kind]
		}
		if a.Status != b.Status {
			return a.Status < b.Status
		}
		return a.Count > b.Count
	})
	// Two latency findings (slow responses and the baseline) need distinct ids.
	return res, nil
}

// scopeRequests is the number of request records served by services, or 0 when services
// is empty or one of them served none in the logs (its requests were not logged).
func scopeRequests(services []string, served map[string]int) int {
	n := 0
	for _, s := range services {
		if served[s] == 0 {
			return 0
		}
		n += served[s]
	}
	return n
}

// isBenign reports entries that mention a severity word but are routine (a JSON info
// line, an nginx notice).
func isBenign(e entry) bool {
	t := e.lines[0]
	return strings.Contains(t, `"level": "info"`) || strings.Contains(t, `"level":"info"`) || strings.Contains(t, "[notice]") || strings.Contains(t, " INFO ")
}

// split reads an input into entries.
func split(in Input) ([]entry, int, error) {
	var out []entry
	sc := bufio.NewScanner(bytes.NewReader(in.Data))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimRight(sc.Text(), "\r")
		if strings.TrimSpace(line) == "" && len(out) == 0 {
			continue
		}
		if startRE.MatchString(line) || len(out) == 0 || !out[len(out)-1].continues(line) {
			out = append(out, newEntry(in.Name, n, line))
			continue
		}
		last := &out[len(out)-1]
		last.lines = append(last.lines, line)
	}
	if err := sc.Err(); err != nil {
		return nil, n, err
	}
	return out, n, nil
}

type acc struct {
	f        Finding
	runs     int
	services map[string]bool
	samples  map[string][]float64
}

func (a *acc) params() map[string]float64 {
	out := map[string]float64{}
	for name, xs := range a.samples {
		switch name {
		case "latency_ms":
			m, sd := meanSD(xs)
			out["mean_ms"], out["jitter_ms"] = round1(m), round1(sd)
		default:
			out[name] = median(xs)
		}
	}
	return out
}

// classify records an entry's fault (if any) and reports its finding key, whether it is a
// request record and, if so, the service that served it (when the entry says).
func classify(e entry, accs map[string]*acc, okLatency *[]float64) (string, bool, string) {
	first := e.lines[0]
	text := e.text()
	status, service, isReq, reqService := 0, "", false, ""
	samples := map[string]float64{}
	if m := accessRE.FindStringSubmatch(first); m != nil {
		isReq = true
		status, _ = strconv.Atoi(m[4])
		if s := apiSvcRE.FindStringSubmatch(m[3]); s != nil {
			service = strings.TrimSuffix(s[1], "s")
			reqService = service
		}
		if ra := retryAfterRE.FindStringSubmatch(m[5]); ra != nil {
			samples["retry_after_ms"] = retryAfterMs(ra[1], ra[2])
		}
		if rt := rtRE.FindStringSubmatch(m[5]); rt != nil {
			v, _ := strconv.ParseFloat(rt[1], 64)
			if status < 400 {
				*okLatency = append(*okLatency, v*1000)
			} else if status == 499 {
				samples["hold_ms"] = math.Round(v * 1000)
			}
		}
		text = "" // the access line's own text says nothing beyond its status
	} else if strings.HasPrefix(first, "{") {
		var j map[string]any
		if json.Unmarshal([]byte(first), &j) == nil {
			if s, ok := j["status"].(float64); ok {
				isReq, status = true, int(s)
				reqService, _ = j["service"].(string)
			}
			if up, ok := j["upstream"].(string); ok {
				service = up
			} else if sv, ok := j["service"].(string); ok && status >= 400 {
				service = sv
			}
			if l, ok := j["latency_ms"].(float64); ok && status > 0 && status < 400 {
				*okLatency = append(*okLatency, l)
			}
			if ms, ok := jsonRetryAfterMs(j); ok {
				samples["retry_after_ms"] = ms
			}
			text = ""
			for _, k := range []string{"error", "msg"} {
				if s, ok := j[k].(string); ok {
					text += s + "\n"
				}
			}
			if status < 400 {
				status = 0
			}
		}
	}
	if service == "" {
		if m := svcRE.FindStringSubmatch(text); m != nil {
			service = strings.ToLower(m[1])
		} else if m := hostRE.FindStringSubmatch(text); m != nil {
			service = m[1]
		}
	}
	var k *catalogue.KindInfo
	var also []string // other kinds whose patterns the entry's text matched
	switch {
	case status == 499:
		k = kindOf(catalogue.KindTimeout) // the client gave up waiting
	case status >= 400:
		k = kindOf(catalogue.KindHTTPError)
	default:
		for i := range patterns {
			if !patterns[i].FromLog.Match.MatchString(text) {
				continue
			}
			if k == nil {
				k = &patterns[i]
			} else if patterns[i].Name != k.Name && !slices.Contains(also, patterns[i].Name) {
				also = append(also, patterns[i].Name)
			}
		}
	}
	if k == nil {
		return "", isReq, reqService
	}
	kind := k.Name
	if k.FromLog != nil && k.FromLog.Params != nil {
		k.FromLog.Params(text, samples)
	}
	if kind == catalogue.KindHTTPError {
		if status == 0 {
			status = int(samples["status"])
		}
		delete(samples, "status") // the finding's Status, not a sampled parameter
	}
	key := kind
	if kind == catalogue.KindHTTPError {
		key += "/" + strconv.Itoa(status)
	}
	a := accs[key]
	if a == nil {
		a = &acc{f: Finding{Kind: kind, Status: status}, services: map[string]bool{}, samples: map[string][]float64{}}
		accs[key] = a
	}
	a.f.Count++
	for _, o := range also {
		if a.f.AlsoMatched == nil {
			a.f.AlsoMatched = map[string]int{}
		}
		a.f.AlsoMatched[o]++
	}
	if service != "" {
		a.services[service] = true
	}
	for k, v := range samples {
		a.samples[k] = append(a.samples[k], v)
	}
	if len(a.f.Examples) < 3 {
		a.f.Examples = append(a.f.Examples, fmt.Sprintf("%s:%d", e.file, e.line))
	}
	return key, isReq, reqService
}

// retryAfterMs converts a Retry-After the logs state (seconds unless the field's suffix
// says milliseconds) to milliseconds.
func retryAfterMs(suffix, value string) float64 {
	v, _ := strconv.ParseFloat(value, 64)
	if strings.EqualFold(suffix, "_ms") {
		return v
	}
	return v * 1000
}

// jsonRetryAfterMs finds a Retry-After in a JSON entry: a field retry_after,
// retry_after_s, retry_after_ms, retryAfter or Retry-After (any case), a number or a
// numeric string, at the top level or in a headers object.
func jsonRetryAfterMs(j map[string]any) (float64, bool) {
	look := func(m map[string]any) (float64, bool) {
		for k, v := range m {
			key := strings.ReplaceAll(strings.ToLower(k), "-", "_")
			suffix, ok := strings.CutPrefix(key, "retry_after")
			if !ok {
				suffix, ok = strings.CutPrefix(key, "retryafter")
			}
			switch suffix = strings.TrimPrefix(suffix, "_"); {
			case !ok:
				continue
			case suffix == "ms":
				suffix = "_ms"
			case suffix == "" || suffix == "s" || suffix == "sec" || suffix == "seconds":
				suffix = ""
			default:
				continue // retry_after_count and the like: not a duration
			}
			var s string
			switch v := v.(type) {
			case float64:
				s = strconv.FormatFloat(v, 'f', -1, 64)
			case string:
				s = strings.TrimSpace(v)
			default:
				continue
			}
			if _, err := strconv.ParseFloat(s, 64); err != nil {
				continue
			}
			return retryAfterMs(suffix, s), true
		}
		return 0, false
	}
	if ms, ok := look(j); ok {
		return ms, true
	}
	for _, k := range []string{"headers", "response_headers", "resp_headers"} {
		if h, ok := j[k].(map[string]any); ok {
			if ms, ok := look(h); ok {
				return ms, true
			}
		}
	}
	return 0, false
}

// kindOf returns the catalogue's row of a kind the access logs name by status.
func kindOf(name string) *catalogue.KindInfo {
	if i := slices.IndexFunc(patterns, func(k catalogue.KindInfo) bool { return k.Name == name }); i >= 0 {
		return &patterns[i]
	}
	k, _ := catalogue.LookupKind(name) // a row without a log pattern
	return &k
}

// WriteProfile writes the result as a fault profile (YAML, accepted by
// plans.ParseSpec) named name, preceded by a comment block reporting the evidence and
// every unmapped entry.
func (r *Result) WriteProfile(w io.Writer, name string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "# gauntlet faults from-log: %d file(s), %d lines, %d entries, %d requests\n", len(r.Inputs), r.Lines, r.Entries, r.Requests)
	fmt.Fprintf(&b, "# rates are over the requests to the rule's services when the logs show them, else over every request (every entry when no request was logged); burst = mean run of consecutive entries\n")
	if len(r.Unmapped) == 0 {
		b.WriteString("# unmapped: none\n")
	} else {
		fmt.Fprintf(&b, "# unmapped (%d entries that look like problems but match no fault):\n", len(r.Unmapped))
		for _, u := range r.Unmapped {
			fmt.Fprintf(&b, "#   %s: %s\n", u.Source, u.Text)
		}
	}
	fmt.Fprintf(&b, "name: %s\n", name)
	fmt.Fprintf(&b, "description: %s\n", strconv.Quote("derived from "+strings.Join(r.Inputs, ", ")))
	if len(r.Findings) == 0 {
		b.WriteString("faults: []\n")
	} else {
		b.WriteString("faults:\n")
	}
	ids := map[string]int{}
	for _, f := range r.Findings {
		id := f.ID()
		if n := ids[id]; n > 0 {
			id += "-" + strconv.Itoa(n+1)
		}
		ids[f.ID()]++
		rate := fmtF(f.Rate)
		if f.Over > 0 {
			rate += fmt.Sprintf(" (%d of %d %s)", f.Count, f.Over, f.OverWhat)
		}
		fmt.Fprintf(&b, "  # %d seen, rate %s, burst %s; e.g. %s\n", f.Count, rate, fmtF(f.BurstLen), strings.Join(f.Examples, ", "))
		params, dropped := profileParams(f)
		for _, d := range dropped {
			fmt.Fprintf(&b, "  #   not kept: %s\n", d)
		}
		if len(f.AlsoMatched) > 0 {
			var parts []string
			for _, k := range sortedKeys(f.AlsoMatched) {
				parts = append(parts, fmt.Sprintf("%s (%d %s)", k, f.AlsoMatched[k], plural(f.AlsoMatched[k], "entry", "entries")))
			}
			fmt.Fprintf(&b, "  #   also matched: %s\n", strings.Join(parts, ", "))
		}
		fmt.Fprintf(&b, "  - id: %s\n    kind: %s\n    probability: %s\n", id, f.Kind, fmtF(f.Rate))
		if len(f.Services) > 0 {
			fmt.Fprintf(&b, "    match: {services: [%s]}\n", strings.Join(f.Services, ", "))
		}
		if len(params) > 0 {
			keys := sortedKeys(params)
			parts := make([]string, len(keys))
			for i, k := range keys {
				parts[i] = k + ": " + fmtF(params[k])
			}
			fmt.Fprintf(&b, "    params: {%s}\n", strings.Join(parts, ", "))
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// profileParams keeps the parameters the kind takes, with whole numbers where the kind
// wants them, and says why it dropped any other the logs stated (sorted).
func profileParams(f Finding) (map[string]float64, []string) {
	k, _ := catalogue.LookupKind(f.Kind)
	out := map[string]float64{}
	if f.Kind == catalogue.KindHTTPError {
		out["status"] = float64(f.Status)
	}
	var dropped []string
	for _, name := range sortedKeys(f.Params) {
		v := f.Params[name]
		p, ok := k.Param(name)
		if !ok {
			dropped = append(dropped, fmt.Sprintf("%s %s: %s takes no such parameter", name, fmtF(v), f.Kind))
			continue
		}
		if p.Integer {
			v = math.Round(v)
		}
		if err := p.Check(v); err != nil {
			dropped = append(dropped, fmt.Sprintf("%s %s: %v", name, fmtF(v), err))
			continue
		}
		out[name] = v
	}
	return out, dropped
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func meanSD(xs []float64) (float64, float64) {
	var m float64
	for _, x := range xs {
		m += x
	}
	m /= float64(len(xs))
	var v float64
	for _, x := range xs {
		v += (x - m) * (x - m)
	}
	if len(xs) > 1 {
		v /= float64(len(xs) - 1)
	}
	return m, math.Sqrt(v)
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func round1(x float64) float64 { return math.Round(x*10) / 10 }
func round2(x float64) float64 { return math.Round(x*100) / 100 }
func round4(x float64) float64 { return math.Round(x*1e4) / 1e4 }

func fmtF(x float64) string { return strconv.FormatFloat(x, 'f', -1, 64) }

func clip(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
