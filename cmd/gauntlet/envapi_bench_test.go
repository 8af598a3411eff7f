package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	connectrpc "connectrpc.com/connect"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/play"
	"github.com/gauntlet-rl/gauntlet/pkg/telemetry"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// benchAction is the step every env API benchmark plays: a read of the simulated payment
// service (faults of the episode's plan apply), valid in every state of a shop episode.
var benchAction = env.Action{Tool: "wallet.balance", Args: json.RawMessage(`{}`)}

const envapiBenchEpisodes = 256

// BenchmarkEnvAPI measures, on one stack (env API, faults, reward; NATS embedded; no
// store, so ClickHouse does not compete for the CPU), side by side:
//
//   - inproc-env: the shop env's own step rate (play.ApplyStep), no pipeline;
//   - inproc-pipeline: 256 play.Sessions stepped by 256 goroutines in this process, the
//     full step path (env, reward RPC, event publish) without the API;
//   - grpc-step, json-step: one Step at a time over gRPC and Connect/JSON (p50/p99);
//   - batched-grpc, batched-json: StepBatch over 256 episodes.
//
// Run: go test -run '^$' -bench BenchmarkEnvAPI -benchtime 20000x ./cmd/gauntlet
func BenchmarkEnvAPI(b *testing.B) {
	cfg := testConfig(b)
	tokens := b.TempDir() + "/tenants.yaml"
	if err := os.WriteFile(tokens, []byte("tenants:\n  - name: bench\n    tokens: ["+tokenAcme+"]\n    max_episodes: 1024\n"), 0o600); err != nil {
		b.Fatal(err)
	}
	cfg.EnvAPI.TokensFile = tokens
	s := startStack(b, cfg, modEnvAPI, modFaults, modReward)
	addr := s.app.envapi.Addr()
	ctx := context.Background()
	grpc := grpcClient(addr, tokenAcme)
	shop, _ := env.Lookup("shop")

	b.Run("inproc-env", func(b *testing.B) {
		ep, err := shop.NewEpisode(env.Config{Seed: 1})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := ep.Reset(); err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			res, err := play.ApplyStep(ep, benchAction)
			if err != nil {
				b.Fatal(err)
			}
			if res.Done() {
				ep, _ = shop.NewEpisode(env.Config{Seed: uint64(i)})
				_, _ = ep.Reset()
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "steps/s")
	})

	b.Run("inproc-pipeline", func(b *testing.B) {
		busConn := s.app.busFor(modEnvAPI)
		tel, _ := telemetry.New("bench", "")
		scorer := play.NewScorer(busConn, 512, 4, tel.Meter("bench"), "bench")
		sctx, cancel := context.WithCancel(ctx)
		defer cancel()
		go scorer.Run(sctx)
		newSession := func(i int) *play.Session {
			req := &gauntletv1.EpisodeRequested{EpisodeId: fmt.Sprintf("bench-%d-%d", b.N, i), RunId: "bench", Env: "shop", Seed: uint64(i), Policy: "bench", RequestedAtUnixNano: time.Now().UnixNano()}
			var reply gauntletv1.PlanReply
			if err := busConn().Request(ctx, bus.SubjectPlan, &gauntletv1.PlanRequest{Episodes: []*gauntletv1.EpisodeRequested{req}}, &reply); err != nil || len(reply.Plans) != 1 {
				b.Fatalf("plan: %v %s", err, reply.Error)
			}
			sess := play.NewSession(&gauntletv1.EpisodeAssigned{Episode: req, Plan: reply.Plans[0]}, "bench", scorer,
				&play.Publisher{Bus: busConn(), Max: 32})
			if _, err := sess.Prepare(ctx, play.Deps{}); err != nil {
				b.Fatal(err)
			}
			if _, err := sess.Reset(ctx, 1); err != nil {
				b.Fatal(err)
			}
			return sess
		}
		sessions := make([]*play.Session, envapiBenchEpisodes)
		for i := range sessions {
			sessions[i] = newSession(i)
		}
		per := (b.N + envapiBenchEpisodes - 1) / envapiBenchEpisodes
		b.ResetTimer()
		var wg sync.WaitGroup
		for i := range sessions {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range per {
					if sessions[i].Done() {
						_ = sessions[i].Finish(ctx)
						sessions[i] = newSession(i + envapiBenchEpisodes*int(sessions[i].Steps()+1))
					}
					if _, _, err := sessions[i].Step(ctx, benchAction, nil); err != nil {
						b.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		b.ReportMetric(float64(per*envapiBenchEpisodes)/b.Elapsed().Seconds(), "steps/s")
	})

	reset := func(b *testing.B) string {
		r, err := grpc.Reset(ctx, connectrpc.NewRequest(&gauntletv1.ResetRequest{Env: "shop", Seed: 9, Profile: "baseline"}))
		if err != nil {
			b.Fatal(err)
		}
		return r.Msg.EpisodeId
	}
	latencies := func(b *testing.B, lat []time.Duration) {
		slices.Sort(lat)
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
		b.ReportMetric(float64(len(lat))/b.Elapsed().Seconds(), "steps/s")
	}

	b.Run("grpc-step", func(b *testing.B) {
		id := reset(b)
		lat := make([]time.Duration, 0, b.N)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			t0 := time.Now()
			r, err := grpc.Step(ctx, connectrpc.NewRequest(&gauntletv1.StepRequest{EpisodeId: id, Action: &gauntletv1.Action{Tool: benchAction.Tool, ArgsJson: "{}"}}))
			lat = append(lat, time.Since(t0))
			if err != nil {
				b.Fatal(err)
			}
			if r.Msg.Terminated || r.Msg.Truncated {
				b.StopTimer()
				id = reset(b)
				b.StartTimer()
			}
		}
		latencies(b, lat)
	})

	b.Run("json-step", func(b *testing.B) {
		id := reset(b)
		lat := make([]time.Duration, 0, b.N)
		client := &http.Client{}
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			body := `{"episodeId":"` + id + `","action":{"tool":"wallet.balance","argsJson":"{}"}}`
			req, _ := http.NewRequest("POST", "http://"+addr+"/gauntlet.v1.EnvService/Step", bytes.NewReader([]byte(body)))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer "+tokenAcme)
			t0 := time.Now()
			resp, err := client.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			var out struct{ Terminated, Truncated bool }
			err = json.NewDecoder(resp.Body).Decode(&out)
			resp.Body.Close()
			lat = append(lat, time.Since(t0))
			if err != nil || resp.StatusCode != 200 {
				b.Fatalf("HTTP %d: %v", resp.StatusCode, err)
			}
			if out.Terminated || out.Truncated {
				b.StopTimer()
				id = reset(b)
				b.StartTimer()
			}
		}
		latencies(b, lat)
	})

	batched := func(b *testing.B, step func(*gauntletv1.StepBatchRequest) []*gauntletv1.StepResult) {
		ids := make([]string, envapiBenchEpisodes)
		for i := range ids {
			ids[i] = reset(b)
		}
		steps := 0
		b.ResetTimer()
		for steps < b.N {
			req := &gauntletv1.StepBatchRequest{}
			for _, id := range ids {
				req.Steps = append(req.Steps, &gauntletv1.StepRequest{EpisodeId: id, Action: &gauntletv1.Action{Tool: benchAction.Tool, ArgsJson: "{}"}})
			}
			for _, r := range step(req) {
				if r.Error != nil {
					b.Fatalf("%s: %v", r.EpisodeId, r.Error)
				}
				steps++
				if r.Terminated || r.Truncated {
					i := slices.Index(ids, r.EpisodeId)
					ids[i] = reset(b)
				}
			}
		}
		b.ReportMetric(float64(steps)/b.Elapsed().Seconds(), "steps/s")
		for _, id := range ids {
			_, _ = grpc.Close(ctx, connectrpc.NewRequest(&gauntletv1.CloseRequest{EpisodeId: id}))
		}
	}
	b.Run("batched-grpc", func(b *testing.B) {
		batched(b, func(req *gauntletv1.StepBatchRequest) []*gauntletv1.StepResult {
			r, err := grpc.StepBatch(ctx, connectrpc.NewRequest(req))
			if err != nil {
				b.Fatal(err)
			}
			return r.Msg.Results
		})
	})
	b.Run("batched-json", func(b *testing.B) {
		jsonClient := gauntletv1connectClientJSON(addr, tokenAcme)
		batched(b, func(req *gauntletv1.StepBatchRequest) []*gauntletv1.StepResult {
			r, err := jsonClient.StepBatch(ctx, connectrpc.NewRequest(req))
			if err != nil {
				b.Fatal(err)
			}
			return r.Msg.Results
		})
	})
}
