package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// heapSample is the child's live heap at one moment: the Go heap right after a forced
// collection, so what is still referenced, not the garbage the collector has yet to
// reclaim. Sampled through /debug/pprof/heap?gc=1&debug=1, whose text form ends with the
// runtime's MemStats as read after that collection.
type heapSample struct {
	Seconds float64 `json:"t_s"`
	// Episodes is gauntlet_worker_episodes_total (all reasons) at the same moment.
	Episodes uint64 `json:"episodes"`
	// HeapAlloc is the live heap in bytes; HeapSys what the runtime holds from the OS for
	// the heap.
	HeapAlloc uint64 `json:"heap_alloc_bytes"`
	HeapSys   uint64 `json:"heap_sys_bytes"`
}

// sampleLiveHeap samples the child's live heap every interval until stop closes. A
// sample that fails (the stack still starting, or stopping) is skipped.
func sampleLiveHeap(ctx context.Context, stop <-chan struct{}, addr string, t0 time.Time, every time.Duration) []heapSample {
	client := &http.Client{Timeout: 30 * time.Second}
	var out []heapSample
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return out
		case <-ctx.Done():
			return out
		case <-tick.C:
		}
		s, err := liveHeap(client, addr)
		if err != nil {
			continue
		}
		s.Seconds = time.Since(t0).Seconds()
		s.Episodes, _ = episodesDone(client, addr)
		out = append(out, s)
	}
}

func liveHeap(client *http.Client, addr string) (heapSample, error) {
	var s heapSample
	resp, err := client.Get("http://" + addr + "/debug/pprof/heap?gc=1&debug=1")
	if err != nil {
		return s, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return s, fmt.Errorf("GET /debug/pprof/heap: %s", resp.Status)
	}
	return parseMemStats(resp.Body)
}

// parseMemStats reads "# HeapAlloc = N" and "# HeapSys = N" from a debug=1 heap profile.
func parseMemStats(r io.Reader) (heapSample, error) {
	var s heapSample
	found := 0
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		for _, f := range []struct {
			prefix string
			dst    *uint64
		}{{"# HeapAlloc = ", &s.HeapAlloc}, {"# HeapSys = ", &s.HeapSys}} {
			if v, ok := strings.CutPrefix(line, f.prefix); ok {
				n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
				if err != nil {
					return s, fmt.Errorf("heap profile: %q: %w", line, err)
				}
				*f.dst = n
				found++
			}
		}
	}
	if err := sc.Err(); err != nil {
		return s, err
	}
	if found < 2 {
		return s, fmt.Errorf("heap profile without HeapAlloc and HeapSys")
	}
	return s, nil
}

// episodesDone sums gauntlet_worker_episodes_total over its reasons from /metrics.
func episodesDone(client *http.Client, addr string) (uint64, error) {
	resp, err := client.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	return sumMetric(resp.Body, "gauntlet_worker_episodes_total")
}

// sumMetric adds up every sample of a metric in Prometheus text format.
func sumMetric(r io.Reader, name string) (uint64, error) {
	var total float64
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) {
			continue
		}
		rest := line[len(name):]
		if rest == "" || (rest[0] != '{' && rest[0] != ' ') {
			continue // another metric sharing the prefix
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return 0, fmt.Errorf("metrics: %q: %w", line, err)
		}
		total += v
	}
	return uint64(total), sc.Err()
}

// liveHeapSlope fits live heap = a + b × episodes by least squares over the samples past
// the first 10 % of the episodes, and returns b in bytes per episode.
func liveHeapSlope(samples []heapSample) (slope float64, n int, ok bool) {
	if len(samples) == 0 {
		return 0, 0, false
	}
	last := samples[len(samples)-1].Episodes
	var sx, sy, sxx, sxy float64
	for _, s := range samples {
		if s.Episodes*10 < last || s.Episodes == 0 {
			continue
		}
		x, y := float64(s.Episodes), float64(s.HeapAlloc)
		sx, sy, sxx, sxy = sx+x, sy+y, sxx+x*x, sxy+x*y
		n++
	}
	den := float64(n)*sxx - sx*sx
	if n < 3 || den == 0 {
		return 0, n, false
	}
	return (float64(n)*sxy - sx*sy) / den, n, true
}
