package console

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"net/http"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"go.temporal.io/sdk/client"

	"github.com/gauntlet-rl/gauntlet/pkg/runs"
	"github.com/gauntlet-rl/gauntlet/pkg/trajectory"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

//go:embed static
var staticFiles embed.FS

// Prefix is where the console is mounted on the http server.
const Prefix = "/console/"

// DefaultQueryTimeout bounds each API request's queries.
const DefaultQueryTimeout = 10 * time.Second

// Config is what a Console reads from and how long it lets a request take.
type Config struct {
	// ClickHouse returns the native address ("host:port") of the ClickHouse server; it is
	// called when the console connects, so a server started after the console is found.
	ClickHouse func() string
	// Database is the ClickHouse database the store writes.
	Database string
	// QueryTimeout bounds the queries of one API request (DefaultQueryTimeout when 0).
	QueryTimeout time.Duration
	// Progress returns the scheduler's record of a run (its state in the gauntlet_runs
	// KV bucket), ok false when there is none (a run of env API sessions, a bucket out of
	// reach). It tells a run in flight from one that has ended, and how many episodes it
	// plans. Nil: runs are known from ClickHouse alone.
	Progress func(ctx context.Context, runID string) (p *gauntletv1.RunProgress, ok bool)
	// Temporal returns the Temporal frontend's address ("host:port"), read when the
	// console first needs it (the curricula pages). Nil or "": the curricula pages
	// answer 503, naming what is missing.
	Temporal func() string
	// Namespace is the Temporal namespace curricula run in ("default" when empty).
	Namespace string
	// Authorize says whether a bearer token may act on curricula (pause, resume, skip,
	// abort): the env API's tokens. Nil: the console is read-only.
	Authorize func(token string) bool
	// CacheFrom is the size, in episodes, from which the answers that summarise whole
	// runs (the runs list, a run's report, its fault heatmap) are kept and served from
	// memory while a fresh one is computed in the background (cache.go):
	// DefaultCacheFrom when 0.
	CacheFrom uint64
	// RefreshAfter is the age at which a kept answer is recomputed when served
	// (DefaultRefreshAfter when 0); MaxAge the age past which it is not served
	// (DefaultMaxAge when 0).
	RefreshAfter, MaxAge time.Duration
	// FoldFrom is the planned size, in episodes, from which a run the scheduler planned
	// has its report and fault heatmap folded (fold.go) rather than read whole with
	// every answer: DefaultCacheFrom when 0.
	FoldFrom uint64
}

// Console serves the web console: the pages and the JSON API under Prefix.
type Console struct {
	cfg Config
	log *slog.Logger
	mux *http.ServeMux

	mu   sync.Mutex
	conn driver.Conn // nil until the first successful connect

	// cache keeps the summaries of large runs (cache.go).
	cache *answerCache
	// folds fold the reports of large planned runs (fold.go).
	folds folds
	// finished are the kept summaries of finished runs, by id (runs).
	fmu      sync.Mutex
	finished map[string]RunSummary

	// tmu guards tc apart from conn, so a Temporal slow to answer a dial never holds up
	// the runs pages.
	tmu sync.Mutex
	tc  client.Client // nil until the curricula pages first dial Temporal
}

// New returns a console reading cfg.Database; it connects on the first API request.
func New(cfg Config, log *slog.Logger) *Console {
	if cfg.QueryTimeout <= 0 {
		cfg.QueryTimeout = DefaultQueryTimeout
	}
	if cfg.CacheFrom == 0 {
		cfg.CacheFrom = DefaultCacheFrom
	}
	if cfg.FoldFrom == 0 {
		cfg.FoldFrom = DefaultCacheFrom
	}
	if cfg.RefreshAfter <= 0 {
		cfg.RefreshAfter = DefaultRefreshAfter
	}
	if cfg.MaxAge <= 0 {
		cfg.MaxAge = DefaultMaxAge
	}
	c := &Console{cfg: cfg, log: log, mux: http.NewServeMux(), folds: folds{recheck: infraRecheck, window: foldWindow}}
	c.cache = newAnswerCache(cfg.CacheFrom, cfg.RefreshAfter, cfg.MaxAge, func(key string, err error) {
		log.Warn("console: computing a summary failed", "answer", key, "err", err)
	})
	static, _ := fs.Sub(staticFiles, "static") // the embedded directory exists
	files := http.StripPrefix(Prefix+"static/", http.FileServerFS(static))
	c.mux.Handle("GET "+Prefix+"static/", files)
	c.mux.HandleFunc("GET "+Prefix+"{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-cache")
		http.ServeFileFS(w, r, static, "index.html")
	})
	c.mux.HandleFunc("GET "+Prefix+"api/runs", c.summary("runs", "", c.runs, map[string]bound{"limit": {100, MaxRuns}}))
	c.mux.HandleFunc("GET "+Prefix+"api/runs/{run}", c.summary("run", "run", c.run, nil))
	c.mux.HandleFunc("GET "+Prefix+"api/runs/{run}/episodes", c.api(c.episodes,
		map[string]bound{"limit": {100, MaxEpisodes}, "offset": {0, 1_000_000_000}, "after": {}}))
	c.mux.HandleFunc("GET "+Prefix+"api/episodes/{episode}", c.api(c.episode,
		map[string]bound{"limit": {100, MaxSteps}, "from": {0, 1_000_000}}))
	c.mux.HandleFunc("GET "+Prefix+"api/runs/{run}/faults", c.summary("faults", "run", c.faultHeatmap, nil))
	c.mux.HandleFunc("GET "+Prefix+"api/curricula", c.serve(map[string]bound{"limit": {50, MaxCurricula}}, c.curricula))
	c.mux.HandleFunc("GET "+Prefix+"api/curricula/{curriculum}", c.serve(nil, c.curriculum))
	// An action reads nothing from ClickHouse: it works while ClickHouse is away.
	c.mux.HandleFunc("POST "+Prefix+"api/curricula/{curriculum}/signal/{signal}", c.serve(nil, c.signal))
	return c
}

// ServeHTTP serves the paths under Prefix.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) { c.mux.ServeHTTP(w, r) }

// Close stops the background refreshes and closes the ClickHouse connection, if one
// was opened.
func (c *Console) Close() error {
	c.cache.close()
	c.tmu.Lock()
	if c.tc != nil {
		c.tc.Close()
		c.tc = nil
	}
	c.tmu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn == nil {
		return nil
	}
	err := c.conn.Close()
	c.conn = nil
	return err
}

// errBadRequest marks a request's own mistake (400).
var errBadRequest = errors.New("bad request")

// errUnavailable marks a ClickHouse that cannot be reached (503).
var errUnavailable = errors.New("clickhouse unavailable")

func (c *Console) reader(ctx context.Context) (reader, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn == nil {
		addr := ""
		if c.cfg.ClickHouse != nil {
			addr = c.cfg.ClickHouse()
		}
		if addr == "" {
			return reader{}, fmt.Errorf("%w: no address yet", errUnavailable)
		}
		conn, err := trajectory.Connect(ctx, addr, c.cfg.Database)
		if err != nil {
			return reader{}, fmt.Errorf("%w: %w", errUnavailable, err)
		}
		c.conn = conn
	}
	return reader{conn: c.conn, database: c.cfg.Database}, nil
}

// bound is a numeric query parameter's default and largest value (the smallest is 0).
type bound struct{ def, max int }

// idParams are the query parameters that are ids (an episode's, as a cursor) rather than
// numbers: checked as ids in paths are, and read by the endpoint from the request.
var idParams = map[string]bool{"after": true}

// params are an API request's numeric query parameters, checked against their bounds.
type params map[string]int

// endpoint answers one API request from its checked parameters.
type endpoint func(ctx context.Context, rd reader, r *http.Request, p params) (any, error)

// api wraps an endpoint: its parameters checked before anything is read (a bad request
// never waits on ClickHouse), a reader under the query timeout, the answer as JSON,
// errors as {"error": "..."} with their status.
func (c *Console) api(h endpoint, bounds map[string]bound) http.HandlerFunc {
	return c.serve(bounds, func(ctx context.Context, r *http.Request, p params) (any, error) {
		rd, err := c.reader(ctx)
		if err != nil {
			return nil, err
		}
		return h(ctx, rd, r, p)
	})
}

// summaryEndpoint answers a request whose answer summarises whole runs, from its id
// (the path value idName; "" for none) and checked parameters, and says how many
// episodes the answer summarises.
type summaryEndpoint func(ctx context.Context, rd reader, id string, p params) (v any, episodes uint64, err error)

// summary wraps a summaryEndpoint as api does, through the cache: a large answer is kept
// under the endpoint's name, its id and its parameters, and served with an Age header.
func (c *Console) summary(name, idName string, h summaryEndpoint, bounds map[string]bound) http.HandlerFunc {
	return c.serve(bounds, func(ctx context.Context, r *http.Request, p params) (any, error) {
		id := ""
		if idName != "" {
			id = r.PathValue(idName)
		}
		names := make([]string, 0, len(p))
		for k := range p {
			names = append(names, k)
		}
		sort.Strings(names)
		key := name + "/" + id
		for _, k := range names {
			key += fmt.Sprintf("&%s=%d", k, p[k])
		}
		return c.cache.get(ctx, key, func(ctx context.Context) (any, uint64, error) {
			rd, err := c.reader(ctx)
			if err != nil {
				return nil, 0, err
			}
			return h(ctx, rd, id, p)
		})
	})
}

// serve answers one API request from its checked parameters under the query timeout,
// as JSON; errors as {"error": "..."} with their status.
func (c *Console) serve(bounds map[string]bound, h func(ctx context.Context, r *http.Request, p params) (any, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), c.cfg.QueryTimeout)
		defer cancel()
		var v any
		p, err := checkParams(r, bounds)
		if err == nil {
			v, err = h(ctx, r, p)
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		if k, ok := v.(cached); ok {
			// A kept answer (cache.go): how old it is, in whole seconds as RFC 9111 says.
			w.Header().Set("Age", strconv.Itoa(int(k.age/time.Second)))
			v = k.v
		}
		if err != nil {
			status := http.StatusInternalServerError
			switch {
			case errors.Is(err, errBadRequest):
				status = http.StatusBadRequest
			case errors.Is(err, errNotFound):
				status = http.StatusNotFound
			case errors.Is(err, errUnauthorized):
				status = http.StatusUnauthorized
				w.Header().Set("WWW-Authenticate", `Bearer realm="gauntlet"`)
			case errors.Is(err, errReadOnly):
				status = http.StatusForbidden
			case errors.Is(err, errConflict):
				status = http.StatusConflict
			case errors.Is(err, errUnavailable), errors.Is(err, errNoTemporal):
				status = http.StatusServiceUnavailable
			case errors.Is(err, context.DeadlineExceeded):
				status = http.StatusGatewayTimeout
			}
			if status >= 500 {
				c.log.Warn("console request failed", "path", r.URL.Path, "status", status, "err", err)
			}
			w.WriteHeader(status)
			_ = json.NewEncoder(w).Encode(map[string]string{"error": err.Error()})
			return
		}
		_ = json.NewEncoder(w).Encode(v)
	}
}

// idRE is what run and episode ids look like (gauntlet's are "r" and hex digits, with
// "-" and the index for episodes; ids given through the env API are the trainer's).
var idRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$`)

// checkParams refuses malformed ids, numbers out of their bounds and query parameters
// the endpoint does not take, naming the parameter.
func checkParams(r *http.Request, bounds map[string]bound) (params, error) {
	for _, name := range []string{"run", "episode", "curriculum"} {
		if v := r.PathValue(name); v != "" && !idRE.MatchString(v) {
			return nil, fmt.Errorf("%w: %s id %q: want up to 128 letters, digits, '_', '.', ':' or '-'", errBadRequest, name, v)
		}
	}
	q := r.URL.Query()
	for name := range q {
		if _, ok := bounds[name]; !ok {
			known := make([]string, 0, len(bounds))
			for k := range bounds {
				known = append(known, k)
			}
			sort.Strings(known)
			return nil, fmt.Errorf("%w: unknown query parameter %q (known: %s)", errBadRequest, name, strings.Join(known, ", "))
		}
	}
	p := params{}
	for name, b := range bounds {
		p[name] = b.def
		s := q.Get(name)
		if s == "" {
			continue
		}
		if idParams[name] {
			if !idRE.MatchString(s) {
				return nil, fmt.Errorf("%w: %s=%q: want an id of up to 128 letters, digits, '_', '.', ':' or '-'", errBadRequest, name, s)
			}
			continue
		}
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 || n > b.max {
			return nil, fmt.Errorf("%w: %s=%q: want a whole number from 0 to %d", errBadRequest, name, s, b.max)
		}
		p[name] = n
	}
	return p, nil
}

// addProgress adds the scheduler's view of the run to s: its state, the episodes it
// plans, and whether it is live (in flight, or ended with rows still on their way to
// ClickHouse). Without a record, s keeps what ClickHouse alone says.
func (c *Console) addProgress(ctx context.Context, s *RunSummary) {
	if c.cfg.Progress == nil {
		return
	}
	p, ok := c.cfg.Progress(ctx, s.RunID)
	if !ok {
		return
	}
	planned := p.GetEpisodes()
	s.Planned = &planned
	s.State = StateRunning
	if p.GetDone() {
		s.State = StateDone
	}
	s.Live = !p.GetDone() || s.Episodes < p.GetEnded()
}

// RunsPage is the answer of /console/api/runs.
type RunsPage struct {
	Runs []RunSummary `json:"runs"`
}

// The runs list summarises every run it shows; read whole, a run of a million episodes
// costs it seconds with every look. It reads by SQL only the runs it knows nothing of:
// a large planned run in flight takes its numbers from its fold (fold.go), which reads
// by key only the episodes past its watermark, and a run the scheduler says is done,
// with every ended episode in ClickHouse, from the summary kept when it was last read
// (its rows no longer change). The runs so known are left out of the SQL by their key,
// so it reads none of their granules.
const (
	// maxFinished bounds the finished runs' kept summaries; past it, the oldest by last
	// end are forgotten (and read by SQL again if they are still listed).
	maxFinished = 1000
)

func (c *Console) runs(ctx context.Context, rd reader, _ string, p params) (any, uint64, error) {
	limit := p["limit"]
	known := c.knownRuns(ctx, rd)
	exclude := make([]string, 0, len(known))
	for id := range known {
		exclude = append(exclude, id)
	}
	sort.Strings(exclude)
	read, err := rd.RunsExcept(ctx, exclude, limit)
	if err != nil {
		return nil, 0, err
	}
	out := make([]RunSummary, 0, len(read)+len(known))
	for _, s := range read {
		c.addProgress(ctx, &s)
		if !c.keepFinished(ctx, s) && c.folds.room() {
			// A large planned run in flight: folded from the next look on. Not in place
			// of another fold: with more such runs than folds, each look would fold a run
			// anew, reading it whole.
			c.fold(ctx, s.RunID)
		}
		out = append(out, s)
	}
	for _, s := range known {
		c.addProgress(ctx, &s)
		out = append(out, s)
	}
	sortRuns(out)
	if len(out) > limit {
		out = out[:limit]
	}
	var n uint64
	for _, s := range out {
		n += s.Episodes
	}
	return RunsPage{Runs: out}, n, nil
}

// sortRuns orders runs as runSummarySQL's list does: the most recently ended first, then
// by id.
func sortRuns(runs []RunSummary) {
	sort.Slice(runs, func(i, j int) bool {
		if !runs[i].Last.Equal(runs[j].Last) {
			return runs[i].Last.After(runs[j].Last)
		}
		return runs[i].RunID < runs[j].RunID
	})
}

// knownRuns returns the summaries of the runs the list need not read: the finished
// runs' kept summaries, and the folded runs' (a fold the scheduler no longer has a
// record of is left to the SQL). A folded run found finished is kept as finished from
// then on and no longer refreshed.
func (c *Console) knownRuns(ctx context.Context, rd reader) map[string]RunSummary {
	c.fmu.Lock()
	known := maps.Clone(c.finished)
	c.fmu.Unlock()
	if known == nil {
		known = map[string]RunSummary{}
	}
	c.folds.mu.Lock()
	ids := make([]string, 0, len(c.folds.runs))
	for id := range c.folds.runs {
		if _, ok := known[id]; !ok {
			ids = append(ids, id)
		}
	}
	c.folds.mu.Unlock()
	for _, id := range ids {
		f := c.fold(ctx, id)
		if f == nil {
			continue
		}
		var s RunSummary
		err := f.refresh(ctx, rd, func(v foldView) (err error) {
			s, err = v.summary(id)
			return err
		})
		if err != nil {
			// No episode of it ended yet (the SQL finds none either), or ClickHouse
			// failed: the SQL reads the run instead.
			if !errors.Is(err, errNotFound) {
				c.log.Warn("console: a folded run's summary for the runs list", "run", id, "err", err)
			}
			continue
		}
		c.addProgress(ctx, &s)
		c.keepFinished(ctx, s)
		known[id] = s
	}
	return known
}

// keepFinished keeps s, a run's summary read now, when the scheduler says the run is
// done and every episode it ended is in ClickHouse: its numbers no longer change.
// It says whether it kept s.
func (c *Console) keepFinished(ctx context.Context, s RunSummary) bool {
	if c.cfg.Progress == nil {
		return false
	}
	p, ok := c.cfg.Progress(ctx, s.RunID)
	if !ok || !p.GetDone() || s.Episodes < p.GetEnded() {
		return false
	}
	c.fmu.Lock()
	defer c.fmu.Unlock()
	if c.finished == nil {
		c.finished = map[string]RunSummary{}
	}
	if _, ok := c.finished[s.RunID]; !ok && len(c.finished) >= maxFinished {
		var oldest string
		for id, k := range c.finished {
			if oldest == "" || k.Last.Before(c.finished[oldest].Last) {
				oldest = id
			}
		}
		delete(c.finished, oldest)
	}
	c.finished[s.RunID] = s
	return true
}

// RunPage is the answer of /console/api/runs/{run}: the run's report.
type RunPage struct {
	Run        RunSummary  `json:"run"`
	Histogram  []Bin       `json:"reward_histogram"`
	FaultKinds []FaultKind `json:"fault_kinds"`
	// Series is the chart over episode index, each point SeriesWidth episodes wide.
	Series      []Point `json:"series"`
	SeriesWidth uint64  `json:"series_width"`
}

// planned says whether the scheduler planned run id (it has a record of it).
func (c *Console) planned(ctx context.Context, id string) bool {
	if c.cfg.Progress == nil {
		return false
	}
	_, ok := c.cfg.Progress(ctx, id)
	return ok
}

// plannedRunOf returns the run of episode id when the id is one the scheduler gives
// (runs.EpisodeID) and it has a record of that run; "" otherwise.
func (c *Console) plannedRunOf(ctx context.Context, id string) string {
	i := strings.LastIndexByte(id, '-')
	if i <= 0 {
		return ""
	}
	idx, err := strconv.ParseUint(id[i+1:], 10, 64)
	if err != nil || runs.EpisodeID(id[:i], idx) != id || !c.planned(ctx, id[:i]) {
		return ""
	}
	return id[:i]
}

// fold returns the fold of run id (fold.go) when the scheduler planned it with
// FoldFrom episodes or more; nil for any other run, read whole.
func (c *Console) fold(ctx context.Context, id string) *runFold {
	if c.cfg.Progress == nil {
		return nil
	}
	p, ok := c.cfg.Progress(ctx, id)
	if !ok || p.GetEpisodes() < c.cfg.FoldFrom || p.GetEpisodes() > maxFolded {
		return nil
	}
	return c.folds.get(id, p.GetEpisodes())
}

func (c *Console) run(ctx context.Context, rd reader, id string, _ params) (any, uint64, error) {
	var p RunPage
	var err error
	if f := c.fold(ctx, id); f != nil {
		err := f.refresh(ctx, rd, func(v foldView) (err error) {
			p.Run, err = v.summary(id)
			p.Histogram, p.FaultKinds = v.histogram(), v.faultKinds()
			p.Series, p.SeriesWidth = v.series()
			return err
		})
		if err != nil {
			return nil, 0, err
		}
		c.addProgress(ctx, &p.Run)
		return p, p.Run.Episodes, nil
	}
	if p.Run, err = rd.Run(ctx, id); err != nil {
		return nil, 0, err
	}
	c.addProgress(ctx, &p.Run)
	if p.Histogram, err = rd.RewardHistogram(ctx, id); err != nil {
		return nil, 0, err
	}
	if p.FaultKinds, err = rd.FaultKinds(ctx, id); err != nil {
		return nil, 0, err
	}
	if p.Series, p.SeriesWidth, err = rd.Series(ctx, id); err != nil {
		return nil, 0, err
	}
	return p, p.Run.Episodes, nil
}

// EpisodesPage is the answer of /console/api/runs/{run}/episodes.
type EpisodesPage struct {
	Episodes []EpisodeSummary `json:"episodes"`
	Offset   int              `json:"offset"`
	Limit    int              `json:"limit"`
	// Keyed says the run's episodes are paged by a cursor (After, Next) rather than by
	// Offset: an env API run whose ids sort in issue order (reader.EpisodesAfter).
	Keyed bool `json:"keyed"`
	// After is the cursor the page was asked with: the id of the episode it follows.
	After string `json:"after,omitempty"`
	// Next is the cursor of the page after this one (its last episode), when this one
	// is full.
	Next string `json:"next,omitempty"`
}

func (c *Console) episodes(ctx context.Context, rd reader, r *http.Request, p params) (any, error) {
	offset, limit := p["offset"], p["limit"]
	after := r.URL.Query().Get("after")
	id := r.PathValue("run")
	if c.cfg.Progress != nil {
		// A run the scheduler planned numbers its episodes 0 to planned-1: the page from
		// offset is the episodes from that index, found without sorting the whole run.
		if _, ok := c.cfg.Progress(ctx, id); ok {
			if after != "" {
				return nil, fmt.Errorf("%w: after=%q: run %s is paged by offset (its episodes are numbered)", errBadRequest, after, id)
			}
			eps, err := rd.EpisodesFrom(ctx, id, offset, limit)
			if err != nil {
				return nil, err
			}
			return EpisodesPage{Episodes: eps, Offset: offset, Limit: limit}, nil
		}
	}
	if after != "" && offset > 0 {
		return nil, fmt.Errorf("%w: after and offset together: a page starts after an episode or at an offset", errBadRequest)
	}
	keyed, err := rd.Keyed(ctx, id)
	if err != nil {
		return nil, err
	}
	// An offset past 0 into a keyed run is still answered, by rank: a link or a client
	// from before the cursor.
	if keyed && offset == 0 {
		eps, err := rd.EpisodesAfter(ctx, id, after, limit)
		if err != nil {
			return nil, err
		}
		page := EpisodesPage{Episodes: eps, Limit: limit, Keyed: true, After: after}
		if len(eps) == limit && limit > 0 {
			page.Next = eps[len(eps)-1].EpisodeID
		}
		return page, nil
	}
	if after != "" {
		return nil, fmt.Errorf("%w: after=%q: run %s is paged by offset (it has episode ids that do not sort in issue order)", errBadRequest, after, id)
	}
	eps, err := rd.EpisodesByRank(ctx, id, offset, limit)
	if err != nil {
		return nil, err
	}
	return EpisodesPage{Episodes: eps, Offset: offset, Limit: limit}, nil
}

// EpisodePage is the answer of /console/api/episodes/{episode}: the episode (null while
// it has not ended) and a page of its steps from step From.
type EpisodePage struct {
	Episode *EpisodeSummary `json:"episode"`
	// Forks are the episodes forked from this one (once it has ended).
	Forks []Fork `json:"forks"`
	Steps []Step `json:"steps"`
	From  int    `json:"from"`
	Limit int    `json:"limit"`
}

func (c *Console) episode(ctx context.Context, rd reader, r *http.Request, p params) (any, error) {
	from, limit := p["from"], p["limit"]
	id := r.PathValue("episode")
	ep, requestedAt, err := rd.episode(ctx, id, c.plannedRunOf(ctx, id))
	if err != nil {
		return nil, err
	}
	steps, err := rd.Steps(ctx, id, requestedAt, from, limit)
	if err != nil {
		return nil, err
	}
	if ep == nil && len(steps) == 0 && from == 0 {
		return nil, fmt.Errorf("episode %s: %w (no step recorded)", id, errNotFound)
	}
	forks := []Fork{}
	// Forks are of env API episodes (services/envapi forks its own sessions' snapshots):
	// a run the scheduler planned has none, and looking for them reads a narrow column of
	// every episode of the run, the replay's largest read of a large run.
	if ep != nil && !c.planned(ctx, ep.RunID) {
		if forks, err = rd.Forks(ctx, ep.RunID, id); err != nil {
			return nil, err
		}
	}
	return EpisodePage{Episode: ep, Forks: forks, Steps: steps, From: from, Limit: limit}, nil
}

// HeatmapPage is the answer of /console/api/runs/{run}/faults: the run's summary and
// its fault kind × service cells.
type HeatmapPage struct {
	Run   RunSummary `json:"run"`
	Cells []HeatCell `json:"cells"`
}

func (c *Console) faultHeatmap(ctx context.Context, rd reader, id string, _ params) (any, uint64, error) {
	var p HeatmapPage
	var err error
	if f := c.fold(ctx, id); f != nil {
		err := f.refresh(ctx, rd, func(v foldView) (err error) {
			p.Run, err = v.summary(id)
			p.Cells = v.heatmap()
			return err
		})
		if err != nil {
			return nil, 0, err
		}
		return p, p.Run.Episodes, nil
	}
	if p.Run, err = rd.Run(ctx, id); err != nil {
		return nil, 0, err
	}
	if p.Cells, err = rd.FaultHeatmap(ctx, id); err != nil {
		return nil, 0, err
	}
	return p, p.Run.Episodes, nil
}
