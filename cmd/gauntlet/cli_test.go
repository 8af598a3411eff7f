package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// Bad command lines are refused before anything starts, naming what is wrong.
func TestBadCommandLines(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"run", "--episodez", "3"}, "flag provided but not defined: -episodez"},
		{[]string{"run", "--episodes", "many"}, `invalid value "many" for flag -episodes`},
		{[]string{"run", "--env", "nope", "--data-dir", "/nonexistent"}, `env: unknown env "nope"`},
		{[]string{"run", "--policies", "oracle=x"}, `--policies[0]: weight "x" of oracle is not a whole number`},
		{[]string{"run", "--policies", "genius"}, `policies[0]: unknown policy "genius"`},
		{[]string{"run", "--profiles", "chaos=1"}, `unknown profile "chaos"`},
		{[]string{"run", "--params", "{not json"}, "--params: not valid JSON"},
		{[]string{"run", "--params", `{"products": 5000}`}, "params.products"},
		{[]string{"run", "--episodes", "0"}, "episodes: 0 is outside [1, 1000000000]"},
		{[]string{"up", "--log.level", "chatty"}, `--log.level: "chatty" is not one of`},
		{[]string{"serve", "--target", "workr", "--data-dir", "/tmp/x"}, `--target: unknown module "workr"`},
		{[]string{"episode", "show", "x'; DROP TABLE steps"}, "only letters, digits"},
		{[]string{"sql"}, "give a query"},
	}
	for _, tc := range cases {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var out, errOut bytes.Buffer
			err := runMain(context.Background(), tc.args, &out, &errOut)
			if err == nil {
				t.Fatalf("accepted; stdout %q", out.String())
			}
			msg := err.Error() + "\n" + errOut.String()
			if !strings.Contains(msg, tc.want) {
				t.Fatalf("error %q does not say %q", msg, tc.want)
			}
		})
	}
}

// Garbage and invalid requests that reach the bus are refused or set aside, and the
// pipeline keeps serving good runs.
func TestBadInputLeavesPipelineRunning(t *testing.T) {
	if testing.Short() {
		t.Skip("needs ClickHouse; run without -short")
	}
	cfg := testConfig(t)
	s := startStack(t, cfg)
	b := s.app.getBus()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	// Undecodable bytes on every subject the services consume.
	for _, subj := range []string{bus.SubjectRun, bus.SubjectEpisode("rjunk"), bus.SubjectEvent(bus.KindSteps, "rjunk"), bus.SubjectEvent(bus.KindEnded, "rjunk")} {
		if _, err := b.JS.PublishMsg(ctx, &nats.Msg{Subject: subj, Data: []byte("\xff\xfe not protobuf")}); err != nil {
			t.Fatalf("publish junk to %s: %v", subj, err)
		}
	}
	// A run that skipped the CLI's validation: the scheduler refuses it with reasons.
	bad := newRun(t, 10, "oracle=1", 1)
	bad.Policies = []*gauntletv1.Share{{Name: "genius", Weight: 1}}
	bad.Env = "nope"
	final, err := follow(ctx, b, bad, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !final.Done || !strings.Contains(final.Error, `unknown env "nope"`) || !strings.Contains(final.Error, `unknown policy "genius"`) {
		t.Fatalf("bad run progress = %v, want done with both reasons", final)
	}
	// RPCs with garbage get error replies, not silence.
	for _, subj := range []string{bus.SubjectScore, bus.SubjectPlan} {
		m, err := b.NC.Request(subj, []byte("\xff\xfe"), 5*time.Second)
		if err != nil {
			t.Fatalf("request %s: %v", subj, err)
		}
		var reply gauntletv1.ScoreReply // both replies carry error as field 2
		if err := proto.Unmarshal(m.Data, &reply); err != nil || !strings.Contains(reply.Error, "decode") {
			t.Fatalf("%s reply = %v (%v), want a decode error", subj, &reply, err)
		}
	}
	// An oversized action never reaches the env: covered in pkg/env/shop; here the whole
	// pipeline still runs a good campaign to the end, exactly.
	conn := connect(t, s.app.clickHouseAddr(), cfg.Database)
	good := newRun(t, 200, "random=1,oracle=1", 3)
	p := runToEnd(t, b, conn, cfg.Database, good)
	assertExact(t, b, conn, cfg.Database, good, p)
}

// `gauntlet up`'s banner names every address a user needs, the env API's among them
// (with where its token is when gauntlet made one), and leaves out the parts not running.
func TestUpBannerNamesEveryAddress(t *testing.T) {
	st := stack{NATSURL: "nats://127.0.0.1:4222", ClickHouse: "127.0.0.1:9000", Database: "gauntlet",
		HTTP: "127.0.0.1:9464", Temporal: "127.0.0.1:7233", TemporalUI: "http://127.0.0.1:8233", EnvAPI: "127.0.0.1:9470",
		Console: "http://127.0.0.1:9464/console/"}
	var out strings.Builder
	printBanner(&out, st, true, "/data/envapi-token")
	for _, want := range []string{st.NATSURL, st.ClickHouse, st.HTTP, st.Temporal, st.TemporalUI,
		"env api http://127.0.0.1:9470", "MCP at /mcp/<env>", "/data/envapi-token", "console http://127.0.0.1:9464/console/"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("banner %q does not name %s", out.String(), want)
		}
	}
	out.Reset()
	printBanner(&out, stack{NATSURL: st.NATSURL, ClickHouse: st.ClickHouse, Database: "gauntlet", HTTP: st.HTTP, EnvAPI: st.EnvAPI}, false, "/data/envapi-token")
	if b := out.String(); strings.Contains(b, "temporal") || strings.Contains(b, "envapi-token") || !strings.Contains(b, "127.0.0.1:9470") {
		t.Errorf("banner of a stack without Temporal, with tenants from a tokens file: %q", b)
	}
	out.Reset()
	printBanner(&out, stack{NATSURL: st.NATSURL, ClickHouse: st.ClickHouse, Database: "gauntlet", HTTP: st.HTTP}, true, "/data/envapi-token")
	if b := out.String(); strings.Contains(b, "env api") || strings.Contains(b, "console") {
		t.Errorf("banner of a stack without the env API or the console: %q", b)
	}
}
