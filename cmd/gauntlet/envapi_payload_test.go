package main

import (
	"context"
	"fmt"
	"strings"
	"testing"

	connectrpc "connectrpc.com/connect"

	"github.com/gauntlet-rl/gauntlet/pkg/play"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// An episode over the env API whose action is larger than NATS's 8 MiB payload limit is
// recorded whole in ClickHouse, its arguments cut to a marked prefix, and Close succeeds
// at once (it used to answer 503, then 200, and the episode never reached ClickHouse).
func TestEnvAPIRecordsOversizedActions(t *testing.T) {
	s, cfg := envAPIStack(t)
	conn := connect(t, s.app.clickHouseAddr(), cfg.Database)
	ctx := context.Background()
	acme := grpcClient(s.app.envapi.Addr(), tokenAcme)

	reset, err := acme.Reset(ctx, connectrpc.NewRequest(&gauntletv1.ResetRequest{Env: "shop", Seed: 3, Profile: "baseline"}))
	if err != nil {
		t.Fatal(err)
	}
	id := reset.Msg.EpisodeId
	huge := `{"query":"` + strings.Repeat("m", 9<<20) + `"}`
	for i, args := range []string{huge, `{"query":"mug"}`} {
		if _, err := acme.Step(ctx, connectrpc.NewRequest(&gauntletv1.StepRequest{EpisodeId: id,
			Action: &gauntletv1.Action{Tool: "catalog.search", ArgsJson: args}})); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
	c, err := acme.Close(ctx, connectrpc.NewRequest(&gauntletv1.CloseRequest{EpisodeId: id}))
	if err != nil || c.Msg.Steps != 2 {
		t.Fatalf("Close = %v, %v; want 2 steps and no error", c, err)
	}
	waitEpisodes(t, conn, cfg.Database, []string{id})
	got := queryOne(t, conn, fmt.Sprintf(`SELECT concat(toString(count()), ' ', toString(max(length(args))), ' ',
		toString(countIf(startsWith(args, '{"gauntlet_truncated":{"original_bytes":%d,'))))
		FROM %s.steps FINAL WHERE episode_id = '%s'`, len(huge), cfg.Database, id))
	var steps, longest, cut int
	if _, err := fmt.Sscan(got, &steps, &longest, &cut); err != nil || steps != 2 || cut != 1 || longest > play.MaxFieldBytes {
		t.Errorf("steps recorded (count, longest args, args cut) = %q, want 2 steps, one cut, none over %d bytes", got, play.MaxFieldBytes)
	}
}
