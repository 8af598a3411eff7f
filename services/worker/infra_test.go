package worker

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/policy"
	"github.com/gauntlet-rl/gauntlet/pkg/policy/httppolicy"
	"github.com/gauntlet-rl/gauntlet/pkg/runs"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// flakyModel is a stand-in for an OpenAI-compatible endpoint (outside the product) that
// fails every second call with a 503 and answers the others with a catalogue search.
type flakyModel struct{ calls atomic.Int32 }

func (m *flakyModel) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	if m.calls.Add(1)%2 == 0 {
		http.Error(w, `{"error":"overloaded"}`, http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"choices":[{"message":{"role":"assistant","content":"","tool_calls":[{"id":"c1","type":"function","function":{"name":"catalog__search","arguments":"{\"query\":\"mug\"}"}}]}}]}`)
}

// An http-policy run asks the endpoint its run names (the worker has none of its own);
// an endpoint that fails half its calls makes half the episodes infra errors of kind model
// endpoint, carrying no reward, and the others plain episodes with their rewards.
func TestModelEndpointFailuresAreInfraErrors(t *testing.T) {
	model := &flakyModel{}
	srv := httptest.NewServer(model)
	defer srv.Close()
	p, err := httppolicy.New(httppolicy.Config{Model: "m", Timeout: 10 * time.Second}) // no endpoint of its own
	if err != nil {
		t.Fatal(err)
	}
	b, _ := startWorkerWith(t, func(c *Config) { c.MaxDeliver, c.Policies = 1, policy.NewSet(p) })
	const episodes = 8
	r := &gauntletv1.RunRequested{RunId: "rflaky", Env: "shop", Seed: 5, Episodes: episodes, MaxSteps: 1, MaxInFlight: episodes,
		Policies:       []*gauntletv1.Share{{Name: httppolicy.Name, Weight: 1}},
		PolicyEndpoint: &gauntletv1.PolicyEndpoint{Url: srv.URL + "/v1", Model: "m"}}
	if err := runs.Validate(r); err != nil {
		t.Fatal(err)
	}
	a := &gauntletv1.Assignment{}
	for i := range uint64(episodes) {
		a.Episodes = append(a.Episodes, &gauntletv1.EpisodeAssigned{Episode: runs.Episode(r, i)})
	}
	if err := b.PublishCommand(context.Background(), bus.SubjectEpisode(r.RunId), r.RunId+"/assigned", a); err != nil {
		t.Fatal(err)
	}
	msgs := endedMessages(t, b, r.RunId)
	if n := model.calls.Load(); n != episodes {
		t.Errorf("the run's endpoint was asked %d times, want %d (one step each)", n, episodes)
	}
	var infra, played int
	for _, m := range msgs {
		// A batch of ends, or ends in segments: every end of the message.
		for _, end := range endsOf(m) {
			switch {
			case end.GetInfraError():
				infra++
				if end.GetInfraKind() != gauntletv1.InfraKind_INFRA_KIND_MODEL_ENDPOINT || end.GetTotalReward() != 0 ||
					end.GetSuccess() || !strings.Contains(end.GetError(), "endpoint answered 503") {
					t.Errorf("infra error end: kind %v, reward %v, success %v, error %q; want model endpoint, no reward, the 503",
						end.GetInfraKind(), end.GetTotalReward(), end.GetSuccess(), end.GetError())
				}
			default:
				played++
				if end.GetInfraKind() != gauntletv1.InfraKind_INFRA_KIND_UNSPECIFIED || end.GetSteps() != 1 {
					t.Errorf("played end: kind %v, %d steps", end.GetInfraKind(), end.GetSteps())
				}
			}
		}
	}
	if infra != episodes/2 || played != episodes/2 {
		t.Errorf("%d infra errors and %d played episodes, want %d of each", infra, played, episodes/2)
	}
}

// endsOf returns the episode ends an event carries: itself, a segment's end, or a batch's.
func endsOf(ev *gauntletv1.Event) []*gauntletv1.EpisodeEnded {
	if b := ev.GetBatch(); b != nil {
		var out []*gauntletv1.EpisodeEnded
		for _, e := range b.GetEvents() {
			out = append(out, endsOf(e)...)
		}
		return out
	}
	if e := ev.EpisodeEnd(); e != nil {
		return []*gauntletv1.EpisodeEnded{e}
	}
	return nil
}
