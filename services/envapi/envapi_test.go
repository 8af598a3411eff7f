package envapi

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

func TestParseTokensReportsEveryProblem(t *testing.T) {
	_, err := ParseTokens([]byte(`tenants:
  - name: a.b
    tokens: [aaaaaaaaaaaaaaaaaaaa]
  - name: ok
    tokens: [short]
    max_episodes: -1
  - name: ok
    tokens: []
  - name: dup
    tokens: [bbbbbbbbbbbbbbbbbbbb, bbbbbbbbbbbbbbbbbbbb]
`))
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{
		"tenants[0].name", "tenants[1].tokens[0]: 5 characters", "tenants[1].max_episodes", "tenants[2].name: \"ok\" appears twice",
		"tenants[2].tokens: at least one", "tenants[3].tokens[1]: the token is used twice",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	if _, err := ParseTokens([]byte("tenants:\n  - name: x\n    tokenz: [y]\n")); err == nil || !strings.Contains(err.Error(), "tokenz") {
		t.Errorf("unknown key: %v", err)
	}
	tok, err := ParseTokens([]byte("tenants:\n  - name: x\n    tokens: [0123456789abcdef]\n    max_episodes: 3\n"))
	if err != nil {
		t.Fatal(err)
	}
	if ten := tok.Lookup("0123456789abcdef"); ten == nil || ten.Name != "x" || ten.MaxEpisodes != 3 {
		t.Errorf("Lookup = %+v", ten)
	}
	if tok.Lookup("") != nil || tok.Lookup("0123456789abcdeF") != nil {
		t.Error("Lookup found a tenant for a wrong token")
	}
}

func TestAuthHeader(t *testing.T) {
	tok, _ := ParseTokens([]byte("tenants:\n  - name: x\n    tokens: [0123456789abcdef]\n"))
	a := auth{tokens: tok}
	for h, want := range map[string]string{
		"":                        "missing Authorization",
		"Basic abc":               "must be \"Bearer <token>\"",
		"Bearer nope":             "unknown API token",
		"Bearer 0123456789abcdef": "",
	} {
		hdr := http.Header{}
		if h != "" {
			hdr.Set("Authorization", h)
		}
		ten, err := a.tenant(hdr)
		if want == "" {
			if err != nil || ten.Name != "x" {
				t.Errorf("%q: %v %v", h, ten, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), want) || !strings.HasPrefix(err.Error(), "unauthenticated") {
			t.Errorf("%q: error %v, want unauthenticated mentioning %q", h, err, want)
		}
	}
}

func TestConfigValidateNamesFlags(t *testing.T) {
	err := Config{}.Validate()
	for _, want := range []string{"envapi.addr", "envapi.tokens", "envapi.max-episodes", "envapi.server-max-episodes",
		"envapi.max-conns", "envapi.max-conns-per-host", "envapi.max-batch-bytes", "envapi.read-timeout",
		"envapi.step-timeout", "envapi.start-timeout", "envapi.episode-timeout", "envapi.idle-timeout", "envapi.segment-steps", "envapi.score-batch"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate error lacks %s: %v", want, err)
		}
	}
}

// TestCollectorHandsOffToInbox races results against a call letting go of them: every
// result ends up either returned by the call or in the inbox, exactly once.
func TestCollectorHandsOffToInbox(t *testing.T) {
	for round := range 50 {
		box := newInbox()
		c := &collector{box: box, changed: make(chan struct{})}
		const n = 64
		box.inflight = n
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c.put(&gauntletv1.StepResult{Step: uint32(i)})
			}()
		}
		got, _ := c.take()
		got = append(got, c.handOff()...)
		wg.Wait()
		got = append(got, box.wait(context.Background(), n-len(got), 0, time.Second)...)
		seen := map[uint32]bool{}
		for _, r := range got {
			if seen[r.Step] {
				t.Fatalf("round %d: result %d twice", round, r.Step)
			}
			seen[r.Step] = true
		}
		if len(seen) != n || box.pending() != 0 {
			t.Fatalf("round %d: %d results, %d pending", round, len(seen), box.pending())
		}
	}
}

func TestInboxWaitTimesOut(t *testing.T) {
	box := newInbox()
	t0 := time.Now()
	if got := box.wait(context.Background(), 1, 0, 50*time.Millisecond); len(got) != 0 || time.Since(t0) < 50*time.Millisecond {
		t.Errorf("wait on an empty inbox = %v after %v", got, time.Since(t0))
	}
}

// A step waits out the server's own hold on an episode (the reaper flushing its steps,
// Close) instead of refusing as "already in flight"; only a second concurrent step of the
// same episode is refused. Here the episode is over, so a step that gets through answers
// "is over".
func TestStepWaitsForHousekeepingButNotForAnotherStep(t *testing.T) {
	ten := &Tenant{Name: "acme"}
	e := &episode{id: "e1", tenant: ten.Name, over: true}
	s := &Service{live: map[string]*episode{"e1": e}, ended: map[string]*tombstone{}}
	req := &gauntletv1.StepRequest{EpisodeId: "e1", Action: &gauntletv1.Action{Tool: "wait"}}

	e.mu.Lock() // housekeeping
	done := make(chan error, 1)
	go func() { _, err := s.step(context.Background(), ten, req); done <- err }()
	time.Sleep(50 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("step during housekeeping answered at once (%v), want it to wait", err)
	default:
	}
	e.mu.Unlock()
	if err := <-done; err == nil || !strings.Contains(err.Error(), "is over") {
		t.Errorf("step during housekeeping: %v, want it to wait and answer that the episode is over", err)
	}

	e.stepping.Store(true) // a step in flight
	_, err := s.step(context.Background(), ten, req)
	if err == nil || !strings.Contains(err.Error(), "already in flight") {
		t.Errorf("concurrent step: %v, want already in flight", err)
	}
}
