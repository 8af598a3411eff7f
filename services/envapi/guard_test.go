package envapi

import (
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/play"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

func TestBackoffBlocksAfterLimitThenForgives(t *testing.T) {
	b := newBackoff(3, time.Minute)
	t0 := time.Now()
	if b.active() {
		t.Error("active with no failures")
	}
	for i := range 2 {
		if _, blocked := b.fail("a", t0); blocked {
			t.Fatalf("blocked after %d failures", i+1)
		}
	}
	if b.refusing("a", t0) != 0 {
		t.Error("refusing before the limit")
	}
	if n, blocked := b.fail("a", t0); !blocked || n != 3 {
		t.Fatalf("third failure: %d %v, want a block", n, blocked)
	}
	if !b.active() || b.refusing("a", t0.Add(30*time.Second)) != 30*time.Second {
		t.Errorf("refusing a 30 s into its block = %v", b.refusing("a", t0.Add(30*time.Second)))
	}
	if b.refusing("b", t0) != 0 {
		t.Error("another address is refused")
	}
	if b.refusing("a", t0.Add(time.Minute)) != 0 {
		t.Error("still refused after the block")
	}
	// Failures spread wider than the window never block.
	for i := range 10 {
		if _, blocked := b.fail("c", t0.Add(time.Duration(i)*61*time.Second)); blocked {
			t.Fatalf("blocked for failures a minute apart (%d)", i)
		}
	}
	off := newBackoff(0, time.Minute)
	if _, blocked := off.fail("a", t0); blocked || off.active() {
		t.Error("a back-off of 0 failures blocks")
	}
}

func TestLimitListenerCapsPerHostAndTotal(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := newLimitListener(inner, 3, 2)
	defer l.Close()
	accepted := make(chan net.Conn, 10)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	dial := func(host string) net.Conn {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(host)}}
		c, err := d.Dial("tcp", inner.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	recv := func() net.Conn {
		select {
		case c := <-accepted:
			return c
		case <-time.After(300 * time.Millisecond):
			return nil
		}
	}
	dial("127.0.0.2")
	dial("127.0.0.2")
	a1, a2 := recv(), recv()
	if a1 == nil || a2 == nil {
		t.Fatal("two connections from one host not accepted")
	}
	// A third from the same host is closed by the listener, not handed out.
	c3 := dial("127.0.0.2")
	if recv() != nil {
		t.Error("a third connection from one host was accepted")
	}
	_ = c3.SetReadDeadline(time.Now().Add(time.Second))
	if _, err := c3.Read(make([]byte, 1)); err == nil {
		t.Error("the connection over the per-host cap is still open")
	}
	// Another host takes the last slot; then Accept waits for one to close.
	dial("127.0.0.3")
	b1 := recv()
	if b1 == nil {
		t.Fatal("a connection from another host not accepted")
	}
	dial("127.0.0.4")
	if recv() != nil {
		t.Error("a connection past the total cap was accepted")
	}
	_ = a1.Close()
	if recv() == nil {
		t.Error("a waiting connection was not accepted when a slot freed")
	}
	_ = a2.Close()
	_ = b1.Close()
}

// Size refusals are 413 over HTTP; quota refusals, which carry Retry-After, stay 429.
func TestSizeStatus(t *testing.T) {
	for _, c := range []struct {
		retryAfter string
		code, want int
	}{{"", 429, 413}, {"1", 429, 429}, {"", 200, 200}, {"", 400, 400}} {
		rec := httptest.NewRecorder()
		w := &sizeStatus{ResponseWriter: rec}
		if c.retryAfter != "" {
			w.Header().Set("Retry-After", c.retryAfter)
		}
		w.WriteHeader(c.code)
		if rec.Code != c.want {
			t.Errorf("WriteHeader(%d) with Retry-After %q wrote %d, want %d", c.code, c.retryAfter, rec.Code, c.want)
		}
	}
	if http.NewResponseController(&sizeStatus{ResponseWriter: httptest.NewRecorder()}).Flush() != nil {
		t.Error("Flush does not reach the connection's writer")
	}
}

// BenchmarkGuard is the guard's cost on an authenticated Connect/JSON step.
func BenchmarkGuard(b *testing.B) {
	tok, _ := ParseTokens([]byte("tenants:\n  - name: x\n    tokens: [0123456789abcdef]\n"))
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if tenantOf(r.Context()) == nil {
			b.Fatal("no tenant")
		}
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusOK)
	})
	g := &guard{auth: auth{tokens: tok}, backoff: newBackoff(20, time.Minute), small: next, step: next, batch: next, batchMax: 64 << 20}
	body := strings.NewReader(`{"episodeId":"e","action":{"tool":"catalog.search","argsJson":"{}"}}`)
	r := httptest.NewRequest("POST", "/gauntlet.v1.EnvService/Step", body)
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Authorization", "Bearer 0123456789abcdef")
	w := httptest.NewRecorder()
	b.ReportAllocs()
	for b.Loop() {
		body.Seek(0, io.SeekStart)
		r.Body = io.NopCloser(body)
		g.ServeHTTP(w, r)
	}
}

// The Step cap fits the largest Step the API accepts, in JSON (where it is largest) and
// in protobuf, and is under a 12 MB action.
func TestStepBodyMaxFitsTheLargestStep(t *testing.T) {
	n := play.MaxTrainerTokens
	td := &gauntletv1.TrainerData{CompletionTokenIds: make([]uint32, n), Logprobs: make([]float32, n),
		PolicyVersion: strings.Repeat("\x01", maxPolicyVersion)}
	for i := range n {
		td.CompletionTokenIds[i], td.Logprobs[i] = math.MaxUint32, -1.1754944e-38
	}
	req := &gauntletv1.StepRequest{EpisodeId: strings.Repeat("e", 64), Trainer: td,
		Action: &gauntletv1.Action{Tool: "catalog.search", ArgsJson: strings.Repeat("\x01", env.MaxArgsBytes)}}
	js, err := protojson.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	if len(js) > stepBodyMax || proto.Size(req) > stepBodyMax {
		t.Errorf("the largest Step is %d bytes in JSON, %d in protobuf; the cap %d", len(js), proto.Size(req), stepBodyMax)
	}
	if stepBodyMax >= 12_000_000 {
		t.Errorf("the Step cap %d lets a 12 MB action through", stepBodyMax)
	}
	t.Logf("largest Step: %d bytes in JSON, %d in protobuf; cap %d", len(js), proto.Size(req), stepBodyMax)
}
