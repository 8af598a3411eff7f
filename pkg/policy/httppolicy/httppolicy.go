// Package httppolicy is the "http" policy: gauntlet asks an OpenAI-compatible
// chat-completions endpoint (vLLM, SGLang, llama.cpp's server and others serve one) to
// choose each action, offering the env's tools as function schemas. The episode runs
// in a worker through the same step path as any other (pkg/play), so a model's
// trajectory is recorded exactly like a trainer's or a built-in policy's.
//
// Failures of the endpoint are infra errors, not the policy's moves: a timeout, a non-200
// status, a body that is not a chat completion, or a reply without a tool call make Act
// return an error, which the worker retries and finally records as an infra error. What
// the model chose, however odd (an unknown tool, arguments that are not JSON), is played
// as its action, and the env answers with an invalid-action observation it can learn from.
//
// Each run names its endpoint (RunRequested.policy_endpoint, `gauntlet run
// --policy.http.url`, a batch's or a curriculum stage's policy_endpoint); a run naming the
// policy without one is refused when submitted (runs.Validate). A run names the key to
// send by the name of a credential, never the key itself: each process reads the file of
// that name in its --policy.http.credentials-dir when it makes an agent, so the secret is
// in no run, event, ClickHouse row or Temporal history. The process's configuration
// (flags --policy.http.*, see Config.RegisterFlags; New) holds its own key and bounds, and
// an endpoint for whoever plays without a run (episode fork); the process hands it to
// whoever builds agents in a policy.Set, which gives it each run's endpoint
// (WithEndpoint). Nothing is configured globally, so two configurations in one process do
// not clash. An agent keeps the conversation of one episode and belongs to one goroutine;
// the policy value is safe for concurrent use.
//
// With --policy.http.logprobs the policy asks for the completion's logprobs and token ids
// (OpenAI's "logprobs", vLLM's "return_token_ids") and records what the endpoint returns
// with each step as trainer data (LastTrainerData; the trainer_steps table), held to
// MaxRecordedTokens token ids a step (docs/querying.md).
package httppolicy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/errkind"
	"github.com/gauntlet-rl/gauntlet/pkg/policy"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// Name is the policy's registered name.
const Name = "http"

// Config says which endpoint to ask.
type Config struct {
	// URL is the API base, e.g. http://127.0.0.1:8000/v1; requests go to
	// URL + "/chat/completions".
	URL string
	// Model is the "model" field of each request.
	Model string
	// APIKey, when set, is sent as "Authorization: Bearer <key>".
	APIKey string
	// CredentialsDir is where the credentials runs name are read: the file
	// CredentialsDir/NAME holds the key of credential NAME (surrounding white space
	// dropped). Empty: runs may name none.
	CredentialsDir string
	// Logprobs asks the endpoint for the completion's logprobs and token ids, recorded
	// with each step (an endpoint that refuses unknown request fields fails with it).
	Logprobs bool
	// Timeout bounds one completion request.
	Timeout time.Duration
	// MaxTokens and Temperature go into each request (0: the server's defaults).
	MaxTokens   int
	Temperature float64
}

// Validate reports every problem at once, naming the flag.
func (c Config) Validate() error {
	var errs []error
	if c.URL != "" && !strings.HasPrefix(c.URL, "http://") && !strings.HasPrefix(c.URL, "https://") {
		errs = append(errs, fmt.Errorf("policy.http.url: %q is not an http(s) URL", c.URL))
	}
	if c.Timeout <= 0 {
		errs = append(errs, fmt.Errorf("policy.http.timeout: %v must be positive", c.Timeout))
	}
	if c.MaxTokens < 0 {
		errs = append(errs, fmt.Errorf("policy.http.max-tokens: %d must not be negative", c.MaxTokens))
	}
	if c.CredentialsDir != "" {
		if fi, err := os.Stat(c.CredentialsDir); err != nil || !fi.IsDir() {
			errs = append(errs, fmt.Errorf("policy.http.credentials-dir: %q is not a readable directory", c.CredentialsDir))
		}
	}
	return errors.Join(errs...)
}

// ErrCredential is the failure to read the credential a run names: the episode ends as
// an infra error of kind model endpoint, naming the credential.
var ErrCredential = errors.New("credential")

// readCredential reads credential name's key from dir.
func readCredential(dir, name string) (string, error) {
	if dir == "" {
		return "", fmt.Errorf("%w %s: this process reads no credentials (--policy.http.credentials-dir)", ErrCredential, name)
	}
	if err := policy.CheckCredentialName(name); err != nil {
		return "", fmt.Errorf("%w %s: %v", ErrCredential, name, err)
	}
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return "", fmt.Errorf("%w %s: %v", ErrCredential, name, err)
	}
	key := strings.TrimSpace(string(b))
	if key == "" {
		return "", fmt.Errorf("%w %s: the file %s is empty", ErrCredential, name, filepath.Join(dir, name))
	}
	return key, nil
}

// New returns the "http" policy asking cfg's endpoint. With an empty URL its agents fail
// as the registered policy's do.
func New(cfg Config) (policy.Policy, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return httpPolicy{cfg: cfg}, nil
}

func init() { policy.Register(httpPolicy{}) }

// DefaultTimeout bounds one completion of a policy made without a configured timeout (the
// registered row, given a run's endpoint).
const DefaultTimeout = 60 * time.Second

// WithEndpoint implements policy.Endpointed: the policy asking ep's URL for its model
// (empty: the configured model) with the key of its credential (empty: the configured
// key), asking for token ids and logprobs as the run says (unsaid: as configured), and
// the configured bounds. A run's endpoint replaces the process's
// (--policy.http.url). A credential that cannot be read is an infra error of kind model
// endpoint (the episode's, not the run's: another worker may hold it).
func (p httpPolicy) WithEndpoint(ep policy.Endpoint) (policy.Policy, error) {
	cfg := p.cfg
	cfg.URL = ep.URL
	if ep.Model != "" {
		cfg.Model = ep.Model
	}
	if ep.Logprobs != nil {
		cfg.Logprobs = *ep.Logprobs
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if ep.URL == "" {
		return nil, errors.New("policy_endpoint.url: must not be empty")
	}
	if ep.Credential != "" {
		key, err := readCredential(cfg.CredentialsDir, ep.Credential)
		if err != nil {
			return nil, errkind.Infra(gauntletv1.InfraKind_INFRA_KIND_MODEL_ENDPOINT, err)
		}
		cfg.APIKey = key
	}
	return New(cfg)
}

type httpPolicy struct{ cfg Config }

func (httpPolicy) Name() string { return Name }

// NewAgent makes an agent for one episode of e. seed is unused: the model is the source
// of the actions.
func (p httpPolicy) NewAgent(e env.Env, _ uint64) (env.Agent, error) {
	cfg := p.cfg
	if cfg.URL == "" {
		return nil, fmt.Errorf("policy %s: no endpoint: the run names none (gauntlet run --policy.http.url)", Name)
	}
	return NewAgent(cfg, e.Spec())
}

// NewAgent makes an agent asking cfg's endpoint to play an episode of spec.
func NewAgent(cfg Config, spec env.Spec) (env.Agent, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.URL == "" {
		return nil, errors.New("policy.http.url: must not be empty")
	}
	a := &agent{cfg: cfg, client: &http.Client{Timeout: cfg.Timeout}, byFunc: map[string]string{}}
	var names []string
	for _, t := range spec.Tools {
		fn := functionName(t.Name)
		a.byFunc[fn] = t.Name
		params := t.Schema
		if len(params) == 0 {
			params = json.RawMessage(`{"type":"object","properties":{}}`)
		}
		a.tools = append(a.tools, toolDef{Type: "function", Function: functionDef{Name: fn, Description: t.Description, Parameters: params}})
		names = append(names, t.Name)
	}
	a.messages = append(a.messages, message{Role: "system", Content: fmt.Sprintf(
		"You act in the %q environment: %s Each turn, call exactly one of the tools (%s). "+
			"Tool results are JSON observations; faults such as HTTP 429/503 with retry_after_ms can happen.",
		spec.Name, spec.Description, strings.Join(names, ", "))})
	return a, nil
}

// functionName maps a tool name to an OpenAI-valid function name ([A-Za-z0-9_-]).
func functionName(tool string) string {
	return strings.NewReplacer(".", "__", "/", "__", " ", "_").Replace(tool)
}

type agent struct {
	cfg      Config
	client   *http.Client
	tools    []toolDef
	byFunc   map[string]string
	messages []message
	lastCall string // id of the tool call whose result the next turn carries
	calls    int
	// trainer is how the endpoint produced the last action (nil: it said nothing).
	trainer *gauntletv1.TrainerData
}

// MaxRecordedTokens bounds the token ids recorded with one step (prompt and completion
// together; the env API holds a trainer to play.MaxTrainerTokens). A conversation's
// prompt grows with every turn: past the bound its token ids are left out and the
// completion's kept (what a policy-gradient loss needs, with the logprobs); a completion
// over the bound alone is recorded without token ids or logprobs.
const MaxRecordedTokens = 1 << 16

// LastTrainerData is how the endpoint produced the action Act returned last: the token
// ids and logprobs it returned (with --policy.http.logprobs), the model that answered as
// the policy version; nil when it returned none. play.Session.Run records it with the step.
func (a *agent) LastTrainerData() *gauntletv1.TrainerData { return a.trainer }

type toolDef struct {
	Type     string      `json:"type"`
	Function functionDef `json:"function"`
}

type functionDef struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters"`
}

type message struct {
	Role       string     `json:"role"`
	Content    string     `json:"content"`
	ToolCalls  []toolCall `json:"tool_calls,omitempty"`
	ToolCallID string     `json:"tool_call_id,omitempty"`
}

type toolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

type request struct {
	Model       string    `json:"model"`
	Messages    []message `json:"messages"`
	Tools       []toolDef `json:"tools"`
	ToolChoice  string    `json:"tool_choice"`
	MaxTokens   int       `json:"max_tokens,omitempty"`
	Temperature float64   `json:"temperature,omitempty"`
	// Logprobs is OpenAI's request for the sampled tokens' logprobs; ReturnTokenIDs is
	// vLLM's for the prompt's and the completion's token ids (prompt_token_ids,
	// choices[].token_ids).
	Logprobs       bool `json:"logprobs,omitempty"`
	ReturnTokenIDs bool `json:"return_token_ids,omitempty"`
}

type completion struct {
	Model string `json:"model"`
	// PromptTokenIDs is vLLM's (return_token_ids).
	PromptTokenIDs []uint32 `json:"prompt_token_ids"`
	Choices        []struct {
		Message message `json:"message"`
		// TokenIDs is vLLM's (return_token_ids).
		TokenIDs []uint32 `json:"token_ids"`
		Logprobs *struct {
			Content []struct {
				// Token is the token's text, or "token_id:N" from a vLLM server run
				// with --return-tokens-as-token-ids.
				Token   string  `json:"token"`
				Logprob float64 `json:"logprob"`
			} `json:"content"`
		} `json:"logprobs"`
	} `json:"choices"`
}

// trainerData is what c says of how its first choice was produced; nil when nothing.
// Completion token ids come from choices[0].token_ids, else from logprob tokens of the
// form "token_id:N" when every one is.
func (c *completion) trainerData(model string) *gauntletv1.TrainerData {
	ch := &c.Choices[0]
	var td gauntletv1.TrainerData
	td.CompletionTokenIds = ch.TokenIDs
	if ch.Logprobs != nil && len(ch.Logprobs.Content) > 0 {
		lp := ch.Logprobs.Content
		td.Logprobs = make([]float32, len(lp))
		for i, t := range lp {
			td.Logprobs[i] = float32(t.Logprob)
		}
		if len(td.CompletionTokenIds) == 0 {
			ids := make([]uint32, 0, len(lp))
			for _, t := range lp {
				n, ok := tokenID(t.Token)
				if !ok {
					ids = nil
					break
				}
				ids = append(ids, n)
			}
			td.CompletionTokenIds = ids
		}
	}
	td.PromptTokenIds = c.PromptTokenIDs
	if len(td.CompletionTokenIds) == 0 && len(td.Logprobs) == 0 && len(td.PromptTokenIds) == 0 {
		return nil
	}
	if len(td.CompletionTokenIds)+len(td.PromptTokenIds) > MaxRecordedTokens {
		td.PromptTokenIds = nil
	}
	if len(td.CompletionTokenIds) > MaxRecordedTokens || len(td.Logprobs) > MaxRecordedTokens {
		td.CompletionTokenIds, td.Logprobs = nil, nil
	}
	td.PolicyVersion = c.Model
	if td.PolicyVersion == "" {
		td.PolicyVersion = model
	}
	return &td
}

// tokenID reads vLLM's "token_id:N" form of a logprob's token.
func tokenID(tok string) (uint32, bool) {
	rest, ok := strings.CutPrefix(tok, "token_id:")
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseUint(rest, 10, 32)
	return uint32(n), err == nil
}

// Act sends the conversation so far (with the latest observation as the result of the
// previous tool call, or as the first user message) and plays the tool call of the reply.
// Its errors are the endpoint's failures, marked so (errkind.Infra): the episode ends as an
// infra error of kind model endpoint, never as the policy's move.
func (a *agent) Act(t env.Turn) (env.Action, error) {
	act, err := a.act(t)
	if err != nil {
		return act, errkind.Infra(gauntletv1.InfraKind_INFRA_KIND_MODEL_ENDPOINT, err)
	}
	return act, nil
}

func (a *agent) act(t env.Turn) (env.Action, error) {
	a.trainer = nil
	if a.lastCall == "" {
		a.messages = append(a.messages, message{Role: "user", Content: string(t.Observation)})
	} else {
		a.messages = append(a.messages, message{Role: "tool", Content: string(t.Observation), ToolCallID: a.lastCall})
	}
	body, _ := json.Marshal(request{
		Model: a.cfg.Model, Messages: a.messages, Tools: a.tools, ToolChoice: "required",
		MaxTokens: a.cfg.MaxTokens, Temperature: a.cfg.Temperature,
		Logprobs: a.cfg.Logprobs, ReturnTokenIDs: a.cfg.Logprobs,
	})
	req, err := http.NewRequest(http.MethodPost, strings.TrimRight(a.cfg.URL, "/")+"/chat/completions", bytes.NewReader(body))
	if err != nil {
		return env.Action{}, fmt.Errorf("policy %s: %w", Name, err)
	}
	req.Header.Set("Content-Type", "application/json")
	if a.cfg.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+a.cfg.APIKey)
	}
	resp, err := a.client.Do(req)
	if err != nil {
		var te interface{ Timeout() bool }
		if errors.As(err, &te) && te.Timeout() {
			return env.Action{}, fmt.Errorf("policy %s: infra error: endpoint did not answer within %v: %w", Name, a.cfg.Timeout, err)
		}
		return env.Action{}, fmt.Errorf("policy %s: infra error: %w", Name, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return env.Action{}, fmt.Errorf("policy %s: infra error: read the reply: %w", Name, err)
	}
	if resp.StatusCode != http.StatusOK {
		return env.Action{}, fmt.Errorf("policy %s: infra error: endpoint answered %d: %.200s", Name, resp.StatusCode, raw)
	}
	var c completion
	if err := json.Unmarshal(raw, &c); err != nil {
		return env.Action{}, fmt.Errorf("policy %s: infra error: malformed reply (not a chat completion): %v: %.200s", Name, err, raw)
	}
	if len(c.Choices) == 0 {
		return env.Action{}, fmt.Errorf("policy %s: infra error: malformed reply: no choices: %.200s", Name, raw)
	}
	msg := c.Choices[0].Message
	if len(msg.ToolCalls) == 0 || msg.ToolCalls[0].Function.Name == "" {
		return env.Action{}, fmt.Errorf("policy %s: infra error: malformed reply: no tool call (content %.100q)", Name, msg.Content)
	}
	a.trainer = c.trainerData(a.cfg.Model)
	call := msg.ToolCalls[0]
	msg.ToolCalls = msg.ToolCalls[:1] // one action per turn; the rest are dropped
	a.calls++
	if call.ID == "" {
		call.ID = fmt.Sprintf("call_%d", a.calls)
		msg.ToolCalls[0].ID = call.ID
	}
	msg.Role = "assistant"
	a.messages = append(a.messages, msg)
	a.lastCall = call.ID
	tool, ok := a.byFunc[call.Function.Name]
	if !ok {
		tool = call.Function.Name // the model's own invention: the env flags it invalid
	}
	return env.Action{Tool: tool, Args: json.RawMessage(call.Function.Arguments)}, nil
}
