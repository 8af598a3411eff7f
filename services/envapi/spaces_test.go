package envapi

import (
	"context"
	"encoding/json"
	"testing"

	"connectrpc.com/connect"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	_ "github.com/gauntlet-rl/gauntlet/pkg/env/codefix"
	_ "github.com/gauntlet-rl/gauntlet/pkg/env/shop"
	_ "github.com/gauntlet-rl/gauntlet/pkg/env/world"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// TestDescribeEnvSpaces holds DescribeEnv to Gymnasium's two spaces for every registered
// env: the action space names each of the env's tools with its argument schema, in the
// spec's order, and bounds the arguments as the envs do; the observation space says what
// a decoded observation is.
func TestDescribeEnvSpaces(t *testing.T) {
	names := env.Names()
	if len(names) < 2 {
		t.Fatalf("registered envs %v: want shop, codefix and the built-in worlds at least", names)
	}
	s := &Service{}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			e, _ := env.Lookup(name)
			res, err := s.DescribeEnv(context.Background(), connect.NewRequest(&gauntletv1.DescribeEnvRequest{Env: name}))
			if err != nil {
				t.Fatal(err)
			}
			as := res.Msg.GetActionSpace()
			if as == nil {
				t.Fatal("no action_space")
			}
			tools := e.Spec().Tools
			if len(as.GetTools()) != len(tools) {
				t.Fatalf("action_space has %d tools, the env %d", len(as.GetTools()), len(tools))
			}
			for i, tl := range tools {
				got := as.GetTools()[i]
				if got.GetName() != tl.Name || got.GetService() != tl.Service || got.GetDescription() != tl.Description || got.GetSchemaJson() != string(tl.Schema) {
					t.Errorf("tool %d: %v, want %s with schema %s", i, got, tl.Name, tl.Schema)
				}
				if !json.Valid([]byte(got.GetSchemaJson())) {
					t.Errorf("tool %s: schema is not JSON: %q", tl.Name, got.GetSchemaJson())
				}
			}
			if as.GetMaxArgsBytes() != env.MaxArgsBytes {
				t.Errorf("max_args_bytes %d, want %d", as.GetMaxArgsBytes(), env.MaxArgsBytes)
			}
			os := res.Msg.GetObservationSpace()
			var schema map[string]any
			if err := json.Unmarshal([]byte(os.GetSchemaJson()), &schema); err != nil || schema["type"] != "object" {
				t.Errorf("observation_space schema %q: want a JSON Schema of an object (%v)", os.GetSchemaJson(), err)
			}
			if os.GetEncoding() != "json" {
				t.Errorf("observation_space encoding %q, want json", os.GetEncoding())
			}
		})
	}
}
