package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"regexp"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/metric/noop"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/threats"
)

// threatResult is what the fingerprint probe of a pipeline run measured: this process
// published threat fingerprints into the demo's gauntlet_threats bucket while the demo
// ran its episodes, and the demo's workers, in the other process, timed each from its
// publication to their knowing it (their histogram
// gauntlet_worker_threat_propagation_seconds, read from the demo's /metrics).
type threatResult struct {
	Every time.Duration `json:"every_ns"`
	// Published is how many fingerprints the probe handed its watcher to publish;
	// Learned how many the demo's workers had learned at the last read of their
	// histogram (those published after it, in the run's last half second, are missing).
	Published uint64 `json:"published"`
	Learned   uint64 `json:"learned"`
	// P50Ms and P99Ms are the upper bounds of the histogram's buckets holding the
	// quantiles (the buckets are 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 7.5, 10 ms,
	// ...); MeanMs is exact (sum over count). +Inf shows as -1.
	P50Ms  float64 `json:"p50_ms_at_most"`
	P99Ms  float64 `json:"p99_ms_at_most"`
	MeanMs float64 `json:"mean_ms"`
	// StartedAt and EndedAt bound the publishing, in UTC.
	StartedAt time.Time `json:"started_at,omitzero"`
	EndedAt   time.Time `json:"ended_at,omitzero"`
	Error     string    `json:"error,omitempty"`
}

// probeTool is the tool of the probe's fingerprints: no env has it, so they match no
// step of the run; they only make the workers' sets non-empty, as a real stack's are.
const probeTool = "loadtest.probe"

// probeThreats waits for the demo at httpAddr to be ready, connects to its NATS at
// natsURL and publishes a new fingerprint every every, reading the demo's propagation
// histogram twice a second, until stop closes (the demo has exited) or ctx ends.
func probeThreats(ctx context.Context, stop <-chan struct{}, natsURL, httpAddr string, every time.Duration) threatResult {
	r := threatResult{Every: every}
	fail := func(err error) threatResult {
		r.Error = err.Error()
		return r
	}
	if err := waitReady(ctx, stop, httpAddr); err != nil {
		return fail(err)
	}
	log := slog.New(slog.DiscardHandler)
	b, err := bus.Connect(natsURL, "loadtest-threats", log)
	if err != nil {
		return fail(fmt.Errorf("connect to the demo's NATS: %w", err))
	}
	defer b.Close()
	w := threats.NewWatcher(b.JS, noop.NewMeterProvider().Meter("loadtest"), "loadtest", log)
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = w.Start(sctx)
	cancel()
	if err != nil {
		return fail(err)
	}
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go w.Run(wctx)

	client := &http.Client{Timeout: 2 * time.Second}
	publish := time.NewTicker(every)
	defer publish.Stop()
	read := time.NewTicker(500 * time.Millisecond)
	defer read.Stop()
	r.StartedAt = time.Now().UTC()
	var last histogram
	for {
		select {
		case <-publish.C:
			cmd := "probe " + word(r.Published)
			w.Record(&threats.Fingerprint{ID: threats.ID(threats.Key(probeTool, cmd)), Tool: probeTool, Command: cmd,
				Run: "loadtest", Worker: "loadtest"})
			r.Published++
			continue
		case <-read.C:
			if h, err := readPropagation(client, httpAddr); err == nil {
				last = h
			}
			continue
		case <-stop:
		case <-ctx.Done():
		}
		break
	}
	r.EndedAt = time.Now().UTC()
	r.Learned = last.count
	r.P50Ms, r.P99Ms = last.quantileMs(0.5), last.quantileMs(0.99)
	if last.count > 0 {
		r.MeanMs = last.sum / float64(last.count) * 1e3
	} else {
		r.Error = "the demo's workers learned no fingerprint"
	}
	return r
}

// word is n in letters (a, b, …, z, aa, …): the commands differ by more than a
// number, which Normalise would fold.
func word(n uint64) string {
	s := ""
	for n++; n > 0; n = (n - 1) / 26 {
		s = string(rune('a'+(n-1)%26)) + s
	}
	return s
}

// waitReady waits until the demo's /ready answers 200.
func waitReady(ctx context.Context, stop <-chan struct{}, addr string) error {
	client := &http.Client{Timeout: 2 * time.Second}
	for {
		resp, err := client.Get("http://" + addr + "/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-stop:
			return errors.New("the run ended before the stack was ready")
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// histogram is a Prometheus histogram as /metrics shows it: cumulative bucket counts,
// summed over the series (one per worker module).
type histogram struct {
	le    []float64
	cum   []uint64
	count uint64
	sum   float64
}

// quantileMs is the upper bound of the bucket holding quantile q, in milliseconds; -1
// for the +Inf bucket, 0 for an empty histogram.
func (h histogram) quantileMs(q float64) float64 {
	if h.count == 0 {
		return 0
	}
	want := uint64(math.Ceil(q * float64(h.count)))
	for i, c := range h.cum {
		if c >= want {
			if math.IsInf(h.le[i], 1) {
				return -1
			}
			return h.le[i] * 1e3
		}
	}
	return -1
}

var propagationLine = regexp.MustCompile(`^gauntlet_worker_threat_propagation_seconds_(bucket|count|sum)(?:\{(?:.*le="([^"]+)")?.*\})? ([0-9.e+-]+|\+Inf)$`)

func readPropagation(client *http.Client, addr string) (histogram, error) {
	resp, err := client.Get("http://" + addr + "/metrics")
	if err != nil {
		return histogram{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return histogram{}, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	return parsePropagation(resp.Body)
}

// parsePropagation reads the workers' propagation histogram from a /metrics page.
func parsePropagation(body io.Reader) (histogram, error) {
	var h histogram
	at := map[float64]int{}
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		m := propagationLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		v, err := strconv.ParseFloat(m[3], 64)
		if err != nil {
			return histogram{}, fmt.Errorf("metrics line %q: %w", sc.Text(), err)
		}
		switch m[1] {
		case "bucket":
			le, err := strconv.ParseFloat(m[2], 64) // "+Inf" parses as +Inf
			if err != nil {
				return histogram{}, fmt.Errorf("metrics line %q: %w", sc.Text(), err)
			}
			i, ok := at[le]
			if !ok {
				i = len(h.le)
				at[le] = i
				h.le, h.cum = append(h.le, le), append(h.cum, 0)
			}
			h.cum[i] += uint64(v)
		case "count":
			h.count += uint64(v)
		case "sum":
			h.sum += v
		}
	}
	return h, sc.Err()
}
