package httppolicy

import (
	"flag"
	"time"
)

// RegisterFlags declares the policy.http.* flags on fs with their defaults.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.URL, "policy.http.url", "", "OpenAI-compatible API base of the \"http\" policy, e.g. http://127.0.0.1:8000/v1")
	fs.StringVar(&c.Model, "policy.http.model", "", "model name the \"http\" policy sends")
	fs.StringVar(&c.APIKey, "policy.http.api-key", "", "bearer key for the \"http\" policy's endpoint")
	fs.DurationVar(&c.Timeout, "policy.http.timeout", 60*time.Second, "bound on one chat completion of the \"http\" policy (an infra error past it)")
	fs.IntVar(&c.MaxTokens, "policy.http.max-tokens", 0, "max_tokens of each completion (0: the server's default)")
	fs.StringVar(&c.CredentialsDir, "policy.http.credentials-dir", "", "directory of the credentials runs name (policy_endpoint.credential): the file NAME holds credential NAME's bearer key")
	fs.BoolVar(&c.Logprobs, "policy.http.logprobs", false, "ask the \"http\" policy's endpoint for logprobs and token ids (logprobs, vLLM's return_token_ids) and record them with each step (trainer_steps)")
}
