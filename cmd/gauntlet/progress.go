package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gauntlet-rl/gauntlet/pkg/runs"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

func progressFromKV(ctx context.Context, kv jetstream.KeyValue, runID string) *gauntletv1.RunProgress {
	e, err := kv.Get(ctx, runID)
	if err != nil {
		return nil
	}
	p, err := gauntletv1.DecodeRunProgress(e.Value())
	if err != nil {
		return nil
	}
	return p
}

// progressBar renders run progress: redrawn in place on a terminal, a line every few
// seconds elsewhere (CI logs).
type progressBar struct {
	w        io.Writer
	tty      bool
	t0       time.Time
	last     time.Time
	lastLine time.Time
	prev     *gauntletv1.RunProgress
	epRate   float64
	stepRate float64
	drawn    bool
}

func newProgressBar(w io.Writer) *progressBar {
	now := time.Now()
	return &progressBar{w: w, tty: isTerminal(w), t0: now, last: now}
}

func (b *progressBar) update(p *gauntletv1.RunProgress) {
	now := time.Now()
	if b.prev != nil && p.Ended < b.prev.Ended {
		return // an older message arriving late
	}
	if dt := now.Sub(b.last).Seconds(); b.prev != nil && dt > 0.2 {
		ep := float64(p.Ended-b.prev.Ended) / dt
		st := float64(p.Steps-b.prev.Steps) / dt
		// Exponential smoothing over about a second.
		a := min(1, dt)
		b.epRate += a * (ep - b.epRate)
		b.stepRate += a * (st - b.stepRate)
		b.prev, b.last = p, now
	} else if b.prev == nil {
		b.prev, b.last = p, now
	}
	if !b.tty && now.Sub(b.lastLine) < 3*time.Second && !p.Done {
		return
	}
	b.lastLine = now
	line := b.render(p)
	if b.tty {
		fmt.Fprintf(b.w, "\r%s\x1b[K", line)
		b.drawn = true
	} else {
		fmt.Fprintln(b.w, line)
	}
}

func (b *progressBar) render(p *gauntletv1.RunProgress) string {
	const width = 24
	frac := 0.0
	if p.Episodes > 0 {
		frac = float64(p.Ended) / float64(p.Episodes)
	}
	n := int(frac * width)
	bar := strings.Repeat("#", n) + strings.Repeat("-", width-n)
	return fmt.Sprintf("[%s] %3.0f%% %s/%s ep | %s ep/s | %s steps/s | success %.1f%% | faults %s | infra %d | %s",
		bar, 100*frac, commas(p.Ended), commas(p.Episodes), commas(uint64(b.epRate)), commas(uint64(b.stepRate)),
		100*runs.SuccessRate(p), commas(p.FaultsFired), p.InfraErrors, time.Since(b.t0).Round(time.Second))
}

func (b *progressBar) finish() {
	if b.tty && b.drawn {
		fmt.Fprintln(b.w)
	}
}

// commas formats 1234567 as 1,234,567.
func commas(n uint64) string {
	s := fmt.Sprint(n)
	var out []byte
	for i := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	return string(out)
}
