package scoring_test

import (
	"math/rand/v2"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/scoring"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// BenchmarkScoreRequests is a step's whole trip through scoring, NATS aside: the worker
// encodes a batch of steps of episodes in flight (under a named spec, as pkg/play's
// Scorer sends them once the spec said it reads no action: the spec's digest once, each
// step's index, each episode's state in its wire form), the reward service decodes it,
// scores it (TableEncodedStates) and encodes the reply, and the worker decodes the reply
// and reads each step's score (LeanStepScores, as the Scorer does), keeping each
// episode's encoded state for its next step. req-B/step and reply-B/step are the messages' sizes. The steps are a shop episode's: reads
// and writes making progress, spend against a budget, now and then an invalid action or
// a violated precondition, the last step a success. One op is one batch; steps/op says
// how many it holds.
func BenchmarkScoreRequests(b *testing.B) {
	const episodes, length = 64, 18
	rng := rand.New(rand.NewPCG(1, 2))
	stream := make([][]*gauntletv1.StepTaken, episodes) // stream[e][i]: episode e's step i
	for e := range stream {
		progress := 0.0
		for i := range length {
			delta := 0.0
			if rng.IntN(3) == 0 {
				delta = 1.0 / 6
			}
			progress += delta
			sig := &gauntletv1.Signals{Progress: progress, ProgressDelta: delta, Budget: 200, DeadlineVirtualNs: 60e9}
			if rng.IntN(4) == 0 {
				sig.Spend = float64(rng.IntN(50))
			}
			if rng.IntN(10) == 0 {
				sig.InvalidAction = true
			}
			if rng.IntN(12) == 0 {
				sig.Violations = []*gauntletv1.CausalViolation{{Rule: "stock", Reason: "out of stock"}}
			}
			last := i == length-1
			sig.Success = last
			stream[e] = append(stream[e], &gauntletv1.StepTaken{
				EpisodeId: "r1-" + string(rune('a'+e%26)) + string(rune('a'+e/26)), Step: uint32(i), Env: "shop",
				Signals: sig, Terminated: last,
				Metering: &gauntletv1.Metering{ToolCalls: 1, VirtualNs: uint64(20e6 + rng.IntN(80e6)), WallNs: uint64(rng.IntN(1e6))},
			})
		}
	}
	named := mustParse(b, eightComponents)
	for _, tc := range []struct {
		name string
		spec *scoring.Spec // nil: the env's default, as a run that names no spec
	}{{"default", nil}, {"eight-with-three-cel", &named}} {
		b.Run(tc.name, func(b *testing.B) {
			specFor := func(env, digest string) scoring.Spec {
				if tc.spec != nil && digest == tc.spec.Digest {
					return *tc.spec
				}
				return scoring.SpecFor(env)
			}
			states := make([][]byte, episodes)
			var reqBytes, replyBytes int
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if i%length == 0 { // the next episodes start
					clear(states)
				}
				// The worker's request.
				req := &gauntletv1.ScoreRequest{Steps: make([]*gauntletv1.StepTaken, episodes)}
				for e := range episodes {
					st := stream[e][i%length]
					req.Steps[e] = &gauntletv1.StepTaken{EpisodeId: st.EpisodeId, Step: st.Step, Env: st.Env, Signals: st.Signals, Metering: st.Metering}
					if tc.spec != nil {
						if req.EncodedStates == nil {
							req.EncodedStates, req.SpecOf = make([][]byte, episodes), make([]uint32, episodes)
							req.SpecDigests = []string{tc.spec.Digest}
						}
						req.SpecOf[e], req.Steps[e].Terminated = 1, st.Terminated
						req.EncodedStates[e] = states[e]
					}
				}
				data, err := gauntletv1.Marshal(req)
				if err != nil {
					b.Fatal(err)
				}
				// The reward service.
				var in gauntletv1.ScoreRequest
				if err := gauntletv1.UnmarshalAliasing(data, &in); err != nil {
					b.Fatal(err)
				}
				var table *gauntletv1.ScoreTable
				if tc.spec == nil {
					table = scoring.Table(scoring.SpecFor, in.Steps)
				} else {
					for e, k := range in.SpecOf { // the reward service's checkRequest
						in.Steps[e].RewardSpec = in.SpecDigests[k-1]
					}
					if table, err = scoring.TableEncodedStates(specFor, in.Steps, in.EncodedStates); err != nil {
						b.Fatal(err)
					}
				}
				out, err := gauntletv1.Marshal(&gauntletv1.ScoreReply{Table: table})
				if err != nil {
					b.Fatal(err)
				}
				// The worker reads the reply.
				var reply gauntletv1.ScoreReply
				if err := gauntletv1.UnmarshalAliasing(out, &reply); err != nil {
					b.Fatal(err)
				}
				if _, err := reply.LeanStepScores(req.Steps); err != nil {
					b.Fatal(err)
				}
				if tc.spec != nil {
					copy(states, reply.Table.EncodedStates)
				}
				reqBytes, replyBytes = reqBytes+len(data), replyBytes+len(out)
				i++
			}
			b.ReportMetric(episodes, "steps/op")
			b.ReportMetric(float64(reqBytes)/float64(i*episodes), "req-B/step")
			b.ReportMetric(float64(replyBytes)/float64(i*episodes), "reply-B/step")
		})
	}
}
