// Command mcp-shop plays one shop episode through gauntlet's MCP endpoint with the
// official MCP Go SDK's client, as any MCP-speaking agent harness would: it opens a
// session at /mcp/shop (the session is the episode; the URL's query picks its seed and
// fault profile), reads the task from the initialize result, lists the tools, and calls
// them until the episode ends, printing each step's reward from the result's _meta.
// The agent choosing the calls is the shop's scripted oracle, standing in for a model.
//
//	bin/gauntlet up &
//	go run ./examples/mcp-shop --token "$(cat .gauntlet/envapi-token)" --seed 7
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strconv"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	_ "github.com/gauntlet-rl/gauntlet/pkg/env/shop" // registers the shop, whose oracle plays
)

func main() {
	addr := flag.String("url", "http://127.0.0.1:9470", "the env API's address")
	token := flag.String("token", os.Getenv("GAUNTLET_TOKEN"), "an env API token (default $GAUNTLET_TOKEN)")
	seed := flag.Uint64("seed", 7, "the episode's seed")
	profile := flag.String("profile", "baseline", "the fault profile")
	flag.Parse()
	if err := run(context.Background(), *addr, *token, *seed, *profile); err != nil {
		fmt.Fprintln(os.Stderr, "mcp-shop:", err)
		os.Exit(1)
	}
}

// bearer adds the API token to every request of the MCP client.
type bearer string

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+string(b))
	return http.DefaultTransport.RoundTrip(r)
}

// step is the part of the env API's StepResult, in _meta["gauntlet/step"], that the
// example prints; the whole is documented in docs/mcp.md.
type step struct {
	Step       uint32  `json:"step"`
	Reward     float64 `json:"reward"`
	Terminated bool    `json:"terminated"`
	Truncated  bool    `json:"truncated"`
	Reason     string  `json:"reason"`
}

func run(ctx context.Context, addr, token string, seed uint64, profile string) error {
	if token == "" {
		return errors.New("--token: an env API token is required (gauntlet up writes one to .gauntlet/envapi-token)")
	}
	query := url.Values{"seed": {strconv.FormatUint(seed, 10)}, "profile": {profile}}
	transport := &mcp.StreamableClientTransport{
		Endpoint:   addr + "/mcp/shop?" + query.Encode(),
		HTTPClient: &http.Client{Transport: bearer(token)},
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "mcp-shop-example", Version: "1"}, nil)
	session, err := client.Connect(ctx, transport, nil)
	if err != nil {
		return fmt.Errorf("open an MCP session: %w", err)
	}
	// Closing the session ends the episode (if it has not ended) and records it.
	defer session.Close()

	var episode struct {
		EpisodeID   string          `json:"episodeId"`
		Observation json.RawMessage `json:"observation"`
	}
	if err := remarshal(session.InitializeResult().Meta["gauntlet/episode"], &episode); err != nil {
		return fmt.Errorf("the initialize result's episode: %w", err)
	}
	tools, err := session.ListTools(ctx, nil)
	if err != nil {
		return fmt.Errorf("list tools: %w", err)
	}
	fmt.Printf("episode %s: %d tools; task: %s\n", episode.EpisodeID, len(tools.Tools), episode.Observation)

	shop, err := env.Lookup("shop")
	if err != nil {
		return err
	}
	agent := shop.(env.Oracle).Oracle(seed)
	turn := env.Turn{Observation: episode.Observation}
	total := 0.0
	for {
		act, err := agent.Act(turn)
		if err != nil {
			return fmt.Errorf("the agent: %w", err)
		}
		res, err := session.CallTool(ctx, &mcp.CallToolParams{Name: act.Tool, Arguments: act.Args})
		if err != nil {
			return fmt.Errorf("call %s: %w", act.Tool, err)
		}
		var st step
		if err := remarshal(res.Meta["gauntlet/step"], &st); err != nil {
			return fmt.Errorf("the step's _meta: %w", err)
		}
		total += st.Reward
		obs := res.Content[0].(*mcp.TextContent).Text
		fmt.Printf("step %2d  %-16s reward %+.3f  isError %-5v %.100s\n", st.Step, act.Tool, st.Reward, res.IsError, obs)
		if st.Terminated || st.Truncated {
			fmt.Printf("episode over after %d steps: %s, return %.3f\n", st.Step+1, st.Reason, total)
			return nil
		}
		turn = env.Turn{Step: st.Step + 1, Observation: json.RawMessage(obs), Reward: st.Reward}
	}
}

// remarshal decodes v, a JSON value the SDK decoded generically, into out.
func remarshal(v, out any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return json.Unmarshal(raw, out)
}
