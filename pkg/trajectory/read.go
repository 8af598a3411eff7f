package trajectory

import (
	"context"
	"errors"
	"fmt"
	"math"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
	"github.com/gauntlet-rl/gauntlet/pkg/scoring"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// Connection settings. Compression is off: LZ4 works on 18.16 but brought no gain on
// loopback in BenchmarkWriteSteps; turn it on for a remote server.
const (
	dialTimeout = 5 * time.Second
	// readTimeout bounds each wait for the server, including the wait for a large
	// batch to be written or a FINAL query to produce its first block.
	readTimeout = 2 * time.Minute
	// codeUnknownDatabase is ClickHouse's UNKNOWN_DATABASE error code.
	codeUnknownDatabase = 81
)

// Connect opens a pool of native-protocol connections to the ClickHouse server at
// addr ("host:port"; or several, comma-separated, the replicas of a replicated cluster:
// each connection goes to the first that answers, in order, so a client fails over
// when one is down) with database as the default for unqualified table names, and
// checks that the server answers. A missing database is created (empty: Migrate
// creates the tables), because ClickHouse refuses connections to a database that does
// not exist. The caller closes the returned connection.
func Connect(ctx context.Context, addr, database string) (driver.Conn, error) {
	if err := checkDatabase(database); err != nil {
		return nil, fmt.Errorf("connect to clickhouse at %s: %w", addr, err)
	}
	conn, err := dial(ctx, addr, database)
	var ex *clickhouse.Exception
	if errors.As(err, &ex) && ex.Code == codeUnknownDatabase {
		if err := createDatabase(ctx, addr, database); err != nil {
			return nil, fmt.Errorf("connect to clickhouse at %s: %w", addr, err)
		}
		conn, err = dial(ctx, addr, database)
	}
	if err != nil {
		return nil, fmt.Errorf("connect to clickhouse at %s (database %s): %w", addr, database, err)
	}
	return conn, nil
}

// SplitAddrs splits a comma-separated list of ClickHouse addresses, the form the
// --clickhouse flag takes for the replicas of a replicated cluster.
func SplitAddrs(addr string) []string {
	parts := strings.Split(addr, ",")
	out := parts[:0]
	for _, p := range parts {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// dial opens a pool and pings it; on error the pool is closed.
func dial(ctx context.Context, addr, database string) (driver.Conn, error) {
	conn, err := clickhouse.Open(&clickhouse.Options{
		Addr:        SplitAddrs(addr),
		Auth:        clickhouse.Auth{Database: database},
		DialTimeout: dialTimeout,
		ReadTimeout: readTimeout,
	})
	if err != nil {
		return nil, err
	}
	if err := conn.Ping(ctx); err != nil {
		conn.Close()
		return nil, err
	}
	return conn, nil
}

func createDatabase(ctx context.Context, addr, database string) error {
	conn, err := dial(ctx, addr, "default")
	if err != nil {
		return fmt.Errorf("create database %s: %w", database, err)
	}
	defer conn.Close()
	if err := conn.Exec(ctx, "CREATE DATABASE IF NOT EXISTS "+database); err != nil {
		return fmt.Errorf("create database %s: %w", database, err)
	}
	return nil
}

// EpisodeSteps returns the steps of one episode, de-duplicated (FINAL) and ordered
// by step.
func EpisodeSteps(ctx context.Context, conn driver.Conn, database, episodeID string) ([]StepRow, error) {
	rows, err := selectRows(ctx, conn, database, "steps", stepColumns,
		"WHERE episode_id = ? ORDER BY step", episodeID)
	if err != nil {
		return nil, fmt.Errorf("episode %s steps: %w", episodeID, err)
	}
	return rows, nil
}

// EpisodeFaults returns the faults fired in one episode, de-duplicated (FINAL) and
// ordered by step and seq.
func EpisodeFaults(ctx context.Context, conn driver.Conn, database, episodeID string) ([]FaultRow, error) {
	rows, err := selectRows(ctx, conn, database, "faults", faultColumns,
		"WHERE episode_id = ? ORDER BY step, seq", episodeID)
	if err != nil {
		return nil, fmt.Errorf("episode %s faults: %w", episodeID, err)
	}
	return rows, nil
}

// RunEpisodes returns the ended episodes of one run, de-duplicated (FINAL) and ordered
// by their index in the run.
func RunEpisodes(ctx context.Context, conn driver.Conn, database, runID string) ([]EpisodeRow, error) {
	rows, err := selectRows(ctx, conn, database, "episodes", episodeColumns,
		"WHERE run_id = ? ORDER BY idx, episode_id", runID)
	if err != nil {
		return nil, fmt.Errorf("run %s episodes: %w", runID, err)
	}
	return rows, nil
}

// Episode returns the row of one ended episode, de-duplicated (FINAL).
func Episode(ctx context.Context, conn driver.Conn, database, episodeID string) (EpisodeRow, error) {
	rows, err := selectRows(ctx, conn, database, "episodes", episodeColumns, "WHERE episode_id = ?", episodeID)
	if err != nil {
		return EpisodeRow{}, fmt.Errorf("episode %s: %w", episodeID, err)
	}
	if len(rows) == 0 {
		return EpisodeRow{}, fmt.Errorf("episode %s: has not ended yet (no row in %s.episodes)", episodeID, database)
	}
	return rows[0], nil
}

// EpisodePlan returns the whole fault plan an episode met, from its row: the plan itself
// for rows that hold it, else re-derived from the recorded inputs (pkg/faults/plans.Expand: a
// built-in profile's from code, a user-defined one's from its row in plan_templates) and
// checked against the recorded digest. services are the episode's env's (env.Spec).
func EpisodePlan(ctx context.Context, conn driver.Conn, database string, row EpisodeRow, services []string) (*gauntletv1.FaultPlan, error) {
	if row.Plan != "" {
		var p gauntletv1.FaultPlan
		if err := protojson.Unmarshal([]byte(row.Plan), &p); err != nil {
			return nil, fmt.Errorf("episode %s: recorded fault plan: %w", row.EpisodeID, err)
		}
		return &p, nil
	}
	c := row.CompactPlan()
	if c == nil {
		return nil, fmt.Errorf("episode %s: no fault plan recorded (neither plan nor catalogue_version)", row.EpisodeID)
	}
	var tmpl *gauntletv1.FaultPlan
	if c.Template != "" {
		rows, err := selectRows(ctx, conn, database, "plan_templates", templateColumns, "WHERE template = ?", c.Template)
		if err != nil {
			return nil, fmt.Errorf("episode %s: plan template %s: %w", row.EpisodeID, c.Template, err)
		}
		if len(rows) == 0 {
			return nil, fmt.Errorf("episode %s: plan template %s: no row in %s.plan_templates", row.EpisodeID, c.Template, database)
		}
		tmpl = &gauntletv1.FaultPlan{}
		if err := protojson.Unmarshal([]byte(rows[0].Plan), tmpl); err != nil {
			return nil, fmt.Errorf("episode %s: plan template %s: %w", row.EpisodeID, c.Template, err)
		}
	}
	p, err := plans.Expand(c, services, tmpl)
	if err != nil {
		return nil, fmt.Errorf("episode %s: recorded fault plan: %w", row.EpisodeID, err)
	}
	return p, nil
}

// RunCounts returns how many distinct episodes have ended and how many distinct steps
// were recorded in one run: exact, however many times events were redelivered and
// whether or not ClickHouse has merged the copies yet.
func RunCounts(ctx context.Context, conn driver.Conn, database, runID string) (episodes, steps uint64, err error) {
	if err := checkDatabase(database); err != nil {
		return 0, 0, fmt.Errorf("count run %s: %w", runID, err)
	}
	// uniqExact over the tables' keys counts what FINAL would leave, without
	// FINAL's single-threaded merge of whole partitions.
	q := "SELECT" +
		" (SELECT uniqExact(episode_id) FROM " + database + ".episodes WHERE run_id = ?)," +
		" (SELECT uniqExact(episode_id, step) FROM " + database + ".steps WHERE run_id = ?)"
	if err := conn.QueryRow(ctx, q, runID, runID).Scan(&episodes, &steps); err != nil {
		return 0, 0, fmt.Errorf("count run %s in %s.episodes and %s.steps: %w", runID, database, database, err)
	}
	return episodes, steps, nil
}

// selectRows reads cols of database.table FINAL with the given WHERE/ORDER BY tail.
func selectRows[R any](ctx context.Context, conn driver.Conn, database, table string, cols []column[R], tail string, args ...any) ([]R, error) {
	if err := checkDatabase(database); err != nil {
		return nil, err
	}
	target := database + "." + table
	rows, err := conn.Query(ctx, "SELECT "+columnList(cols)+" FROM "+target+" FINAL "+tail, args...)
	if err != nil {
		return nil, fmt.Errorf("select from %s: %w", target, err)
	}
	defer rows.Close()
	var out []R
	dest := make([]any, len(cols))
	for rows.Next() {
		var r R
		for i, c := range cols {
			dest[i] = c.field(&r)
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, fmt.Errorf("scan %s: %w", target, err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("select from %s: %w", target, err)
	}
	return out, nil
}

// Query runs any SQL statement that returns rows and gives back its column names and
// every value as text, formatted as clickhouse-client shows it: numbers in shortest
// form, DateTime as "2006-01-02 15:04:05", arrays as [1,2] and ['a','b'], NULL as
// NULL. It is meant for a table-printing CLI, not for programs.
func Query(ctx context.Context, conn driver.Conn, sql string) (columns []string, rows [][]string, err error) {
	res, err := conn.Query(ctx, sql)
	if err != nil {
		return nil, nil, fmt.Errorf("query: %w", err)
	}
	defer res.Close()
	columns = res.Columns()
	types := res.ColumnTypes()
	dest := make([]any, len(types))
	for i, t := range types {
		dest[i] = reflect.New(t.ScanType()).Interface()
	}
	for res.Next() {
		if err := res.Scan(dest...); err != nil {
			return nil, nil, fmt.Errorf("query: scan row %d: %w", len(rows)+1, err)
		}
		row := make([]string, len(dest))
		for i, d := range dest {
			row[i] = formatValue(reflect.ValueOf(d).Elem(), types[i].DatabaseTypeName(), false)
		}
		rows = append(rows, row)
	}
	if err := res.Err(); err != nil {
		return nil, nil, fmt.Errorf("query: %w", err)
	}
	return columns, rows, nil
}

// formatValue renders v, a value scanned from a column of ClickHouse type dbType.
// Strings are quoted only inside arrays, maps and tuples, as clickhouse-client does.
func formatValue(v reflect.Value, dbType string, nested bool) string {
	dbType = unwrapType(dbType, "Nullable(")
	dbType = unwrapType(dbType, "LowCardinality(")
	if !v.IsValid() {
		return "NULL"
	}
	if t, ok := v.Interface().(time.Time); ok {
		s := formatTime(t, dbType)
		if nested {
			return "'" + s + "'"
		}
		return s
	}
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			return "NULL"
		}
		return formatValue(v.Elem(), dbType, nested)
	case reflect.String:
		if nested {
			return quote(v.String())
		}
		return v.String()
	case reflect.Bool:
		return strconv.FormatBool(v.Bool())
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return strconv.FormatInt(v.Int(), 10)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return strconv.FormatUint(v.Uint(), 10)
	case reflect.Float32:
		return formatFloat(v.Float(), 32)
	case reflect.Float64:
		return formatFloat(v.Float(), 64)
	}
	if s, ok := v.Interface().(fmt.Stringer); ok { // Decimal, UUID, IP, big.Int
		if nested {
			return quote(s.String())
		}
		return s.String()
	}
	switch v.Kind() {
	case reflect.Slice, reflect.Array:
		if v.Kind() == reflect.Slice && v.IsNil() {
			return "[]"
		}
		elem := unwrapType(dbType, "Array(")
		parts := make([]string, v.Len())
		for i := range parts {
			parts[i] = formatValue(v.Index(i), elem, true)
		}
		return "[" + strings.Join(parts, ",") + "]"
	case reflect.Map:
		parts := make([]string, 0, v.Len())
		for it := v.MapRange(); it.Next(); {
			parts = append(parts, formatValue(it.Key(), "", true)+":"+formatValue(it.Value(), "", true))
		}
		sort.Strings(parts) // map order is random; output must not be
		return "{" + strings.Join(parts, ",") + "}"
	}
	return fmt.Sprint(v.Interface())
}

// unwrapType strips one wrapper such as "Array(" ... ")" from a type name.
func unwrapType(dbType, prefix string) string {
	if strings.HasPrefix(dbType, prefix) && strings.HasSuffix(dbType, ")") {
		return dbType[len(prefix) : len(dbType)-1]
	}
	return dbType
}

func formatTime(t time.Time, dbType string) string {
	switch {
	case strings.HasPrefix(dbType, "Date32"), dbType == "Date":
		return t.Format(time.DateOnly)
	case strings.HasPrefix(dbType, "DateTime64"):
		return t.Format("2006-01-02 15:04:05.999999999")
	default:
		return t.Format(time.DateTime)
	}
}

// formatFloat prints the shortest text that reads back as the same number, without an
// exponent in the usual range, and inf/nan as ClickHouse does.
func formatFloat(f float64, bits int) string {
	switch {
	case math.IsNaN(f):
		return "nan"
	case math.IsInf(f, 1):
		return "inf"
	case math.IsInf(f, -1):
		return "-inf"
	case f == 0 || (math.Abs(f) >= 1e-6 && math.Abs(f) < 1e21):
		return strconv.FormatFloat(f, 'f', -1, bits)
	default:
		return strings.Replace(strconv.FormatFloat(f, 'g', -1, bits), "e+", "e", 1)
	}
}

var literalEscaper = strings.NewReplacer(`\`, `\\`, `'`, `\'`)

// quote writes s as a ClickHouse string literal.
func quote(s string) string {
	return "'" + literalEscaper.Replace(s) + "'"
}

// EpisodeRewardSpec returns the reward spec steps of an episode were scored under, parsed
// from its file in reward_specs (by the steps' digest), or the built-in spec for steps
// recorded before specs had digests under DefaultVersion. A step scored under another
// spec than the first is an error: an episode has one spec.
func EpisodeRewardSpec(ctx context.Context, conn driver.Conn, database string, steps []StepRow) (scoring.Spec, error) {
	if len(steps) == 0 {
		return scoring.Spec{}, errors.New("reward spec: no steps")
	}
	first := steps[0]
	for _, s := range steps[1:] {
		if s.RewardSpecDigest != first.RewardSpecDigest || s.RewardSpec != first.RewardSpec {
			return scoring.Spec{}, fmt.Errorf("episode %s: step %d was scored under %s (%s), step 0 under %s (%s)",
				s.EpisodeID, s.Step, s.RewardSpec, s.RewardSpecDigest, first.RewardSpec, first.RewardSpecDigest)
		}
	}
	switch {
	case first.RewardSpecDigest == scoring.DefaultDigest(), first.RewardSpecDigest == "" && first.RewardSpec == scoring.DefaultVersion:
		return scoring.SpecFor(first.Env), nil
	case first.RewardSpecDigest == "":
		return scoring.Spec{}, fmt.Errorf("episode %s: scored under %s, recorded without a digest", first.EpisodeID, first.RewardSpec)
	}
	rows, err := selectRows(ctx, conn, database, "reward_specs", rewardSpecColumns, "WHERE digest = ?", first.RewardSpecDigest)
	if err != nil {
		return scoring.Spec{}, fmt.Errorf("episode %s: reward spec %s: %w", first.EpisodeID, first.RewardSpecDigest, err)
	}
	if len(rows) == 0 {
		return scoring.Spec{}, fmt.Errorf("episode %s: reward spec %s: no row in %s.reward_specs", first.EpisodeID, first.RewardSpecDigest, database)
	}
	spec, err := scoring.Parse(first.RewardSpec+" from reward_specs", []byte(rows[0].Source))
	if err != nil {
		return scoring.Spec{}, fmt.Errorf("episode %s: %w", first.EpisodeID, err)
	}
	if spec.Digest != first.RewardSpecDigest {
		return scoring.Spec{}, fmt.Errorf("episode %s: reward spec %s: its recorded file has digest %s", first.EpisodeID, first.RewardSpecDigest, spec.Digest)
	}
	return spec.ForEnv(first.Env), nil
}
