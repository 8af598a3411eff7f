package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"time"
)

// The console probe: a reader with the console open in a tab while a large run is in
// flight. Every -console-every it loads each page of the console the way the page's
// script does (a page's requests at once, as app.js's Promise.all sends them; the pages
// one after another), and records how long each page took to answer in full, from Go's
// http client on loopback. Latencies are kept whole (one sample per page per round) and
// sorted at the end: a run of minutes gives hundreds of samples a page, so no histogram
// is needed and the percentiles are exact (nearest rank).

// probePage is one console page: the requests its script sends to show it.
type probePage struct {
	Name string
	// paths are the requests, relative to /console/; a page is answered when all are.
	paths []string
	// requests name the paths (the endpoint, without ids) in the per-request figures,
	// recorded for pages of more than one request.
	requests []string
}

// consoleTarget is what the probe knows of the run it watches, from the pages it read.
type consoleTarget struct {
	runID    string
	episodes uint64 // ended, as the runs list said
	latest   string // an episode of the last page of the run's episodes
}

// probePages returns the pages to load this round. Before the run has an ended episode
// (t.runID empty) only the pages that need no run are loaded.
func probePages(t consoleTarget) []probePage {
	pages := []probePage{
		{Name: "shell", paths: []string{"", "static/app.js", "static/style.css", "static/vendor/uPlot.esm.js", "static/vendor/uPlot.min.css"}},
		{Name: "runs", paths: []string{"api/runs"}},
		{Name: "curricula", paths: []string{"api/curricula"}},
	}
	if t.runID == "" {
		return pages
	}
	run := "api/runs/" + url.PathEscape(t.runID)
	// The run page's last page of episodes: where a reader following the run looks.
	last := uint64(0)
	if t.episodes > 0 {
		last = (t.episodes - 1) / episodesPage * episodesPage
	}
	pages = append(pages,
		probePage{Name: "run", paths: []string{run, run + "/episodes?offset=0&limit=" + strconv.Itoa(episodesPage)},
			requests: []string{"api/runs/{run}", "api/runs/{run}/episodes?offset=0"}},
		probePage{Name: "run, last episodes", paths: []string{run, fmt.Sprintf("%s/episodes?offset=%d&limit=%d", run, last, episodesPage)},
			requests: []string{"api/runs/{run}", "api/runs/{run}/episodes?offset=last"}},
		probePage{Name: "fault heatmap", paths: []string{run + "/faults"}},
	)
	if t.latest != "" {
		pages = append(pages, probePage{Name: "replay", paths: []string{"api/episodes/" + url.PathEscape(t.latest) + "?from=0&limit=" + strconv.Itoa(replayPage)}})
	}
	return pages
}

// The page sizes app.js asks for (EPISODES_PAGE, PAGE).
const (
	episodesPage = 200
	replayPage   = 100
)

// probeSample is one load of one page.
type probeSample struct {
	// At is when the load started, in seconds since the probe started.
	At float64 `json:"at_s"`
	Ms float64 `json:"ms"`
	// Err is the first failure among the page's requests (a transport error, a status
	// other than 200, an answer that is not JSON).
	Err string `json:"err,omitempty"`
}

// pageStats is one page's latencies over the probe.
type pageStats struct {
	Page   string  `json:"page"`
	Count  int     `json:"count"`
	Errors int     `json:"errors"`
	P50Ms  float64 `json:"p50_ms"`
	P99Ms  float64 `json:"p99_ms"`
	MaxMs  float64 `json:"max_ms"`
	// FirstError is the first failure's message.
	FirstError string        `json:"first_error,omitempty"`
	Samples    []probeSample `json:"samples"`
}

// nearestRank returns the p-th percentile (0 < p <= 100) of sorted by nearest rank: the
// smallest value at least p % of the samples are at or below.
func nearestRank(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p/100*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// stats sums up the samples of each page, in the order pages were first seen.
func stats(order []string, samples map[string][]probeSample) []pageStats {
	out := make([]pageStats, 0, len(order))
	for _, name := range order {
		ss := samples[name]
		st := pageStats{Page: name, Count: len(ss), Samples: ss}
		ms := make([]float64, 0, len(ss))
		for _, s := range ss {
			if s.Err != "" {
				st.Errors++
				if st.FirstError == "" {
					st.FirstError = s.Err
				}
			}
			ms = append(ms, s.Ms)
		}
		slices.Sort(ms)
		st.P50Ms, st.P99Ms = nearestRank(ms, 50), nearestRank(ms, 99)
		if len(ms) > 0 {
			st.MaxMs = ms[len(ms)-1]
		}
		out = append(out, st)
	}
	return out
}

// prober loads the console's pages in rounds until stopped.
type prober struct {
	base   string // http://host:port/console/
	every  time.Duration
	client *http.Client

	t0      time.Time
	target  consoleTarget
	order   []string
	samples map[string][]probeSample
	// reqOrder and reqSamples are the same per request of a page of several.
	reqOrder   []string
	reqSamples map[string][]probeSample
}

func newProber(httpAddr string, every time.Duration) *prober {
	return &prober{
		base: "http://" + httpAddr + "/console/", every: every,
		// A page that takes longer than this is an error in itself; the console bounds
		// its own queries at 10 s (504).
		client:  &http.Client{Timeout: 30 * time.Second},
		samples: map[string][]probeSample{}, reqSamples: map[string][]probeSample{},
	}
}

// run loads every page every p.every (the next round at once if one took longer) until
// stop is closed or ctx ends, then returns each page's figures and, for pages of several
// requests, each request's.
func (p *prober) run(ctx context.Context, stop <-chan struct{}) (pages, requests []pageStats) {
	p.t0 = time.Now()
	for {
		start := time.Now()
		for _, pg := range probePages(p.target) {
			p.load(ctx, pg)
		}
		select {
		case <-stop:
		case <-ctx.Done():
		case <-time.After(time.Until(start.Add(p.every))):
			continue
		}
		return stats(p.order, p.samples), stats(p.reqOrder, p.reqSamples)
	}
}

// load sends a page's requests at once and records the time until the last answered.
func (p *prober) load(ctx context.Context, pg probePage) {
	if _, ok := p.samples[pg.Name]; !ok {
		p.order = append(p.order, pg.Name)
		p.samples[pg.Name] = nil
	}
	start := time.Now()
	bodies := make([][]byte, len(pg.paths))
	errs := make([]error, len(pg.paths))
	took := make([]time.Duration, len(pg.paths))
	var wg sync.WaitGroup
	for i, path := range pg.paths {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.Now()
			bodies[i], errs[i] = p.get(ctx, path)
			took[i] = time.Since(t)
		}()
	}
	wg.Wait()
	s := probeSample{At: start.Sub(p.t0).Seconds(), Ms: float64(time.Since(start).Microseconds()) / 1000}
	for _, err := range errs {
		if err != nil {
			s.Err = err.Error()
			break
		}
	}
	if ctx.Err() != nil {
		return // stopped mid-page: not the console's doing
	}
	p.samples[pg.Name] = append(p.samples[pg.Name], s)
	for i, name := range pg.requests {
		if _, ok := p.reqSamples[name]; !ok {
			p.reqOrder = append(p.reqOrder, name)
		}
		rs := probeSample{At: s.At, Ms: float64(took[i].Microseconds()) / 1000}
		if errs[i] != nil {
			rs.Err = errs[i].Error()
		}
		p.reqSamples[name] = append(p.reqSamples[name], rs)
	}
	if s.Err == "" {
		p.learn(pg, bodies)
	}
}

// get fetches one path under /console/, whole, and checks an API answer is JSON.
func (p *prober) get(ctx context.Context, path string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.base+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET /console/%s: %w", path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("GET /console/%s: read: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /console/%s: %s: %.200s", path, resp.Status, body)
	}
	if len(path) >= 4 && path[:4] == "api/" && !json.Valid(body) {
		return nil, fmt.Errorf("GET /console/%s: answer is not JSON: %.200s", path, body)
	}
	return body, nil
}

// learn takes from a page's answers what the next rounds need: the run (the one most
// recently active, as the runs list orders them), how many of its episodes have ended,
// and its latest listed episode.
func (p *prober) learn(pg probePage, bodies [][]byte) {
	switch pg.Name {
	case "runs":
		var v struct {
			Runs []struct {
				RunID    string `json:"run_id"`
				Episodes uint64 `json:"episodes"`
			} `json:"runs"`
		}
		if json.Unmarshal(bodies[0], &v) == nil && len(v.Runs) > 0 {
			if v.Runs[0].RunID != p.target.runID {
				p.target = consoleTarget{runID: v.Runs[0].RunID}
			}
			p.target.episodes = v.Runs[0].Episodes
		}
	case "run, last episodes":
		var v struct {
			Episodes []struct {
				EpisodeID string `json:"episode_id"`
			} `json:"episodes"`
		}
		if json.Unmarshal(bodies[1], &v) == nil && len(v.Episodes) > 0 {
			p.target.latest = v.Episodes[len(v.Episodes)-1].EpisodeID
		}
	}
}
