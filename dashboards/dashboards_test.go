package dashboards

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/gauntlet-rl/gauntlet/pkg/chlocal/chtest"
	"github.com/gauntlet-rl/gauntlet/pkg/trajectory"
)

// dashboard is the part of a dashboard's JSON the test reads.
type dashboard struct {
	Templating struct {
		List []variable `json:"list"`
	} `json:"templating"`
	Panels []panel `json:"panels"`
}

type variable struct {
	Name       string     `json:"name"`
	Type       string     `json:"type"`
	Query      any        `json:"query"` // a string for query variables
	Datasource datasource `json:"datasource"`
	Multi      bool       `json:"multi"`
	IncludeAll bool       `json:"includeAll"`
}

type datasource struct {
	Type string `json:"type"`
}

type panel struct {
	Title      string     `json:"title"`
	Datasource datasource `json:"datasource"`
	Targets    []struct {
		RawSQL     string     `json:"rawSql"`
		Datasource datasource `json:"datasource"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // a collapsed row's
}

const clickhouseType = "grafana-clickhouse-datasource"

// query is one SQL text of a dashboard: a panel's target or a query variable.
type query struct{ where, sql string }

func (d dashboard) queries() []query {
	var out []query
	var walk func(ps []panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			for i, t := range p.Targets {
				if t.Datasource.Type == clickhouseType || (t.Datasource.Type == "" && p.Datasource.Type == clickhouseType) {
					out = append(out, query{fmt.Sprintf("panel %q target %d", p.Title, i), t.RawSQL})
				}
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if s, ok := v.Query.(string); ok && v.Type == "query" && v.Datasource.Type == clickhouseType {
			out = append(out, query{fmt.Sprintf("variable %q", v.Name), s})
		}
	}
	return out
}

// all is the value Grafana gives a variable whose "All" is selected.
const all = "$__all"

// expand returns sql as Grafana and the ClickHouse data source (version 4) send it to
// ClickHouse for the variables' values vars and the time range [from, to]:
//  1. $__conditionalAll(condition, $v) becomes condition, or 1=1 when v is All or
//     empty (the plugin does this in the browser, before interpolation);
//  2. Grafana interpolates the variables: ${v:singlequote} is each value quoted
//     ('it\'s') and joined with commas; ${v} and $v a single value as it is;
//  3. the plugin's backend expands its macros: $__timeFilter(c), $__fromTime,
//     $__toTime.
//
// Anything else that looks like a variable or a macro is an error, so a dashboard
// cannot use one the test does not expand.
func expand(sql string, vars map[string][]string, from, to time.Time) (string, error) {
	const cond = "$__conditionalAll("
	for i := strings.LastIndex(sql, cond); i >= 0; i = strings.LastIndex(sql, cond) {
		args, end, err := macroArgs(sql, i+len(cond)-1)
		if err != nil || len(args) != 2 {
			return "", fmt.Errorf("$__conditionalAll at %d: want 2 arguments (%v)", i, err)
		}
		name := strings.TrimPrefix(strings.TrimSpace(args[1]), "$")
		vals, ok := vars[name]
		if !ok {
			return "", fmt.Errorf("$__conditionalAll names variable %q, which has no value", name)
		}
		phrase := args[0]
		if len(vals) == 0 || (len(vals) == 1 && (vals[0] == all || vals[0] == "")) {
			phrase = "1=1"
		}
		sql = sql[:i] + phrase + sql[end+1:]
	}
	var errs []string
	sql = varRE.ReplaceAllStringFunc(sql, func(m string) string {
		sub := varRE.FindStringSubmatch(m)
		name, format := sub[1]+sub[3], sub[2]
		vals, ok := vars[name]
		switch {
		case !ok:
			errs = append(errs, fmt.Sprintf("variable %s has no value", m))
			return m
		case format == "singlequote":
			q := make([]string, len(vals))
			for i, v := range vals {
				q[i] = "'" + strings.ReplaceAll(v, "'", `\'`) + "'"
			}
			return strings.Join(q, ",")
		case format != "":
			errs = append(errs, fmt.Sprintf("%s: format %q is not expanded by this test", m, format))
			return m
		case len(vals) != 1 || vals[0] == all:
			errs = append(errs, fmt.Sprintf("%s: several values (or All) interpolated raw", m))
			return m
		}
		return vals[0]
	})
	if len(errs) > 0 {
		return "", fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	at := func(t time.Time) string { return "toDateTime(" + strconv.FormatInt(t.Unix(), 10) + ")" }
	const tf = "$__timeFilter("
	for i := strings.Index(sql, tf); i >= 0; i = strings.Index(sql, tf) {
		args, end, err := macroArgs(sql, i+len(tf)-1)
		if err != nil || len(args) != 1 {
			return "", fmt.Errorf("$__timeFilter at %d: want 1 argument (%v)", i, err)
		}
		c := strings.TrimSpace(args[0])
		sql = sql[:i] + fmt.Sprintf("%s >= %s AND %s <= %s", c, at(from), c, at(to)) + sql[end+1:]
	}
	sql = strings.NewReplacer("$__fromTime", at(from), "$__toTime", at(to)).Replace(sql)
	if m := regexp.MustCompile(`\$\w+`).FindString(sql); m != "" {
		return "", fmt.Errorf("%s is left unexpanded", m)
	}
	return sql, nil
}

// varRE matches ${name}, ${name:format} and $name (not a macro, $__...).
var varRE = regexp.MustCompile(`\$\{(\w+)(?::(\w+))?\}|\$([A-Za-z]\w*)`)

// macroArgs returns the arguments of the macro call whose "(" is at open, split on the
// commas outside parentheses and quotes, and the index of its ")".
func macroArgs(s string, open int) ([]string, int, error) {
	depth, quote, start := 0, byte(0), open+1
	var args []string
	for i := open; i < len(s); i++ {
		c := s[i]
		switch {
		case quote != 0:
			if c == '\\' {
				i++
			} else if c == quote {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
		case c == '(':
			depth++
		case c == ')':
			depth--
			if depth == 0 {
				return append(args, s[start:i]), i, nil
			}
		case c == ',' && depth == 1:
			args = append(args, s[start:i])
			start = i + 1
		}
	}
	return nil, 0, fmt.Errorf("no closing parenthesis")
}

func TestExpand(t *testing.T) {
	from, to := time.Unix(100, 0), time.Unix(200, 0)
	vars := map[string][]string{"run": {"r1", "it's"}, "cur": {all}, "one": {"c-1"}}
	for _, c := range []struct{ in, want string }{
		{"WHERE $__conditionalAll(run_id IN (${run:singlequote}), $run) AND x", `WHERE run_id IN ('r1','it\'s') AND x`},
		{"$__conditionalAll(f(a, b) = '${one}', $cur)", "1=1"},
		{"$__conditionalAll(f(a, ',') = '${one}', $one)", "f(a, ',') = 'c-1'"},
		{"$__timeFilter(ended_at) AND $one", "ended_at >= toDateTime(100) AND ended_at <= toDateTime(200) AND c-1"},
	} {
		got, err := expand(c.in, vars, from, to)
		if err != nil || got != c.want {
			t.Errorf("expand(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{"$nope", "${run}", "${run:csv}", "$__timeInterval(t)", "$__conditionalAll(x, $nope)"} {
		if got, err := expand(bad, vars, from, to); err == nil {
			t.Errorf("expand(%q) = %q, want an error", bad, got)
		}
	}
}

// fixture is what the test inserts: a curriculum "cur-1" of three batches (two stages,
// one closed) and a run outside it, with faults and drift, all ended an hour ago.
const (
	fixtureCurriculum        = "cur-1"
	fixtureCurriculumEpisode = 5 // episodes of cur-1's batches
)

func insertFixture(t *testing.T, conn driver.Conn, db string, at time.Time) {
	t.Helper()
	ctx := context.Background()
	exec := func(q string, rows ...[]any) {
		t.Helper()
		b, err := conn.PrepareBatch(ctx, strings.ReplaceAll(q, "{db}", db))
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			if err := b.Append(r...); err != nil {
				t.Fatal(err)
			}
		}
		if err := b.Send(); err != nil {
			t.Fatal(err)
		}
	}
	exec("INSERT INTO {db}.runs (run_id, curriculum_id, curriculum_name, stage, stage_name, batch, state, submitted_at, submitted_at_ns, finished_at, ended, succeeded, reward_sum, version)",
		[]any{"c-s0-b0", fixtureCurriculum, "demo", uint32(0), "calm", uint32(0), "done", at, uint64(at.UnixNano()), at, uint64(2), uint64(2), 2.0, uint64(1)},
		[]any{"c-s0-b1", fixtureCurriculum, "demo", uint32(0), "calm", uint32(1), "done", at, uint64(at.UnixNano()) + 1, at, uint64(1), uint64(1), 1.0, uint64(1)},
		[]any{"c-s1-b0", fixtureCurriculum, "demo", uint32(1), "storm", uint32(0), "done", at, uint64(at.UnixNano()) + 2, at, uint64(2), uint64(0), -1.0, uint64(1)},
		[]any{"solo", "", "", uint32(0), "", uint32(0), "done", at, uint64(at.UnixNano()), at, uint64(1), uint64(1), 1.0, uint64(1)})
	ep := func(run, id, policy, profile string, ok uint8, sels []string, vals []float64) []any {
		return []any{run, id, policy, profile, at, at, at, ok, float64(ok), uint32(3), sels, vals, uint64(1)}
	}
	lat := []string{"*.latency.mean_ms"}
	exec("INSERT INTO {db}.episodes (run_id, episode_id, policy, profile, requested_at, started_at, ended_at, success, total_reward, steps, drift_selectors, drift_values, version)",
		ep("c-s0-b0", "e1", "oracle", "baseline", 1, nil, nil), ep("c-s0-b0", "e2", "oracle", "baseline", 1, nil, nil),
		ep("c-s0-b1", "e3", "oracle", "baseline", 1, nil, nil),
		ep("c-s1-b0", "e4", "random", "stress", 0, lat, []float64{100}), ep("c-s1-b0", "e5", "random", "stress", 0, lat, []float64{300}),
		ep("solo", "e6", "oracle", "stress", 1, nil, nil))
	exec("INSERT INTO {db}.faults (run_id, episode_id, step, seq, requested_at, profile, kind, target, version)",
		[]any{"c-s1-b0", "e4", uint32(0), uint16(0), at, "stress", "latency", "catalog/catalog.search", uint64(1)},
		[]any{"solo", "e6", uint32(1), uint16(0), at, "stress", "http_error", "payment/payment.charge", uint64(1)})
	exec("INSERT INTO {db}.curriculum_stages (curriculum_id, curriculum_name, curriculum_prefix, stage, stage_name, outcome, metric, threshold, window_value, episodes, succeeded, batches, closed_at, version)",
		[]any{fixtureCurriculum, "demo", "c", uint32(0), "calm", "promoted", "success_rate", 0.8, 1.0, uint64(3), uint64(3), uint32(2), at, uint64(1)})
}

// TestDashboardsRunOnTheSchema runs every ClickHouse query of every dashboard (panels
// and variables) on a real ClickHouse migrated to the current schema, for the
// variables' values a user picks: everything, a subset of policies, profiles and runs
// (one with a quote in its id), and one curriculum. A query that names a column, a table
// or a function the server does not know fails here. Where a curriculum is picked, the
// Episodes panels count its batches' episodes, so the filter is known to filter.
func TestDashboardsRunOnTheSchema(t *testing.T) {
	if testing.Short() {
		t.Skip("starts ClickHouse; -short runs unit tests only")
	}
	files, err := filepath.Glob("*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no dashboards: %v", err)
	}
	ctx := context.Background()
	srv := chtest.Start(t)
	const db = "gauntlet" // the dashboards name it
	conn, err := trajectory.Connect(ctx, srv.Addr(), db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := trajectory.Migrate(ctx, conn, db); err != nil {
		t.Fatal(err)
	}
	now := time.Now().Truncate(time.Second)
	insertFixture(t, conn, db, now.Add(-time.Hour))
	from, to := now.Add(-6*time.Hour), now

	cases := []struct {
		name string
		vars map[string][]string
	}{
		{"all", map[string][]string{"policy": {all}, "profile": {all}, "run": {all}, "curriculum": {all}}},
		{"subset", map[string][]string{"policy": {"oracle", "random"}, "profile": {"stress"}, "run": {"c-s1-b0", "it's"}, "curriculum": {all}}},
		{"one curriculum", map[string][]string{"policy": {all}, "profile": {all}, "run": {all}, "curriculum": {fixtureCurriculum}}},
	}
	checked := 0
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var d dashboard
		if err := json.Unmarshal(data, &d); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		singleCurriculum := false
		for _, v := range d.Templating.List {
			if v.Name == "curriculum" && !v.IncludeAll {
				singleCurriculum = true
			}
		}
		for _, c := range cases {
			if singleCurriculum && c.vars["curriculum"][0] == all {
				continue // the dashboard has no All for it
			}
			for _, q := range d.queries() {
				sql, err := expand(q.sql, c.vars, from, to)
				if err != nil {
					t.Errorf("%s, %s (%s): expand: %v", f, q.where, c.name, err)
					continue
				}
				_, rows, err := trajectory.Query(ctx, conn, sql)
				if err != nil {
					t.Errorf("%s, %s (%s): %v\n%s", f, q.where, c.name, err, sql)
					continue
				}
				checked++
				if c.name == "one curriculum" && strings.HasPrefix(q.where, `panel "Episodes"`) {
					if len(rows) != 1 || rows[0][0] != strconv.Itoa(fixtureCurriculumEpisode) {
						t.Errorf("%s, %s for %s: %v, want %d episodes", f, q.where, fixtureCurriculum, rows, fixtureCurriculumEpisode)
					}
				}
			}
		}
	}
	if checked < 40 {
		t.Errorf("%d queries ran; the dashboards hold more", checked)
	}
	t.Logf("%d queries ran on ClickHouse", checked)
}
